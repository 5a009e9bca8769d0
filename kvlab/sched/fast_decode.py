"""Decode rounds as events: the same steps, rows and totals as :class:`~kvlab.sched.decode.ReferenceDecode`, at a
cost per round that grows with what happens in the round rather than with the running batch.

At page size P, a running request's decode round usually writes its token inside a page it already holds:
nothing in the pools or the tree changes. Only three things make a round touch a request:

- its token *opens a page* (one every P rounds): the round takes a page from the allocator for it;
- its token is its *last*: it finishes and is cached into the tree (``release_kv_cache``);
- its remaining output falls under ``CLIP_MAX_NEW_TOKENS``: the prefill budget's offset counts it exactly
  from then on (before, clipped).

Each is a heap of ``(round, order, state)`` keyed by the round it happens in; ``order`` (admission order)
breaks ties in running order. Between events a request's outputs and row are implicit in the round
counter (``Ledger.decode_rounds``), and :meth:`FastDecode.sync_one` writes them out (before it finishes, before a
retraction, before an invariant check). The shared parts are the reference's and the memory view's public methods,
called, not copied: the memory check and eviction (``SchedulerKV.reserve`` / ``evict``), the new-token-ratio decay,
the retraction fallback (``ReferenceDecode.retract_and_decode``), ``SchedulerKV.finish``; the page take is
``SchedulerKV.take_decode_pages`` (the allocator's
:meth:`~kvlab.mem_cache.allocator.PagedTokenToKVPoolAllocator.alloc_decode_page_ids`, the half of ``alloc_decode``
that the reference round reaches through ``alloc_paged_token_slots_decode``); the quiet rounds are written by
``Ledger.quiet_decode_steps``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvlab.sched.decode import DecodeOutcome, ReferenceDecode
from kvlab.sched.prefill import fits_budget

if TYPE_CHECKING:
    from kvlab.sched.prefill import Blocked
    from kvlab.sched.request import SimReq


@dataclass(slots=True, eq=False)
class DecodeState:
    """One running request between two syncs. Round ``r`` (counted from the start of the run) gives it
    ``outputs_at_start + r - start_round`` output tokens; its row is written up to ``written_len`` and the
    positions after it follow ``last_slot`` contiguously except where a page was opened."""

    req: SimReq
    order: int  # admission order: ties between heap entries resolve in running order
    start_round: int  # the round counter when the state was made
    outputs_at_start: int  # len(req.output_ids) then
    written_len: int  # row positions [0, written_len) hold their slots
    last_slot: int  # the slot at row position written_len - 1
    opened_pages: list[tuple[int, int]] = field(default_factory=list)  # (row position, first slot) since sync
    finish_round: int = 0  # the round that emits the last output token
    clipped: bool = False  # remaining outputs > CLIP_MAX_NEW_TOKENS (the offset counts the clip)
    live: bool = True  # False once synced out: its heap entries are stale


class FastDecode:
    """The event-driven decode rounds of one run (page size > 1); ``reference`` runs the rounds in which memory is
    short (retraction needs every request's real outputs and row) and lends its memory view, ledger and ratio."""

    def __init__(self, reference: ReferenceDecode) -> None:
        self.reference = reference
        self.kv, self.ledger, self.ratio = reference.kv, reference.ledger, reference.ratio
        self.clip, self.cost = reference.clip, reference.cost
        self.page_size = reference.page_size
        self._orders = itertools.count()
        self.opens: list = []  # (round, order, state): the round whose token opens a page
        self.finishes: list = []  # (round, order, state): the round that emits the last token
        self.unclips: list = []  # (round, order, state): from then on, fewer than clip tokens remain
        self.finish_round_sum = 0  # sum of finish_round over unclipped states
        self.unclipped = 0
        self.clipped = 0

    @property
    def round(self) -> int:
        """Decode rounds run so far (the ledger's counter, which the reference round advances too)."""
        return self.ledger.decode_rounds

    # ---- the prefill budget's offset ----------------------------------------------------------
    def future_tokens(self, running: Sequence[SimReq]) -> int:
        """``ReferenceDecode.future_tokens`` from the counters: each unclipped request has
        ``finish_round - round`` tokens to go; each clipped one counts the clip."""
        d = self.round
        for state in _pop_due(self.unclips, d):
            if state.clipped:
                state.clipped = False
                self.clipped -= 1
                self.unclipped += 1
                self.finish_round_sum += state.finish_round
        return self.finish_round_sum - self.unclipped * d + self.clip * self.clipped

    # ---- entering and leaving -----------------------------------------------------------------
    def admit(self, req: SimReq) -> None:
        """Hand a running request (outputs and row written out) to the event-driven rounds."""
        ps, d = self.page_size, self.round
        outputs = len(req.output_ids)
        state = DecodeState(req, next(self._orders), d, outputs, req.kv_len, self.kv.last_slot(req))
        req.decode_state = state
        # round d + j writes row position seq_len - 2 + j; a page opens where that is page aligned
        heapq.heappush(self.opens, (d + 1 + (-(req.seq_len - 1)) % ps, state.order, state))
        state.finish_round = d + req.max_new_tokens - outputs
        heapq.heappush(self.finishes, (state.finish_round, state.order, state))
        state.clipped = state.finish_round - d > self.clip
        if state.clipped:
            self.clipped += 1
            heapq.heappush(self.unclips, (state.finish_round - self.clip, state.order, state))
        else:
            self.unclipped += 1
            self.finish_round_sum += state.finish_round

    def sync(self, running: Sequence[SimReq]) -> None:
        for req in running:
            self.sync_one(req)

    def sync_one(self, req: SimReq) -> None:
        """Write out a request's outputs, ``kv_len`` and row as of this round (it stays registered)."""
        state = req.decode_state
        n = state.outputs_at_start + self.round - state.start_round
        out = req.output_ids
        if len(out) < n:
            out.extend(req.planned_output[len(out) : n])
        end = req.prompt_len + n - 1  # the last output token's KV is written by the next round
        req.kv_len = end
        last = self.kv.write_decoded(req, state.written_len, state.last_slot, state.opened_pages, end)
        state.written_len, state.last_slot, state.opened_pages = end, last, []

    def _leave(self, req: SimReq) -> None:
        self.sync_one(req)
        req.decode_state.live = False
        req.decode_state = None

    def _leave_all(self, running: Sequence[SimReq]) -> None:
        for req in running:
            self._leave(req)
        self.opens, self.finishes, self.unclips = [], [], []
        self.finish_round_sum = self.unclipped = self.clipped = 0

    # ---- one round ----------------------------------------------------------------------------
    def decode(self, running: list[SimReq]) -> DecodeOutcome:
        """One decode round touching only the requests whose token opens a page or is their last; the
        rest advance with the round counter. When memory is short, the reference round runs instead
        (retraction needs every request's real outputs and row)."""
        kv, ps, d = self.kv, self.page_size, self.ledger.decode_rounds + 1
        opens = self.opens
        openers = list(_pop_due(opens, d)) if opens and opens[0][0] <= d else []  # in running order
        allocator = kv.allocator
        if allocator.available_size() < len(running) * ps:  # else both evictions below find room
            if not kv.reserve(ps * len(openers)):  # check_decode_mem
                self._leave_all(running)
                outcome = self.reference.retract_and_decode(running)
                for req in outcome.running:
                    self.admit(req)
                return outcome
            kv.evict(len(running) * ps)  # alloc_paged_token_slots_decode: evict for batch_size pages
        self.ratio.decay()
        if openers or len(running) > allocator.free_list_pages():  # else the page take takes nothing
            pages = kv.take_decode_pages(len(running), len(openers))
        if openers:
            for state, page in zip(openers, pages):
                position = state.req.prompt_len + state.outputs_at_start + d - state.start_round - 2
                state.opened_pages.append((position, page * ps))
                heapq.heappush(opens, (d + ps, state.order, state))
        self.ledger.note_decode_round(len(running))
        finishes = self.finishes
        if finishes and finishes[0][0] <= d:
            done = list(_pop_due(finishes, d))
            for state in done:
                req = state.req
                self._leave(req)
                if state.clipped:  # its unclip round passed while nothing read the future tokens (not yet popped)
                    self.clipped -= 1
                else:
                    self.unclipped -= 1
                    self.finish_round_sum -= state.finish_round
                kv.finish(req)
            if done:
                finished = {id(state.req) for state in done}
                running = [r for r in running if id(r) not in finished]
        return DecodeOutcome(running, [])

    def quiet_steps(self, running: Sequence[SimReq], waiting: int, until_s: float, max_steps: int,
                    blocked: Blocked | None = None) -> int:
        """Run, after a decode step, the decode rounds in which nothing but the counters moves, as the loop would
        (one step and one row each): no page opens, no request finishes, the pool holds a page per running
        request (no eviction). The loop calls this only when no prefill can be scheduled, and the rounds stop at
        ``until_s`` (the next arrival). Each such round of :meth:`decode` only decays the new-token ratio and
        counts its tokens (``Ledger.quiet_decode_steps``). Stops before the first round that is not quiet (the
        loop runs it). Returns the steps run.

        ``blocked``: a request waits, and the step's admission check turned it down for the budget alone. Each
        quiet round's step then checks it again first (``need < budget - ratio × future tokens``, with the pools
        and tree unchanged): the rounds stop before the first check that would admit it, and before a request's
        remaining outputs fall under the clip (that changes the future tokens). The caller replays the check's
        match for each step run (:meth:`SchedulerKV.replay_matches_of`)."""
        n, allocator = len(running), self.kv.allocator
        if not n or allocator.available_size() < n * self.page_size or n > allocator.free_list_pages():
            return 0
        d = self.ledger.decode_rounds
        last = min(self.opens[0][0] if self.opens else d + 2**62,
                   self.finishes[0][0] if self.finishes else d + 2**62) - 1  # stale heads only stop early
        limit = min(last - d, max_steps)
        if blocked is not None:
            # the check before round d + i reads the future tokens at round d + i - 1: no unclip may be due by then
            limit = min(limit, (self.unclips[0][0] if self.unclips else d + 2**62) - d)
            limit = self._still_blocked(blocked, d, limit)
        if limit <= 0:
            return 0
        steps = self.ledger.quiet_decode_steps(n, self.cost.decode_time_s(n), limit, until_s, self.kv.sizes(),
                                               waiting)
        self.ratio.decay(steps)
        return steps

    def _still_blocked(self, blocked: Blocked, d: int, limit: int) -> int:
        """How many of the next ``limit`` steps' admission checks turn ``blocked`` down again, in a row: the
        scheduler's arithmetic (``Scheduler._future_tokens``, ``PrefillAdder.schedule``) with the ratio decayed
        one step per round, as :meth:`NewTokenRatio.decay` does."""
        value, decayed, floor = self.ratio.value, self.ratio.decayed, self.ratio.min
        need, budget = blocked.need, blocked.budget
        base, per_round = self.finish_round_sum + self.clip * self.clipped, self.unclipped
        k = 0
        while k < limit:
            future = base - per_round * (d + k)  # FastDecode.future_tokens at round d + k
            if fits_budget(need, budget, value * future):
                break
            k += 1
            if value != floor:  # (the floor decays to itself)
                value = decayed(value)
        return k


def _pop_due(heap: list, d: int):
    """Pop the live states whose round is ``<= d`` (in round, then running order)."""
    while heap and heap[0][0] <= d:
        state = heapq.heappop(heap)[2]
        if state.live:
            yield state
