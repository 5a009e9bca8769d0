"""Where the scheduler's requests come from: an arrival source the loop asks for what has arrived by now, when the
next request arrives, and tells of each finished request with its time.

- :class:`StaticArrivals`: a fixed list sorted by arrival time (a trace, a seeded open-loop workload). The loop
  behaves exactly as it did with its own ``pending`` deque (the same numbers, byte for byte).
- :class:`ClientArrivals`: the closed loop of SGLang's ``benchmark/hicache/bench_multiturn.py`` (docs/semantics.md,
  "The multi-turn benchmark"): ``num_clients`` clients, each one conversation; a client's next round is queued only
  when its previous response arrives (its last token); one sender pops the client-side ready queue (``random`` or
  ``fifo``) only while fewer than ``max_parallel`` requests are in flight, then sleeps an exponential gap of mean
  ``1 / request_rate`` (seeded); at the cap it polls every 0.05 s. With the round barrier, round ``r + 1`` is released
  only when every client finished round ``r`` (after the script's 10 s pause).

Each request's record (:class:`RequestRecord`: arrival, first-token time, finish time, cached tokens as SGLang's
``meta_info.cached_tokens`` counts them) is written as it finishes; :func:`round_metrics` is the script's per-round
table.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from kvlab.sched.request import SimReq

READY_QUEUE_POLICIES = ("random", "fifo")
POLL_S = 0.05  # the sender's sleep while max_parallel requests are in flight (asyncio.sleep(0.05))
BARRIER_PAUSE_S = 10.0  # the response handler's time.sleep(10) before it releases the next round
MAX_REQUEST_RATE = 1000.0  # the sender draws one gap per wake: a higher rate is a busy loop, here and there
INF = float("inf")


@dataclass(frozen=True)
class ClosedLoop:
    """The sender's settings of ``bench_multiturn.py`` (its argument names and defaults); ``seed`` seeds the ready
    queue's random pops and the gaps (kvlab's own stream: the script's global ``random`` is also drawn by its
    tokenizer sampling, which kvlab does not run)."""

    max_parallel: int = 128
    request_rate: float = 1.0
    ready_queue_policy: str = "random"
    enable_round_barrier: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if type(self.max_parallel) is not int or self.max_parallel < 1:
            raise ValueError(f"max_parallel must be an int >= 1, got {self.max_parallel!r}")
        rate = self.request_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= MAX_REQUEST_RATE:
            raise ValueError(f"request_rate must be a number in (0, {MAX_REQUEST_RATE:g}] (requests/s: the sender "
                             f"sleeps an exponential gap of mean 1/request_rate), got {rate!r}")
        if self.ready_queue_policy not in READY_QUEUE_POLICIES:
            raise ValueError(f"ready_queue_policy must be one of {', '.join(READY_QUEUE_POLICIES)}, "
                             f"got {self.ready_queue_policy!r}")
        if not isinstance(self.enable_round_barrier, bool):
            raise ValueError(f"enable_round_barrier must be true or false, got {self.enable_round_barrier!r}")


class RequestRecord(NamedTuple):
    """One finished request as the benchmark's client sees it (times on the modelled clock, seconds).
    ``cached_tokens``: SGLang's ``meta_info.cached_tokens`` (the prefix reused at its first admission, device and
    host, page aligned; ``storage_hit_tokens`` is the part that came from the storage tier, 0 without one, and
    ``host_hit_tokens`` the part loaded back from host that storage did not read)."""

    rid: str
    client: str | None
    round: int | None
    arrival_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    cached_tokens: int
    storage_hit_tokens: int = 0  # (the L3 storage tier notes its hits here: SimReq.storage_hit_tokens)
    host_hit_tokens: int = 0  # (SimReq.host_hit_tokens)

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


def record_of(req: SimReq, now_s: float, client: str | None = None, round_: int | None = None) -> RequestRecord:
    return RequestRecord(str(req.rid), client, round_, req.arrival_time_s, req.first_token_s, now_s, req.prompt_len,
                         req.cached_tokens, req.storage_hit_tokens, req.host_hit_tokens)


class StaticArrivals:
    """A fixed list of requests, released by arrival time (ties in the list's order)."""

    on_join = None  # what a request's joining the queue starts (the loop sets it: the storage tier's prefetch)

    def __init__(self, reqs: Sequence[SimReq]) -> None:
        self.requests = list(reqs)
        self.pending = deque(sorted(reqs, key=lambda q: q.arrival_time_s))
        self.records: list[RequestRecord] = []

    def __bool__(self) -> bool:
        return bool(self.pending)

    def next_arrival_s(self) -> float:
        return self.pending[0].arrival_time_s if self.pending else INF

    def release(self, now_s: float, waiting: deque) -> None:
        """Move every request that has arrived by ``now_s`` to ``waiting``."""
        pending = self.pending
        while pending and pending[0].arrival_time_s <= now_s:
            waiting.append(pending.popleft())
            if self.on_join is not None:
                self.on_join(waiting[-1], now_s)

    def finished(self, req: SimReq, now_s: float) -> None:
        self.records.append(record_of(req, now_s))


class ClientArrivals:
    """``bench_multiturn.py``'s clients and sender as a discrete-event source. ``rounds[c]``: client ``c``'s requests,
    round by round (each resends the whole history). The sender's wakes are simulated in time order between the
    finishes the loop reports, so a pop happens at the first wake at which the queue holds a request and fewer than
    ``max_parallel`` are in flight."""

    on_join = None  # (StaticArrivals')

    def __init__(self, spec: ClosedLoop, clients: Sequence[str], rounds: Sequence[Sequence[SimReq]]) -> None:
        self.spec, self.clients, self.rounds = spec, list(clients), [list(r) for r in rounds]
        self.requests = [req for client in self.rounds for req in client]
        self.where = {id(req): (c, r) for c, client in enumerate(self.rounds) for r, req in enumerate(client)}
        self.rng = random.Random(f"kvlab:multiturn-sender:{spec.seed}")
        self.total = len(self.requests)
        self.sent = self.completed = 0
        self.ready: list[SimReq] = [client[0] for client in self.rounds if client]
        self.held: list[SimReq] = []  # the next round's requests, waiting for the barrier
        self.barrier_round = self.barrier_done = 0
        self.clients_per_round = [sum(1 for client in self.rounds if len(client) > r)
                                  for r in range(max(map(len, self.rounds), default=0))]
        self.wake_s = 0.0  # the sender's next wake
        self.dispatched: deque[SimReq] = deque()  # popped by the sender, not yet handed to the loop
        self.records: list[RequestRecord] = []

    def __bool__(self) -> bool:
        return bool(self.dispatched) or self.sent < self.total

    def _can_pop(self) -> bool:
        return bool(self.ready) and self.sent - self.completed < self.spec.max_parallel

    def next_arrival_s(self) -> float:
        """When the next request is sent if no response arrives first: the sender's next wake, if it can pop then."""
        if self.dispatched:
            return self.dispatched[0].arrival_time_s
        return self.wake_s if self._can_pop() and self.completed < self.total else INF

    def _advance(self, until_s: float, inclusive: bool) -> None:
        """Run the sender's wakes before ``until_s`` (and at it, when ``inclusive``) with the state as it is."""
        spec, rng = self.spec, self.rng
        while self.completed < self.total and (self.wake_s <= until_s if inclusive else self.wake_s < until_s):
            if self.sent - self.completed >= spec.max_parallel:
                self.wake_s += POLL_S  # at the cap: polls again in 0.05 s
                continue
            if self.ready:  # ReadyQueue.pop: a random index (one draw) or the head
                index = rng.randrange(len(self.ready)) if spec.ready_queue_policy == "random" else 0
                req = self.ready.pop(index)
                req.arrival_time_s = self.wake_s
                self.dispatched.append(req)
                self.sent += 1
            self.wake_s += rng.expovariate(spec.request_rate)  # sleeps after every wake below the cap

    def release(self, now_s: float, waiting: deque) -> None:
        self._advance(now_s, inclusive=True)
        dispatched = self.dispatched
        while dispatched and dispatched[0].arrival_time_s <= now_s:
            waiting.append(dispatched.popleft())
            if self.on_join is not None:
                self.on_join(waiting[-1], now_s)

    def finished(self, req: SimReq, now_s: float) -> None:
        """``req``'s response arrived at ``now_s`` (its last token, or its abort): the sender's wakes before it ran
        as they were; its client's next round is queued (or held for the barrier)."""
        self._advance(now_s, inclusive=False)
        c, r = self.where[id(req)]
        self.records.append(record_of(req, now_s, self.clients[c], r))
        self.completed += 1
        nxt = self.rounds[c][r + 1] if r + 1 < len(self.rounds[c]) else None
        if not self.spec.enable_round_barrier:
            if nxt is not None:
                self.ready.append(nxt)
            return
        if nxt is not None:
            self.held.append(nxt)
        if self.barrier_round < len(self.clients_per_round):
            self.barrier_done += 1
            if self.barrier_done == self.clients_per_round[self.barrier_round]:
                # the handler sleeps 10 s (nothing is in flight: the sender only polls), then queues the round
                self._advance(now_s + BARRIER_PAUSE_S, inclusive=False)
                self.ready.extend(self.held)
                self.held = []
                self.barrier_round += 1
                self.barrier_done = 0


def arrival_source(reqs: Sequence[SimReq], originals: Sequence, closed_loop: ClosedLoop | None):
    """The run's source: static, or the closed loop over the requests' clients (``session_id``) and rounds
    (``turn``), each client's rounds in turn order."""
    if closed_loop is None:
        return StaticArrivals(reqs)
    by_client: dict[str, list] = {}
    for req, original in zip(reqs, originals):
        client, turn = getattr(original, "session_id", None), getattr(original, "turn", None)
        if client is None or turn is None:
            raise ValueError(f"request {req.rid!r}: a closed-loop run needs each request's client (session_id) and "
                             "round (turn)")
        by_client.setdefault(client, []).append((turn, req))
    for client, turns in by_client.items():
        turns.sort(key=lambda pair: pair[0])
        if [t for t, _ in turns] != list(range(len(turns))):
            raise ValueError(f"client {client!r}: rounds {[t for t, _ in turns]} are not 0, 1, 2, ...")
    return ClientArrivals(closed_loop, list(by_client), [[req for _, req in t] for t in by_client.values()])


class RoundMetrics(NamedTuple):
    """One row of the script's per-round table: its requests, clients, token-weighted hit rate and mean TTFT; the
    cached tokens split by where they were found (device + host + storage = cached)."""

    round: int
    requests: int
    clients: int
    prompt_tokens: int
    cached_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    storage_hit_tokens: int
    cache_hit_rate: float
    avg_ttft_s: float

    def as_dict(self) -> dict:
        return {**self._asdict(), "cache_hit_rate": round(self.cache_hit_rate, 6),
                "avg_ttft_s": round(self.avg_ttft_s, 6)}


def round_metrics(records: Sequence[RequestRecord]) -> list[RoundMetrics]:
    """Per round: Σ cached / Σ prompt over the round's requests (0 when no prompt token) and the mean TTFT."""
    by_round: dict[int, list[RequestRecord]] = {}
    for rec in records:
        if rec.round is not None:
            by_round.setdefault(rec.round, []).append(rec)
    out = []
    for r in sorted(by_round):
        recs = by_round[r]
        prompt = sum(rec.prompt_tokens for rec in recs)
        cached = sum(rec.cached_tokens for rec in recs)
        host, stored = sum(rec.host_hit_tokens for rec in recs), sum(rec.storage_hit_tokens for rec in recs)
        out.append(RoundMetrics(r, len(recs), len({rec.client for rec in recs}), prompt, cached,
                                cached - host - stored, host, stored, cached / prompt if prompt else 0.0,
                                sum(rec.ttft_s for rec in recs) / len(recs)))
    return out
