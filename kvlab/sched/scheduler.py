"""A discrete-event model of SGLang's scheduler over kvlab's real pools and radix cache: the loop.

One loop, as ``managers/scheduler.py::Scheduler.event_loop_normal``: admit arrivals; try a prefill batch first
(:mod:`kvlab.sched.prefill`); otherwise one decode round for every running request (:mod:`kvlab.sched.decode`,
or the same rounds event by event, :mod:`kvlab.sched.fast_decode`); finished requests are cached into the tree.
The components share one view of memory (:mod:`kvlab.sched.kv`, where the eviction mode, the only switch between
the two arms of finding 2, is applied to every ``evict_from_tree_cache`` call) and one record of the run
(:mod:`kvlab.sched.ledger`: totals, clock, per-step rows); the memory's contract is
:class:`kvlab.sched.memory.SchedulerMemory`. The host tier's copy clock (HiCache) is one more component,
:mod:`kvlab.sched.host_timing`, called alike with or without a host tier. kvlab differs on purpose: time comes from
:class:`~kvlab.sched.cost.CostModel`, and output tokens are the request's own (a trace or workload may fix them so
multi-turn prompts can hit earlier answers) or derived from its id.
"""

from __future__ import annotations

import gc
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import kvlab.sched.config as sched_config
from kvlab.errors import KvlabError
from kvlab.sched.arrivals import arrival_source
from kvlab.sched.config import SchedulerConfig, min_kv_tokens, pool_need
from kvlab.sched.decode import DecodeRounds, NewTokenRatio, ReferenceDecode
from kvlab.sched.fast_decode import FastDecode
from kvlab.sched.host_timing import HostTierTiming, NoHostTier, StorageTierTiming
from kvlab.sched.ledger import Ledger
from kvlab.sched.memory import SchedulerMemory, SchedulerStuckError
from kvlab.sched.prefill import PrefillAdder
from kvlab.sched.request import RequestLike, SimReq
from kvlab.sched.result import SimResult, Totals

if TYPE_CHECKING:
    from kvlab.mem_cache.hicache.storage import HiCacheStorage


class StepLimitError(KvlabError, RuntimeError):
    """A run reached ``SchedulerConfig.max_steps`` before every request finished (outputs of millions of tokens)."""


class Scheduler:
    """One simulation: ``requests`` served under ``config`` until every one has finished (or aborted).

    State: ``arrivals`` (not yet arrived: a fixed list, or a closed loop, :mod:`kvlab.sched.arrivals`),
    ``waiting`` (arrived, not admitted or retracted), ``running`` (decoding), ``chunked`` (the request whose prefill
    continues next step). Components: ``kv`` (pools, tree, eviction mode), ``ledger`` (totals, clock, rows),
    ``ratio`` (the new-token ratio), ``prefill`` (the prefill adder) and ``decoder`` (the decode rounds:
    event-driven at page size > 1 unless ``config.fast_decode`` is off, else the reference rounds; chosen once,
    here). :meth:`run` returns the :class:`~kvlab.sched.result.SimResult`."""

    def __init__(self, config: SchedulerConfig, requests: Sequence[RequestLike], storage: HiCacheStorage | None = None,
                 ) -> None:
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
        # the fast path at page size > 1 runs on the page engine (no token or slot ids), with or without a host
        # tier; the reference loop and page size 1 on the token-level memory
        # where requests come from: a fixed list by arrival time, or a closed loop told of each finish
        self.arrivals = arrival_source([SimReq.of(r) for r in requests], requests, config.closed_loop)
        if config.counts_only:
            from kvlab.sched.page_kv import PageKV

            self.kv: SchedulerMemory = PageKV(config, self.ledger, storage)
            self.kv.prepare(self.arrivals.requests)  # (its requests emit placeholders)
        else:
            from kvlab.sched.kv import SchedulerKV

            self.kv = SchedulerKV(config, longest, self.ledger, storage)
        # the host tier's copy clock and step prices (HiCache), or the same calls doing nothing: the loop asks both
        self.host: NoHostTier = HostTierTiming(self.kv.tree, self.ledger) if config.hicache else NoHostTier()
        if config.hicache_storage:  # (a request's arrival starts its prefetch from storage)
            self.host = StorageTierTiming(self.kv.tree, self.ledger, self.kv)
        self.waiting: deque[SimReq] = deque()
        self.running: list[SimReq] = []
        self.chunked: SimReq | None = None
        self.emitted: list[SimReq] = []  # the step's prefill emitted a token for each (their first, maybe)
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
        """The loop: arrivals join the queue; a prefill batch if one forms, else a decode round; the step closes
        in the ledger; after a decode round, the quiet rounds up to the next event run in bulk."""
        from kvlab.progress import progress_bar

        cfg, ledger, arrivals, waiting = self.config, self.ledger, self.arrivals, self.waiting
        totals, max_steps, debug = ledger.totals, cfg.max_steps, cfg.debug
        bar = progress_bar(total=totals.requests, desc=f"simulate ({cfg.eviction})", enabled=progress, unit="req")
        # (about 66,000 steps on the 12k-request conversation trace, far more on a small pool: what each step calls
        # is looked up and chosen once, here)
        release, sizes = self._release(), self.kv.sizes
        begin_step, end_step = self._step_ends()
        prefill_or_decode, quiet = self._steps()
        while waiting or self.running or self.chunked or arrivals:
            if totals.steps >= max_steps:
                raise StepLimitError(f"the simulation did not finish in {max_steps:,} steps (SchedulerConfig.max_steps)")
            release(ledger.now_s, waiting)
            if not (waiting or self.running or self.chunked):
                ledger.advance_to(self._next_arrival_s())
                continue
            begin_step()
            step = prefill_or_decode()
            if step is None:
                self._wait_for_copies()
                continue
            kind, compute_s, computed, retracted = step
            end_step(kind, compute_s, computed, retracted, sizes(), len(self.running), len(waiting))
            if self.emitted or ledger.done:
                self._note_responses()
            if debug:
                self.check_invariants()
            if ledger.step_finished:
                bar.update(ledger.step_finished)
            if kind == "decode" and not debug:
                quiet(retracted)
        bar.close()
        self.host.finish()  # HiCache: the copies still in flight land (the clock of the run is not moved)
        # (the result asks the memory for its tree when first read: the page engine rebuilds it at token level)
        return SimResult(cfg, replace(totals), ledger.now_s, ledger.step_log, self.kv, records=arrivals.records)

    def _release(self) -> Callable[[float, deque], None]:
        """How arrivals join the queue: the source's ``release``; with a storage tier the source also hands each
        request that joins to ``host.join`` (its prefetch, timed from now), set here once per run."""
        if self.host.join is not None:
            self.arrivals.on_join = self.host.join
        return self.arrivals.release

    def _step_ends(self) -> tuple[Callable[[], None], Callable[..., None]]:
        """How a step opens and closes, chosen once per run: the ledger's ``begin_step`` / ``end_step``, with the
        host tier's copy clock around them (HiCache, ``HostTierTiming.open_step`` / ``close_step``: copies finished
        by now complete, as ``check_hicache_events``; the copies' share of the step and its traffic noted), or the
        ledger's alone (:class:`NoHostTier`'s hooks do nothing: not called)."""
        ledger, host = self.ledger, self.host
        if type(host) is NoHostTier:
            return ledger.begin_step, ledger.end_step
        return host.open_step, host.close_step

    def _steps(self) -> tuple[Callable[[], tuple | None], Callable[[int], None]]:
        """The loop's two steps, their callees bound once per run (as locals: bound methods kept on the scheduler
        would make it cyclic garbage): a prefill step if a batch forms, else a decode round if any request runs
        (``(kind, compute seconds, tokens computed, retracted)``, or None when neither), and the quiet rounds after
        a decode step (:meth:`_quiet_rounds`)."""
        waiting, schedule, run_prefill = self.waiting, self.prefill.schedule, self.prefill.run
        admit, decode_round, future_tokens = self.decoder.admit, self.decoder.decode, self._future_tokens
        prefill_time_s, decode_time_s = self.config.cost.prefill_time_s, self.config.cost.decode_time_s

        def prefill_or_decode() -> tuple | None:
            running = self.running
            batch = schedule(waiting, running, self.chunked, future_tokens)
            if batch.reqs:
                chunked = self.chunked = batch.chunked
                for req in run_prefill(batch):
                    running.append(req)
                    admit(req)
                self.emitted = [r for r in batch.reqs if r is not chunked]
                computed = sum(r.extend_len for r in batch.reqs)
                return "prefill", prefill_time_s(computed), computed, 0
            batch_size = len(running)
            if not batch_size:
                return None
            self.running, back = decode_round(running)  # (retracted requests go back to waiting)
            if back:
                waiting.extend(back)
            return "decode", decode_time_s(batch_size), 0, len(back)

        return prefill_or_decode, self._quiet_rounds()

    def _wait_for_copies(self) -> None:
        """Nothing runs and nothing fits. With HiCache, copies in flight may hold nodes locked: the server idles
        until the next copy lands (or the next request arrives), as SGLang's loop does. Else it is stuck (a bug:
        every request was checked to fit the pool before the run)."""
        land_s = self.host.next_transfer_s()
        if land_s == float("inf"):
            kv = self.kv
            raise SchedulerStuckError(
                f"scheduler stuck: {len(self.waiting)} waiting request(s) cannot be admitted into a pool of "
                f"{self.config.kv_tokens} tokens ({kv.available()} free, {kv.evictable()} evictable)")
        self.ledger.advance_to(min(land_s, self.arrivals.next_arrival_s()))

    def _note_responses(self) -> None:
        """After a step: the first token of each request its prefill emitted one for, and the responses of those that
        finished, at the step's end (the source hears of each: a closed loop queues the client's next round)."""
        now = self.ledger.now_s
        for req in self.emitted:
            if req.first_token_s < 0:
                req.first_token_s = now
        self.emitted = []
        done = self.ledger.done
        for req in done:
            self.arrivals.finished(req, now)
        done.clear()

    def _next_arrival_s(self) -> float:
        """The next arrival, while nothing runs (a closed loop with nothing in flight always has one)."""
        next_s = self.arrivals.next_arrival_s()
        if next_s == float("inf"):
            raise SchedulerStuckError("scheduler stuck: nothing runs or waits, and no request will arrive")
        return next_s

    def _quiet_rounds(self) -> Callable[[int], None]:
        """After a decode step: the rounds up to the next event, without the loop around them (a no-op for the
        reference rounds), and before a host-tier copy or a storage event completes (that unlocks nodes or moves
        tokens, which a row shows). They run when nothing can join a batch (:meth:`PrefillAdder.idle`), or while
        the waiting head this step turned down for the budget alone would be turned down again (the pools and tree
        as they were at its check). Returns the step, its callees bound once per run."""
        waiting, prefill, kv, ledger, max_steps = self.waiting, self.prefill, self.kv, self.ledger, self.config.max_steps
        idle, state, replay, quiet_steps = prefill.idle, kv.state, kv.replay_matches_of, self.decoder.quiet_steps
        next_arrival_s, next_transfer_s = self.arrivals.next_arrival_s, self.host.next_transfer_s
        hosted = type(self.host) is not NoHostTier  # (without a host tier no copy is due: its clock is not asked)

        def quiet(retracted: int) -> None:
            running = self.running
            nothing_joins = idle(waiting, running, self.chunked)
            blocked = None if nothing_joins else prefill.blocked
            if nothing_joins or (blocked is not None and not retracted and blocked.state == state()):
                until = min(next_arrival_s(), next_transfer_s()) if hosted else next_arrival_s()
                steps = quiet_steps(running, len(waiting), until, max_steps - ledger.totals.steps, blocked)
                if blocked is not None:
                    replay(blocked.req, steps)  # each step matched it again (a replay)

        return quiet


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


def simulate(requests: Sequence[RequestLike], config: SchedulerConfig, *, progress: bool | None = None,
             storage: HiCacheStorage | None = None) -> SimResult:
    """``storage``: a storage tier's store kept from an earlier run (SGLang's ``/flush_cache`` between two runs
    empties the device and host tiers, not storage); None: a new one when the config has a storage tier."""
    with paused_gc():  # the 12k requests made here are rescanned too
        scheduler = Scheduler(config, requests, storage)
    return scheduler.run(progress=progress)
