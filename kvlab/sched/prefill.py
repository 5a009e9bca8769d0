"""The prefill step: which waiting requests join the next batch (SGLang's ``PrefillAdder`` with
``get_new_batch_prefill``: budget, prefix matching and locking, chunked prefill) and what running the batch does
(``process_batch_result_prefill``: one token each, finished or cached as unfinished)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from kvlab.sched.config import SchedulerConfig
from kvlab.sched.ledger import Ledger
from kvlab.sched.request import SimReq
from kvlab.units import align_down, align_up

if TYPE_CHECKING:  # (the memory is SchedulerKV or the page engine's PageKV: neither is imported here)
    from kvlab.sched.kv import SchedulerKV


def fits_budget(need: int, budget: int, reserve: float) -> bool:
    """SGLang's admission check (``PrefillAdder.add_one_req``): a request of ``need`` tokens joins when they fit in
    the pool's free + evictable ``budget`` less the running requests' ``reserve`` (the new-token ratio times their
    future tokens, plus what this batch already took). The one place it is written: the loop's admission and the
    fast path's "still turned down" look-ahead (:meth:`FastDecode.quiet_steps`) both ask it."""
    return need < budget - reserve


class Blocked(NamedTuple):
    """The waiting head's admission failed on the budget alone (``need < budget - offset`` was false), nothing
    admitted: ``need`` its tokens (extend + clipped outputs + a page), ``budget`` the pool's free + evictable tokens
    with its prefix locked, ``state`` the pools and tree (:meth:`SchedulerKV.state`) around the check. While the state
    and the request stay, the same check fails again until the offset (new-token ratio × future tokens) falls far
    enough: the fast decode rounds run those steps without the loop (:meth:`FastDecode.quiet_steps`)."""

    req: SimReq
    need: int
    budget: int
    state: tuple


class PrefillBatch(NamedTuple):
    """The requests of one prefill step (each computes ``extend_len`` tokens) and the request whose prefill is
    chunked after this step (``None`` when none is)."""

    reqs: list[SimReq]
    chunked: SimReq | None


_EMPTY = PrefillBatch([], None)


class PrefillAdder:
    """Builds prefill batches against the run's pools; ``clip``: future tokens counted per running request, at
    most (``CLIP_MAX_NEW_TOKENS``)."""

    def __init__(self, config: SchedulerConfig, kv: SchedulerKV, ledger: Ledger, clip: int) -> None:
        self.config, self.kv, self.ledger, self.clip = config, kv, ledger, clip
        self.page_size = config.page_size
        self.blocked: Blocked | None = None  # the last schedule's, when it admitted nothing for the budget alone

    def idle(self, waiting: Sequence[SimReq], running: Sequence[SimReq], chunked: SimReq | None) -> bool:
        """Nothing can join a batch: no chunk in progress, and nothing waits or the running batch is full."""
        return chunked is None and (not waiting or len(running) >= self.config.max_running)

    def schedule(self, waiting: deque[SimReq], running: Sequence[SimReq], chunked: SimReq | None,
                 future_tokens: Callable[[], float]) -> PrefillBatch:
        """The next batch: the chunk in progress first, then waiting requests in order while the budget holds.
        ``future_tokens()``: the running requests' reserve (the new-token ratio times their clipped remaining
        outputs), asked only when a batch can form. Admitted requests leave ``waiting``, locked."""
        cfg, ps, kv = self.config, self.page_size, self.kv
        self.blocked = None
        if self.idle(waiting, running, chunked):
            return _EMPTY  # the budget below has no side effect to skip
        offset = future_tokens()
        rem_input, rem_chunk = cfg.max_prefill_tokens, cfg.chunked_prefill_size
        batch: list[SimReq] = []

        if chunked is not None:  # add_chunked_req: the chunk in progress goes first
            took = self._next_chunk(chunked, rem_chunk)
            offset += took + ps
            rem_input -= took
            rem_chunk -= took
            batch.append(chunked)
            chunked = None if chunked.extend_len == len(chunked.fill_ids) - chunked.kv_len else chunked
        skipped: list[SimReq] = []  # HiCache storage: requests whose prefetch goes on (check_prefetch_progress)
        while waiting and chunked is None and rem_input > 0 and rem_chunk > 0:
            if len(running) + len(batch) >= cfg.max_running:
                break
            req = waiting[0]
            host = req.host  # HiCache storage: a prefetch started on its arrival may still be under way
            if host is not None and host.prefetching and not kv.prefetch_done(req):
                skipped.append(waiting.popleft())
                continue
            kv.match(req)
            max_new = min(req.max_new_tokens - len(req.output_ids), self.clip)
            extend = len(req.fill_ids) - req.prefix_len
            kv.lock(req)  # temporary lock while the budget is read
            need, budget = extend + max_new + ps, kv.available() + kv.evictable()
            fits = fits_budget(need, budget, offset)
            kv.unlock(req)
            if not fits:
                if not batch and kv.replayable(req):  # (the unlock restored what the lock changed)
                    self.blocked = Blocked(req, need, budget, kv.state())
                break
            host = req.host  # HiCache: load the host part back now (fits counted it as new tokens)
            if host is not None and host.hit_len and kv.load_back(req):
                extend = len(req.fill_ids) - req.prefix_len
            chunks = align_up(extend, ps) > rem_chunk
            if chunks:
                extend = align_down(rem_chunk, ps)
                max_new = 0
                if extend <= 0:
                    break
            elif batch and align_up(extend, ps) >= rem_input:
                break
            waiting.popleft()
            kv.lock(req)
            req.extend_len = extend
            offset += align_up(extend, ps) + ps + max_new
            rem_input -= align_up(extend, ps)
            rem_chunk -= align_up(extend, ps)
            self._note_admitted(req, host)
            batch.append(req)
            if chunks:
                chunked = req
        if skipped:
            waiting.extendleft(reversed(skipped))  # (back in their places, ahead of the rest)
        return PrefillBatch(batch, chunked)

    def _note_admitted(self, req: SimReq, host) -> None:
        """A first admission's hits go into the ledger: device, host (loaded back) and storage (loaded back after its
        prefetch read them); the request's loaded-back count starts again."""
        if not req.admitted:
            req.admitted = True
            hit = min(req.prefix_len, req.prompt_len)
            req.cached_tokens = hit  # (SGLang counts cached_tokens once, at the first chunk)
            hosted = min(host.loaded_len, hit) if host else 0
            # (per request as well: multiturn34's SimReq.storage_hit_tokens, which its per-round table sums)
            stored = req.storage_hit_tokens = min(host.storage_len, hosted) if host else 0
            req.host_hit_tokens = hosted - stored
            self.ledger.note_first_admission(hit, self.page_size, host_tokens=hosted, storage_tokens=stored)
        if host is not None:
            host.loaded_len = 0

    def _next_chunk(self, req: SimReq, rem_chunk: int) -> int:
        """The chunked request's next chunk (``add_chunked_req``): the rest of its prompt if it fits the chunk budget,
        else the budget's whole pages. Sets its ``extend_len``; returns the tokens the chunk takes (page aligned)."""
        ps = self.page_size
        remaining = len(req.fill_ids) - req.kv_len
        req.extend_len = remaining if remaining <= rem_chunk else align_down(rem_chunk, ps)
        return align_up(req.extend_len, ps)

    def run(self, batch: PrefillBatch) -> list[SimReq]:
        """Allocate and compute the batch: each request but the chunked one emits its first token, then finishes
        or is cached as unfinished. Returns the requests that now decode, in batch order."""
        kv, ledger = self.kv, self.ledger
        kv.alloc_extend(batch.reqs)
        started = []
        for req in batch.reqs:
            req.kv_len += req.extend_len
            ledger.note_prefill(req.extend_len, again=bool(req.retractions))
            if req is batch.chunked:
                kv.cache_chunk(req)
                continue
            ledger.emit(req)
            if len(req.output_ids) >= req.max_new_tokens:
                kv.finish(req)
            else:
                kv.cache_unfinished(req)
                started.append(req)
        return started
