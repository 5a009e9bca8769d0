"""Decode rounds as events: the same steps, rows and totals as the reference loop's ``Scheduler._decode``,
at a cost per round that grows with what happens in the round rather than with the running batch.

At page size P, a running request's decode round usually writes its token inside a page it already holds:
nothing in the pools or the tree changes. Only three things make a round touch a request:

- its token *opens a page* (one every P rounds): the round takes a page from the allocator for it;
- its token is its *last*: it finishes and is cached into the tree (``release_kv_cache``);
- its remaining output falls under ``CLIP_MAX_NEW_TOKENS``: the prefill budget's offset counts it exactly
  from then on (before, clipped).

Each is a heap of ``(round, order, state)`` keyed by the round it happens in; ``order`` (admission order)
breaks ties in running order. Between events a request's outputs and row are implicit in the round
counter, and :meth:`FastDecode.sync` writes them out (before it finishes, before a retraction, before an
invariant check). The shared parts are the reference loop's own methods, called, not copied: the memory
check and eviction (``Scheduler._reserve_decode``), the new-token-ratio decay, the retraction fallback
(``Scheduler._retract`` + ``Scheduler._decode_alloc_emit``), ``Scheduler._finish``; the page take is the
allocator's :meth:`~kvlab.mem_cache.allocator.PagedTokenToKVPoolAllocator.alloc_decode_pages`, the half of
``alloc_decode`` that the reference round reaches through ``alloc_paged_token_slots_decode``.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvlab.mem_cache.common import evict_from_tree_cache
from kvlab.mem_cache.evict_policy import EvictResult

if TYPE_CHECKING:
    from kvlab.sched.request import SimReq
    from kvlab.sched.scheduler import Scheduler

_QUIET = EvictResult()  # frozen: a quiet round evicts nothing


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
    """The event-driven decode rounds of one :class:`~kvlab.sched.scheduler.Scheduler` (page size > 1)."""

    def __init__(self, sched: Scheduler, clip_max_new_tokens: int) -> None:
        self.sched = sched
        self.clip = clip_max_new_tokens
        self.page_size = sched.config.page_size
        self._orders = itertools.count()
        self.opens: list = []  # (round, order, state): the round whose token opens a page
        self.finishes: list = []  # (round, order, state): the round that emits the last token
        self.unclips: list = []  # (round, order, state): from then on, fewer than clip tokens remain
        self.finish_round_sum = 0  # sum of finish_round over unclipped states
        self.unclipped = 0
        self.clipped = 0

    @property
    def round(self) -> int:
        """Decode rounds run so far (the scheduler's counter, which the fallback round advances too)."""
        return self.sched.decode_rounds

    # ---- the prefill budget's offset ----------------------------------------------------------
    def future_tokens(self) -> int:
        """``Scheduler._future_tokens`` from the counters: each unclipped request has
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
    def register(self, req: SimReq) -> None:
        """Hand a running request (outputs and row written out) to the event-driven rounds."""
        ps, d = self.page_size, self.round
        row = self.sched.req_to_token_pool.req_to_token[req.req_pool_idx]
        outputs = len(req.output_ids)
        state = DecodeState(req, next(self._orders), d, outputs, req.kv_len, int(row[req.kv_len - 1]))
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

    def sync(self, req: SimReq) -> None:
        """Write out a request's outputs, ``kv_len`` and row as of this round (it stays registered)."""
        state = req.decode_state
        n = state.outputs_at_start + self.round - state.start_round
        out = req.output_ids
        if len(out) < n:
            out.extend(req.planned_output[len(out) : n])
        end = req.prompt_len + n - 1  # the last output token's KV is written by the next round
        req.kv_len = end
        row = self.sched.req_to_token_pool.req_to_token[req.req_pool_idx]
        pos, slot = state.written_len, state.last_slot + 1
        last = state.last_slot
        for page_pos, page_slot in [*state.opened_pages, (end, 0)]:
            if page_pos > pos:
                row[pos:page_pos] = torch.arange(slot, slot + page_pos - pos, dtype=torch.int32)
                last = slot + page_pos - pos - 1
            pos, slot = page_pos, page_slot
        state.written_len, state.last_slot, state.opened_pages = end, last, []

    def _leave(self, req: SimReq) -> None:
        self.sync(req)
        req.decode_state.live = False
        req.decode_state = None

    def unregister_all(self) -> None:
        for req in self.sched.running:
            self._leave(req)
        self.opens, self.finishes, self.unclips = [], [], []
        self.finish_round_sum = self.unclipped = self.clipped = 0

    # ---- one round ----------------------------------------------------------------------------
    def decode(self) -> int:
        """One decode round touching only the requests whose token opens a page or is their last; the
        rest advance with the round counter. When memory is short, the reference round runs instead
        (retraction needs every request's real outputs and row). Returns the number retracted."""
        sched, ps, d = self.sched, self.page_size, self.sched.decode_rounds + 1
        opens = self.opens
        openers = list(_pop_due(opens, d)) if opens and opens[0][0] <= d else []  # in running order
        running = sched.running
        if sched.allocator.available_size() < len(running) * ps:  # else both evictions below find room
            if not sched._reserve_decode(ps * len(openers)):  # check_decode_mem
                self.unregister_all()
                retracted = sched._retract()
                sched._decode_alloc_emit()
                for req in sched.running:
                    self.register(req)
                return retracted
            # alloc_paged_token_slots_decode: evict for batch_size pages, then alloc_decode's page take
            sched._note(evict_from_tree_cache(sched.tree, len(running) * ps, sched.config.eviction))
        sched._decay_new_token_ratio()
        allocator = sched.allocator
        if openers or len(running) > allocator.free_pages.shape[0]:  # else the page take takes nothing
            pages = allocator.alloc_decode_pages(len(running), len(openers))
            if pages is None:
                raise RuntimeError(f"Decode out of memory: {len(running)} requests, "
                                   f"{allocator.available_size()} slots available")
        if openers:
            for state, page in zip(openers, pages.tolist()):
                position = state.req.prompt_len + state.outputs_at_start + d - state.start_round - 2
                state.opened_pages.append((position, page * ps))
                heapq.heappush(opens, (d + ps, state.order, state))
        sched.decode_rounds = d
        sched.totals.output_tokens += len(running)
        finishes = self.finishes
        if finishes and finishes[0][0] <= d:
            done = list(_pop_due(finishes, d))
            for state in done:
                req = state.req
                self._leave(req)
                self.unclipped -= 1
                self.finish_round_sum -= state.finish_round
                sched._finish(req)
            if done:
                finished = {id(state.req) for state in done}
                sched.running = [r for r in running if id(r) not in finished]
        return 0

    def quiet_rounds(self) -> None:
        """Run, after a decode step, the decode rounds in which nothing but the counters moves, as the loop would
        (one step and one row each): no page opens, no request finishes, the pool holds a page per running
        request (no eviction), no arrival is due and no prefill can be scheduled. Each such round of
        :meth:`decode` only decays the new-token ratio and counts its tokens, so its row is the step's row with
        the step number and time advanced. Stops at the first round that is not quiet (the loop runs it)."""
        sched = self.sched
        running, waiting, cfg, allocator = sched.running, sched.waiting, sched.config, sched.allocator
        n = len(running)
        if (not n or sched.chunked is not None or (waiting and n < cfg.max_running)
                or allocator.available_size() < n * self.page_size or n > allocator.free_pages.shape[0]):
            return
        d = sched.decode_rounds
        last = min(self.opens[0][0] if self.opens else d + 2**62,
                   self.finishes[0][0] if self.finishes else d + 2**62) - 1  # stale heads only stop early
        if d >= last:
            return
        pending, totals, rows = sched.pending, sched.totals, sched.rows
        sched._step_evict, sched._step_hits, sched._step_pressure, sched._finished = _QUIET, 0, 0, 0
        template = sched._step_row("decode", 0, 0)
        dt = cfg.cost.decode_time_s(n)
        while d < last and totals.steps < cfg.max_steps and not (pending and pending[0].arrival_time_s <= sched.now_s):
            d += 1
            sched._decay_new_token_ratio()
            totals.output_tokens += n
            sched.now_s += dt
            totals.steps += 1
            row = template.copy()
            row["step"], row["time_s"] = totals.steps, sched.now_s
            rows.append(row)
        sched.decode_rounds = d


def _pop_due(heap: list, d: int):
    """Pop the live states whose round is ``<= d`` (in round, then running order)."""
    while heap and heap[0][0] <= d:
        state = heapq.heappop(heap)[2]
        if state.live:
            yield state
