"""A discrete-event model of SGLang's scheduler over kvlab's real pools and radix cache: the loop.

One loop, as ``managers/scheduler.py::Scheduler.event_loop_normal``: admit arrivals; try a prefill batch first
(:mod:`kvlab.sched.prefill`); otherwise one decode round for every running request (:mod:`kvlab.sched.decode`,
or the same rounds event by event, :mod:`kvlab.sched.fast_decode`); finished requests are cached into the tree.
The components share one view of memory (:mod:`kvlab.sched.kv`, where the eviction mode, the only switch between
the two arms of finding 2, is applied to every ``evict_from_tree_cache`` call) and one record of the run
(:mod:`kvlab.sched.ledger`: totals, clock, per-step rows). With HiCache on, the memory view moves the host tier's
copy clock to each step's start and prices the step's copies (:mod:`kvlab.sched.cost`). kvlab differs on purpose: time comes from
:class:`~kvlab.sched.cost.CostModel`, and output tokens are the request's own (a trace or workload may fix them so
multi-turn prompts can hit earlier answers) or derived from its id.
"""

from __future__ import annotations

import gc
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import kvlab.sched.config as sched_config
from kvlab.errors import KvlabError
from kvlab.sched.config import SchedulerConfig, min_kv_tokens, pool_need
from kvlab.sched.decode import DecodeRounds, NewTokenRatio, ReferenceDecode
from kvlab.sched.fast_decode import FastDecode
from kvlab.sched.ledger import Ledger
from kvlab.sched.prefill import PrefillAdder
from kvlab.sched.request import RequestLike, SimReq
from kvlab.sched.result import SimResult, Totals

if TYPE_CHECKING:
    from kvlab.sched.kv import SchedulerKV
    from kvlab.sched.page_kv import PageKV


class StepLimitError(KvlabError, RuntimeError):
    """A run reached ``SchedulerConfig.max_steps`` before every request finished (outputs of millions of tokens)."""


class Scheduler:
    """One simulation: ``requests`` served under ``config`` until every one has finished (or aborted).

    State: ``pending`` (not yet arrived, by arrival time), ``waiting`` (arrived, not admitted or retracted),
    ``running`` (decoding), ``chunked`` (the request whose prefill continues next step). Components: ``kv`` (pools,
    tree, eviction mode), ``ledger`` (totals, clock, rows), ``ratio`` (the new-token ratio), ``prefill`` (the
    prefill adder) and ``decoder`` (the decode rounds: event-driven at page size > 1 unless
    ``config.fast_decode`` is off, else the reference rounds; chosen once, here). :meth:`run` returns the
    :class:`~kvlab.sched.result.SimResult`."""

    def __init__(self, config: SchedulerConfig, requests: Sequence[RequestLike]) -> None:
        self.config = config
        ps = config.page_size
        longest = 0
        for r in requests:
            prompt_len, need = len(r.prompt_token_ids), len(r.prompt_token_ids) + max(1, r.output_len)
            longest = max(longest, need)
            if r.output_len < 0 or prompt_len < 1:
                raise ValueError(f"request {r.rid!r}: the prompt must have at least 1 token and the output "
                                 f"a non-negative length (got {prompt_len} and {r.output_len})")
            if min_kv_tokens(prompt_len, r.output_len, ps) > config.kv_tokens:
                raise ValueError(f"KV pool of {config.kv_tokens:,} tokens is smaller than one request: {r.rid!r} "
                                 f"needs {pool_need(prompt_len, r.output_len, ps)[1]}; raise kv_tokens")
        self.ledger = Ledger(Totals(requests=len(requests), prompt_tokens=sum(len(r.prompt_token_ids) for r in requests),
                                    prompt_pages=sum(-(-len(r.prompt_token_ids) // ps) for r in requests)))
        # the fast path at page size > 1 without a host tier runs on the page engine (no token or slot ids); the
        # reference loop, HiCache and page size 1 on the token-level memory
        self.pending = deque(sorted((SimReq.of(r) for r in requests), key=lambda q: q.arrival_time_s))
        if config.fast_decode and config.page_engine and ps > 1 and not config.hicache:
            from kvlab.sched.page_kv import PageKV

            self.kv: SchedulerKV | PageKV = PageKV(config, self.ledger)
            self.kv.prepare(self.pending)  # (its requests emit placeholders)
        else:
            from kvlab.sched.kv import SchedulerKV

            self.kv = SchedulerKV(config, longest, self.ledger)
        self.waiting: deque[SimReq] = deque()
        self.running: list[SimReq] = []
        self.chunked: SimReq | None = None
        clip = sched_config.CLIP_MAX_NEW_TOKENS  # read once, so a test can lower it for one run
        self.ratio = NewTokenRatio(config)
        self.prefill = PrefillAdder(config, self.kv, self.ledger, clip)
        reference = ReferenceDecode(config, self.kv, self.ledger, self.ratio, clip)
        # page size 1 has nothing to skip: every round writes a new slot for every request
        self.decoder: DecodeRounds = FastDecode(reference) if config.fast_decode and ps > 1 else reference

    def check_invariants(self) -> None:
        """Pools and tree consistent, and every slot accounted for exactly once."""
        self.decoder.sync(self.running)
        holders = self.running + ([self.chunked] if self.chunked else [])
        self.kv.check_invariants(holders)

    def _future_tokens(self) -> float:
        """The prefill budget's reserve for the running requests: the new-token ratio times their future tokens."""
        return self.ratio.value * self.decoder.future_tokens(self.running)

    def run(self, progress: bool | None = None) -> SimResult:
        # Every tensor here is a few thousand indices: waking a second intra-op thread for each op costs
        # more than the op (a 12k-request trace ran ~6x slower with torch's default 2 threads here).
        # (torch is imported by the token-level memory only; the page engine runs without it)
        torch = sys.modules.get("torch")
        threads = torch.get_num_threads() if torch else 0
        if torch:
            torch.set_num_threads(1)
        try:
            with paused_gc():
                return self._run(progress)
        finally:
            if torch:
                torch.set_num_threads(threads)

    def _run(self, progress: bool | None) -> SimResult:
        from kvlab.progress import progress_bar

        cfg, ledger, kv, pending, waiting = self.config, self.ledger, self.kv, self.pending, self.waiting
        totals = ledger.totals
        bar = progress_bar(total=totals.requests, desc=f"simulate ({cfg.eviction})", enabled=progress, unit="req")
        # (the loop runs once per step that is not quiet, about 66,000 times on the 12k-request conversation trace,
        # far more on a small pool: what it calls each time is looked up once, here)
        schedule, run_prefill, admit = self.prefill.schedule, self.prefill.run, self.decoder.admit
        decode, quiet_steps, future_tokens = self.decoder.decode, self.decoder.quiet_steps, self._future_tokens
        begin_step, end_step, sizes = ledger.begin_step, ledger.end_step, kv.sizes
        prefill_time_s, decode_time_s = cfg.cost.prefill_time_s, cfg.cost.decode_time_s
        hicache, debug, max_steps, max_running = kv.hicache, cfg.debug, cfg.max_steps, cfg.max_running
        inf = float("inf")
        while pending or waiting or self.running or self.chunked:
            if totals.steps >= max_steps:
                raise StepLimitError(f"the simulation did not finish in {max_steps:,} steps (SchedulerConfig.max_steps)")
            while pending and pending[0].arrival_time_s <= ledger.now_s:
                waiting.append(pending.popleft())
            running = self.running
            if not (waiting or running or self.chunked):
                ledger.now_s = pending[0].arrival_time_s
                continue
            begin_step()
            if hicache:
                kv.begin_step(ledger.now_s)  # copies finished by now complete (check_hicache_events)
            batch = schedule(waiting, running, self.chunked, future_tokens)
            retracted = 0
            if batch.reqs:
                self.chunked = batch.chunked
                for req in run_prefill(batch):
                    running.append(req)
                    admit(req)
                computed = sum(r.extend_len for r in batch.reqs)
                kind, dt = "prefill", prefill_time_s(computed)
            elif running:
                computed, batch_size = 0, len(running)
                running, back = decode(running)
                self.running = running
                if back:
                    waiting.extend(back)
                    retracted = len(back)
                kind, dt = "decode", decode_time_s(batch_size)
            elif kv.next_transfer_s() < inf:
                # HiCache: nothing runs and nothing fits while copies in flight hold nodes locked; the server
                # idles until the next copy lands (or the next request arrives), as SGLang's loop does
                ledger.now_s = min(kv.next_transfer_s(), pending[0].arrival_time_s if pending else inf)
                continue
            else:
                raise RuntimeError(
                    f"scheduler stuck: {len(waiting)} waiting request(s) cannot be admitted into a pool of "
                    f"{cfg.kv_tokens} tokens ({kv.available()} free, {kv.evictable()} evictable)")
            if hicache:
                dt = kv.step_time(dt)
                ledger.note_transfers(kv.step_transfers())
            end_step(kind, dt, computed, retracted, sizes(), len(running), len(waiting))
            if debug:
                self.check_invariants()
            if ledger.step_finished:
                bar.update(ledger.step_finished)
            if kind == "decode" and not debug:
                # the rounds up to the next event, without the loop around them (a no-op for the reference rounds)
                # (and before a host-tier copy completes: that unlocks nodes, which a row shows): when nothing can
                # be scheduled (PrefillAdder.idle), or while the waiting head that this step turned down for the
                # budget would be turned down again (the pools and tree as they were at its check)
                idle = self.chunked is None and (not waiting or len(running) >= max_running)
                blocked = None if idle else self.prefill.blocked
                if idle or (blocked is not None and not retracted and blocked.state == kv.state()):
                    until = pending[0].arrival_time_s if pending else inf
                    if hicache:
                        until = min(until, kv.next_transfer_s())
                    steps = quiet_steps(running, len(waiting), until, max_steps - totals.steps, blocked)
                    if blocked is not None:
                        kv.replay_matches_of(blocked.req, steps)  # each step matched it again (a replay)
        bar.close()
        if kv.hicache:  # the copies still in flight land (the clock of the run is not moved)
            kv.tree.drain()
        # (the result asks the memory for its tree when first read: the page engine rebuilds it at token level)
        return SimResult(cfg, replace(totals), ledger.now_s, ledger.step_log, kv)


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off inside, and back as it was after. A run makes hundreds of thousands of
    rows (dicts) and tree nodes, which every collection rescans, yet leaves next to no cyclic garbage (none on the
    12k-request conversation trace, a few hundred objects on a run with retractions), collected once the collector
    is back on: about 8 % of the run's CPU on that trace."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def simulate(requests: Sequence[RequestLike], config: SchedulerConfig, *, progress: bool | None = None) -> SimResult:
    with paused_gc():  # the 12k requests made here are rescanned too
        scheduler = Scheduler(config, requests)
    return scheduler.run(progress=progress)
