"""The run's record: the :class:`~kvlab.sched.result.Totals`, the modelled clock, the per-step counters and the
per-step rows, in one object that every component reports to.

A step of the loop opens with :meth:`Ledger.begin_step` (the step's counters back to zero), the components note what
they did (evictions, first-admission hits, prefill tokens, emitted tokens, finished requests), and
:meth:`Ledger.end_step` advances the clock and the step count and appends the step's row.
:meth:`Ledger.quiet_decode_steps` is the one place that writes *quiet* decode steps: steps in which nothing but the
counters moves (the event-driven decode rounds skip the loop for them, :mod:`kvlab.sched.fast_decode`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from kvlab.mem_cache.base_prefix_cache import EvictResult
from kvlab.mem_cache.shortfall import over_evicted_tokens
from kvlab.sched.result import QuietRun, StepRow, Totals, expand_rows

if TYPE_CHECKING:  # an annotation only
    from kvlab.sched.request import SimReq

_NO_EVICTION = (0, 0, 0, 0, 0)  # a step's eviction before anything was noted (see Ledger._note)


class PoolSizes(NamedTuple):
    """What a row shows of memory, in tokens: free in the allocator, cached and evictable, cached and locked."""

    available_tokens: int
    evictable_tokens: int
    protected_tokens: int


class Transfers(NamedTuple):
    """Host-tier traffic (HiCache) over a span of the run: tokens loaded back (host -> device), written to host
    (device -> host), host copies evicted, and the seconds of copies issued (both directions)."""

    loaded_back_tokens: int = 0
    written_to_host_tokens: int = 0
    host_evicted_tokens: int = 0
    transfer_s: float = 0.0
    # the storage tier (L3): tokens read into host by prefetches, found in storage but not read, backed up
    prefetched_tokens: int = 0
    prefetch_aborted_tokens: int = 0
    written_to_storage_tokens: int = 0


_NO_TRANSFERS = Transfers()


class Ledger:
    """Totals, clock and rows of one run. ``now_s`` is the modelled server's clock (the cost model), not wall time;
    ``decode_rounds`` counts the decode rounds run so far (the event-driven rounds key their events by it)."""

    def __init__(self, totals: Totals) -> None:
        self.totals = totals
        # the rows as written: a StepRow per step, except a run of quiet decode steps, one QuietRun record (a run
        # makes about 180,000 quiet steps on the 12k-request conversation trace; ``kvlab simulate --json`` reads
        # none of their rows)
        self.step_log: list[StepRow | QuietRun] = []
        self.now_s = 0.0
        self.decode_rounds = 0
        self.done: list[SimReq] = []  # finished or aborted since the loop last read them (it clears the list)
        self.begin_step()

    # ---- one step -------------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Zero the step's counters: its eviction, first-admission hits, pressure events, finished requests and
        host-tier traffic."""
        self.step_evict = _NO_EVICTION
        self.step_hits = 0
        self.step_pressure = 0  # evict_from_tree_cache calls that were short, this step
        self.step_finished = 0
        self.step_host_hits = 0
        self.step_storage_hits = 0
        self.step_transfers = _NO_TRANSFERS

    def note_eviction(self, ev: EvictResult) -> None:
        """One ``evict_from_tree_cache`` call: a pressure event when it asked the tree for anything."""
        if ev.requested_tokens or ev.shortfall_tokens or ev.evicted_tokens:  # (most calls: no pressure)
            self._note(ev.shortfall_tokens, ev.requested_tokens, ev.evicted_tokens, ev.over_evicted_tokens,
                       ev.overshoot_tokens)

    def note_evicted(self, shortfall: int, requested: int, evicted: int) -> None:
        """:meth:`note_eviction` of ``EvictResult.of(shortfall, requested, evicted)``, from the numbers (a pressure
        event: ``requested > 0``)."""
        self._note(shortfall, requested, evicted, over_evicted_tokens(evicted, requested, shortfall),
                   max(0, evicted - requested))

    def _note(self, shortfall: int, requested: int, evicted: int, over: int, overshoot: int) -> None:
        t = self.totals
        if requested:
            t.pressure_events += 1
            self.step_pressure += 1
        t.evicted_tokens += evicted
        t.over_evicted_tokens += over
        t.overshoot_tokens += overshoot
        s = self.step_evict  # (shortfall, requested, evicted, over-evicted, overshoot) tokens
        self.step_evict = (s[0] + shortfall, s[1] + requested, s[2] + evicted, s[3] + over, s[4] + overshoot)

    def note_first_admission(self, matched_prompt_tokens: int, page_size: int, host_tokens: int = 0,
                             storage_tokens: int = 0) -> None:
        """A request admitted for the first time found ``matched_prompt_tokens`` of its prompt cached, of which
        ``host_tokens`` on host only (loaded back; HiCache), the rest on the device; ``storage_tokens`` of the host
        tokens had been read from storage by its prefetch (counted as storage hits, not host hits)."""
        t = self.totals
        t.cached_prompt_tokens += matched_prompt_tokens
        t.hit_pages += matched_prompt_tokens // page_size
        t.device_hit_tokens += matched_prompt_tokens - host_tokens
        t.host_hit_tokens += host_tokens - storage_tokens
        t.storage_hit_tokens += storage_tokens
        self.step_hits += matched_prompt_tokens
        self.step_host_hits += host_tokens - storage_tokens
        self.step_storage_hits += storage_tokens

    def note_transfers(self, moved: Transfers) -> None:
        """The step's host-tier traffic (HiCache), shown in the step's row (the totals take the run's sum once, at
        its end: :meth:`note_transfer_totals`)."""
        self.step_transfers = moved

    def note_transfer_totals(self, total: Transfers) -> None:
        """The run's host-tier traffic, the sum of its rows' (HiCache: noted once, as the run ends, from the running
        totals the rows are the differences of: the seconds equal to their sum up to float rounding)."""
        t = self.totals
        (t.loaded_back_tokens, t.written_to_host_tokens, t.host_evicted_tokens, t.transfer_s, t.prefetched_tokens,
         t.prefetch_aborted_tokens, t.written_to_storage_tokens) = total

    def note_prefill(self, tokens_computed: int, *, again: bool = False) -> None:
        """A prefill computed ``tokens_computed`` tokens; ``again``: for a request back from a retraction (its
        prompt and outputs so far, less what it matched then), counted in ``reprefill_tokens`` too."""
        self.totals.prefill_tokens_computed += tokens_computed
        if again:
            self.totals.reprefill_tokens += tokens_computed

    def emit(self, req: SimReq) -> None:
        """``req`` emits its next planned output token."""
        req.output_ids.append(req.planned_output[len(req.output_ids)])
        self.totals.output_tokens += 1

    def note_decode_round(self, unwritten_tokens: int = 0) -> None:
        """A decode round ran; ``unwritten_tokens``: tokens it emitted that :meth:`emit` did not count (the
        event-driven rounds write outputs out later)."""
        self.decode_rounds += 1
        self.totals.output_tokens += unwritten_tokens

    def note_finished(self, req: SimReq) -> None:
        self.step_finished += 1
        self.done.append(req)

    def note_retracted(self, count: int) -> None:
        self.totals.retractions += count

    def note_aborted(self, req: SimReq) -> None:
        self.totals.aborted += 1
        self.done.append(req)  # (its response, an error, arrives too)

    def row(self, kind: str, prefill_tokens: int, retracted: int, sizes: PoolSizes, running: int,
            waiting: int) -> StepRow:
        """The per-step metrics row (one per step of the loop; :meth:`StepRow.as_dict` is the row dict)."""
        return StepRow(self.totals.steps, self.now_s, kind, self.step_hits, prefill_tokens, self.step_pressure,
                       self.step_evict, sizes, running, waiting, retracted, self.step_finished,
                       self.totals.cached_prompt_tokens, self.step_host_hits, self.step_transfers,
                       self.step_storage_hits)

    def advance_to(self, now_s: float) -> None:
        """Nothing runs until ``now_s`` (the next arrival, or the next host-tier copy to land): the clock jumps there.
        The ledger owns the clock: only this, :meth:`end_step` and :meth:`quiet_decode_steps` move it."""
        self.now_s = now_s

    def end_step(self, kind: str, dt_s: float, prefill_tokens: int, retracted: int, sizes: PoolSizes,
                 running: int, waiting: int) -> None:
        """Close the step: the clock advances by ``dt_s``, the step is counted and its row appended."""
        self.now_s += dt_s
        self.totals.steps += 1
        self.step_log.append(self.row(kind, prefill_tokens, retracted, sizes, running, waiting))

    @property
    def rows(self) -> list[dict]:
        """The per-step rows so far, one dict per step (a new list: :func:`expand_rows` of the step log)."""
        return expand_rows(self.step_log)

    def quiet_decode_steps(self, batch: int, dt_s: float, max_steps: int, until_s: float, sizes: PoolSizes,
                           waiting: int) -> int:
        """Up to ``max_steps`` quiet decode steps of ``batch`` running requests, stopping once the clock reaches
        ``until_s`` (the next arrival): each emits ``batch`` tokens, takes ``dt_s``, and its row is a decode row
        that evicted, hit and finished nothing. Returns the number of steps written (the caller decays the
        new-token ratio once per step)."""
        self.begin_step()
        totals = self.totals
        first_step, start_s = totals.steps, self.now_s
        n = 0
        while n < max_steps and self.now_s < until_s:
            n += 1
            self.now_s += dt_s
        if n:  # their rows: one record (the template is the row builder's, so a row's keys are declared once)
            self.step_log.append(QuietRun(self.row("decode", 0, 0, sizes, batch, waiting), first_step, start_s,
                                          dt_s, n))
        totals.output_tokens += batch * n
        totals.steps += n
        self.decode_rounds += n
        return n
