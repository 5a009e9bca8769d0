"""A discrete-event model of SGLang's scheduler over kvlab's real pools and radix cache.

One loop, as ``managers/scheduler.py::Scheduler.event_loop_normal``: admit arrivals; try a prefill
batch first (``get_new_batch_prefill`` with ``PrefillAdder``'s budget, prefix matching and locking,
chunked prefill); otherwise one decode round for every running request (``update_running_batch``:
``check_decode_mem`` → ``evict_from_tree_cache``, retraction when memory is still short, with
SGLang's new-token ratio); finished requests are cached into the tree (``release_kv_cache``).

The eviction mode is the only switch between the two arms of finding 2; every call site of
``evict_from_tree_cache`` (prefill allocation, decode check, decode allocation, retraction) uses it.
Per-step metrics come back as a DataFrame. kvlab differs on purpose: time comes from
:class:`~kvlab.sched.cost.CostModel`, and output tokens are the request's own (a trace or workload
may fix them so multi-turn prompts can hit earlier answers) or derived from its id.

This module is the reference loop, one step at a time with SGLang's names. At page size > 1 the decode
rounds run event-driven by default (:mod:`kvlab.sched.fast_decode`, ``SchedulerConfig.fast_decode``); that
path calls this loop's own methods for everything but the round bookkeeping, and the tests check both give
the same rows, totals and tree. Results (:class:`~kvlab.sched.result.SimResult`, the typed
:class:`~kvlab.sched.result.Totals`) are in :mod:`kvlab.sched.result`.
"""

from __future__ import annotations

import random
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kvlab.errors import require
from kvlab.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvlab.mem_cache.common import (
    EVICTION_MODES,
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
    alloc_token_slots,
    evict_from_tree_cache,
    release_kv_cache,
)
from kvlab.mem_cache.evict_policy import EvictResult
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.radix_cache import RadixCache, SimpleReq
from kvlab.sched.cost import CostModel
from kvlab.sched.fast_decode import DecodeState, FastDecode
from kvlab.sched.result import SimResult, Totals
from kvlab.units import align_down, align_up

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py: future tokens counted per request, at most
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
_NO_EVICTION = EvictResult()  # frozen: a step's eviction before anything was noted


@dataclass(frozen=True)
class SchedulerConfig:
    kv_tokens: int  # KV pool size in tokens (a multiple of page_size)
    page_size: int = 1
    max_running: int = 256
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    eviction: str = "shortfall"  # "shortfall" (the fix) | "full" (the bug)
    policy: str = "lru"
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    cost: CostModel = field(default_factory=CostModel)
    debug: bool = False  # check every invariant after every step
    # Event-driven decode rounds (page_size > 1, kvlab.sched.fast_decode): the same steps, rows and
    # totals as the plain loop (fast_decode=False, the reference the tests compare against), at a cost
    # per round that grows with what happens in it rather than with the running batch.
    fast_decode: bool = True
    max_steps: int = 10_000_000

    def __post_init__(self) -> None:
        if self.eviction not in EVICTION_MODES:
            raise ValueError(f"eviction must be one of {EVICTION_MODES}, got {self.eviction!r}")
        for name in ("kv_tokens", "page_size", "max_running", "chunked_prefill_size", "max_prefill_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.kv_tokens % self.page_size:
            raise ValueError(
                f"kv_tokens={self.kv_tokens} is not a multiple of page_size={self.page_size}: "
                f"use {align_down(self.kv_tokens, self.page_size) or self.page_size} tokens or another page size")
        if self.chunked_prefill_size < self.page_size:
            raise ValueError(f"chunked_prefill_size={self.chunked_prefill_size} is smaller than one page ({self.page_size})")


@dataclass(eq=False)
class SimReq(SimpleReq):
    """SGLang's ``Req`` fields the tree reads, plus what the simulator tracks."""

    arrival_time_s: float = 0.0
    prompt: Sequence[int] = ()  # the workload's tokens; copied into origin_input_ids on first admission
    max_new_tokens: int = 1
    planned_output: Sequence[int] = ()
    prefix_len: int = 0  # matched at the last admission
    kv_len: int = 0  # tokens of fill_ids whose KV is in the row
    extend_len: int = 0  # tokens this prefill chunk computes
    admitted: bool = False
    retractions: int = 0
    decode_state: DecodeState | None = None  # while the fast path runs it (outputs, row not written out)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output_ids)


def _planned_output(request: Any) -> Sequence[int]:
    n = max(1, request.output_len)
    tokens = getattr(request, "output_token_ids", None)
    if tokens is not None and len(tokens) >= n:
        return tokens
    return _RandomOutput(f"kvlab-output:{request.rid}", n)


class _RandomOutput:
    """Output tokens derived from the request id, drawn only when the request reaches decode."""

    def __init__(self, seed: str, n: int) -> None:
        self.seed, self.n, self._tokens = seed, n, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self._tokens is None:  # 30-bit tokens >= 1, from C-level random bytes
            import numpy as np

            raw = np.frombuffer(random.Random(self.seed).randbytes(4 * self.n), dtype=np.uint32)
            self._tokens = ((raw >> 2) | 1).tolist()
        return self._tokens[i]


def min_kv_tokens(prompt_len: int, output_len: int, page_size: int = 1) -> int:
    """The smallest KV pool (tokens, whole pages) that can run one request alone: its prompt and every
    output token (at least one) page-aligned plus the padding page, and room for admission, which
    wants ``prompt + clipped output + page_size < free + evictable`` (``PrefillAdder``'s budget)."""
    out = max(1, output_len)
    hold = align_up(prompt_len + out, page_size) + page_size
    admit = align_up(prompt_len + min(out, CLIP_MAX_NEW_TOKENS) + page_size + 1, page_size)
    return max(hold, admit)


class Scheduler:
    def __init__(self, config: SchedulerConfig, requests: Sequence[Any]) -> None:
        self.config = config
        ps = config.page_size
        longest = 0
        for r in requests:
            need = len(r.prompt_token_ids) + max(1, r.output_len)
            longest = max(longest, need)
            if r.output_len < 0 or len(r.prompt_token_ids) < 1:
                raise ValueError(f"request {r.rid!r}: the prompt must have at least 1 token and the output "
                                 f"a non-negative length (got {len(r.prompt_token_ids)} and {r.output_len})")
            if min_kv_tokens(len(r.prompt_token_ids), r.output_len, ps) > config.kv_tokens:
                raise ValueError(
                    f"KV pool of {config.kv_tokens} tokens is smaller than one request: {r.rid!r} needs "
                    f"{need} tokens (prompt {len(r.prompt_token_ids)} + output {r.output_len}); raise --kv-tokens")
        if config.page_size == 1:
            self.allocator = TokenToKVPoolAllocator(config.kv_tokens)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(config.kv_tokens, ps)
        self.req_to_token_pool = ReqToTokenPool(config.max_running + 1, align_up(longest, ps) + ps)
        self.tree = RadixCache(self.req_to_token_pool, self.allocator, page_size=ps, eviction_policy=config.policy)
        self.pending = deque(sorted(
            (SimReq(rid=r.rid, origin_input_ids=[], prompt=r.prompt_token_ids, arrival_time_s=float(r.arrival_time_s),
                    # a prefill always yields the first token, so an output of 0 runs as 1 (prefill only)
                    max_new_tokens=max(1, r.output_len), planned_output=_planned_output(r)) for r in requests),
            key=lambda q: q.arrival_time_s))
        self.waiting: deque[SimReq] = deque()
        self.running: list[SimReq] = []
        self.chunked: SimReq | None = None
        self.now_s = 0.0
        self.init_ratio = min(config.init_new_token_ratio, 1.0)
        self.min_ratio = self.init_ratio * config.min_new_token_ratio_factor
        self.ratio_decay = (self.init_ratio - self.min_ratio) / config.new_token_ratio_decay_steps
        self.new_token_ratio = self.init_ratio
        self.rows: list[dict] = []
        self.totals = Totals(requests=len(requests), prompt_tokens=sum(len(r.prompt_token_ids) for r in requests),
                             prompt_pages=sum(-(-len(r.prompt_token_ids) // ps) for r in requests))
        self._step_evict = EvictResult()
        self._step_pressure = 0  # pressure events (evict_from_tree_cache calls that were short) this step
        self.decode_rounds = 0
        # the event-driven decode rounds, or None for the reference loop (page size 1 has nothing to skip)
        self.fast = FastDecode(self, CLIP_MAX_NEW_TOKENS) if config.fast_decode and ps > 1 else None

    # ---- eviction bookkeeping ---------------------------------------------------------------
    def _note(self, result) -> None:
        ev = result.evict if hasattr(result, "evict") else result
        if not (ev.requested_tokens or ev.shortfall_tokens or ev.evicted_tokens):
            return  # no pressure (most calls): nothing to add
        t = self.totals
        if ev.requested_tokens:
            t.pressure_events += 1
            self._step_pressure += 1
        t.evicted_tokens += ev.evicted_tokens
        t.over_evicted_tokens += ev.over_evicted_tokens
        t.overshoot_tokens += ev.overshoot_tokens
        s = self._step_evict
        self._step_evict = EvictResult(
            shortfall_tokens=s.shortfall_tokens + ev.shortfall_tokens,
            requested_tokens=s.requested_tokens + ev.requested_tokens,
            evicted_tokens=s.evicted_tokens + ev.evicted_tokens,
            over_evicted_tokens=s.over_evicted_tokens + ev.over_evicted_tokens,
            overshoot_tokens=s.overshoot_tokens + ev.overshoot_tokens)

    # ---- prefill ----------------------------------------------------------------------------
    def _match(self, req: SimReq) -> None:
        """``Req.init_next_round_input``: match with the input − 1 cap, page aligned."""
        if not req.origin_input_ids:  # token arrays: the tree matches them without a conversion
            to_array = getattr(req.prompt, "to_array", None)
            req.origin_input_ids = to_array() if to_array else array("q", req.prompt)
        # a first admission matches the prompt itself (nothing mutates fill_ids in place)
        req.fill_ids = req.origin_input_ids + array("q", req.output_ids) if req.output_ids else req.origin_input_ids
        cap = align_down(len(req.fill_ids) - 1, self.config.page_size)
        m = self.tree.match_prefix(req.fill_ids[:cap])
        req.prefix_indices = m.device_indices
        req.prefix_len = m.device_prefix_len
        req.last_node = m.last_device_node
        req.cache_protected_len = req.prefix_len
        req.kv_len = req.prefix_len

    def _schedule_prefill(self) -> list[SimReq]:
        cfg, ps = self.config, self.config.page_size
        if self.chunked is None and (not self.waiting or len(self.running) >= cfg.max_running):
            return []  # nothing can join a batch (the budget below has no side effect to skip)
        offset = self.new_token_ratio * self._future_tokens()
        rem_input, rem_chunk = cfg.max_prefill_tokens, cfg.chunked_prefill_size
        batch: list[SimReq] = []

        def rem_total() -> float:
            return self.allocator.available_size() + self.tree.evictable_size() - offset

        if self.chunked is not None:  # add_chunked_req: the chunk in progress goes first
            req = self.chunked
            remaining = len(req.fill_ids) - req.kv_len
            take = remaining if remaining <= rem_chunk else align_down(rem_chunk, ps)
            req.extend_len = take
            offset += align_up(take, ps) + ps
            rem_input -= align_up(take, ps)
            rem_chunk -= align_up(take, ps)
            batch.append(req)
            self.chunked = None if take == remaining else req
        while self.waiting and self.chunked is None and rem_input > 0 and rem_chunk > 0:
            if len(self.running) + len(batch) >= cfg.max_running:
                break
            req = self.waiting[0]
            self._match(req)
            max_new = min(req.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)
            extend = len(req.fill_ids) - req.prefix_len
            self.tree.inc_lock_ref(req.last_node)  # temporary lock while the budget is read
            fits = extend + max_new + ps < rem_total()
            self.tree.dec_lock_ref(req.last_node)
            if not fits:
                break
            chunked = align_up(extend, ps) > rem_chunk
            if chunked:
                extend = align_down(rem_chunk, ps)
                max_new = 0
                if extend <= 0:
                    break
            elif batch and align_up(extend, ps) >= rem_input:
                break
            self.waiting.popleft()
            self.tree.inc_lock_ref(req.last_node)
            req.extend_len = extend
            offset += align_up(extend, ps) + ps + max_new
            rem_input -= align_up(extend, ps)
            rem_chunk -= align_up(extend, ps)
            if not req.admitted:
                req.admitted = True
                self.totals.cached_prompt_tokens += min(req.prefix_len, req.prompt_len)
                self.totals.hit_pages += min(req.prefix_len, req.prompt_len) // ps
                self._step_hits += min(req.prefix_len, req.prompt_len)
            batch.append(req)
            if chunked:
                self.chunked = req
        return batch

    def _allocate_extend(self, batch: list[SimReq]) -> None:
        ps = self.config.page_size
        if self.req_to_token_pool.alloc(batch) is None:
            raise RuntimeError("request rows exhausted (max_running too small for the batch)")
        rows = self.req_to_token_pool.req_to_token
        for req in batch:  # the matched prefix's slots go into the row first
            if req.kv_len == req.prefix_len and req.prefix_len:
                rows[req.req_pool_idx, : req.prefix_len] = req.prefix_indices[: req.prefix_len]  # copy_ casts
        if ps == 1:
            result = alloc_token_slots(self.tree, sum(r.extend_len for r in batch), self.config.eviction)
        else:
            last = [int(rows[r.req_pool_idx, r.kv_len - 1]) if r.kv_len else -1 for r in batch]
            result = alloc_paged_token_slots_extend(
                self.tree, [r.kv_len for r in batch], [r.kv_len + r.extend_len for r in batch], last,
                self.config.eviction)
        self._note(result)
        if result.out_cache_loc is None:
            raise RuntimeError(
                f"Prefill out of memory: {sum(r.extend_len for r in batch)} tokens wanted, "
                f"{self.allocator.available_size()} available, {self.tree.evictable_size()} evictable")
        start = 0
        for req in batch:
            loc = result.out_cache_loc[start : start + req.extend_len]
            rows[req.req_pool_idx, req.kv_len : req.kv_len + req.extend_len] = loc  # int64 -> int32 in the copy
            start += req.extend_len

    def _finish_prefill(self, batch: list[SimReq]) -> None:
        for req in batch:
            req.kv_len += req.extend_len
            self.totals.prefill_tokens_computed += req.extend_len
            if req.retractions:  # back from a retraction: its prompt and outputs so far, less what it matched
                self.totals.reprefill_tokens += req.extend_len
            if req is self.chunked:
                saved = req.fill_ids
                req.fill_ids = saved[: req.kv_len]
                self.tree.cache_unfinished_req(req, chunked=True)
                req.fill_ids = saved
                continue
            self._emit_token(req)
            if len(req.output_ids) >= req.max_new_tokens:
                self._finish(req)
            else:
                self.tree.cache_unfinished_req(req)
                self.running.append(req)
                if self.fast:
                    self.fast.register(req)

    # ---- decode -----------------------------------------------------------------------------
    def _decode_need(self, reqs: Sequence[SimReq]) -> int:
        """``new_tokens_required_next_decode``: one token each at page 1; a page for each request
        whose next token opens one otherwise."""
        ps = self.config.page_size
        if ps == 1:
            return len(reqs)
        return ps * sum(1 for r in reqs if (r.seq_len - 1) % ps == 0)

    def _check_decode_mem(self, reqs: Sequence[SimReq]) -> bool:
        return self._reserve_decode(self._decode_need(reqs))

    def _reserve_decode(self, need: int) -> bool:
        """``check_decode_mem`` once the need is known: evict for it; does the pool now hold it?"""
        self._note(evict_from_tree_cache(self.tree, need, self.config.eviction))
        return self.allocator.available_size() >= need

    def _decay_new_token_ratio(self) -> None:
        """A decode round that needed no retraction lowers the ratio by one decay step, to its floor."""
        self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)

    def _retract(self) -> int:
        """``retract_decode``: fewest decoded tokens first (longest prompt among ties)."""
        order = sorted(self.running, key=lambda r: (len(r.output_ids), -r.prompt_len), reverse=True)
        retracted: list[SimReq] = []
        first = True
        while first or not self._check_decode_mem(order):
            first = False
            if len(order) == 1:
                break
            req = order.pop()
            release_kv_cache(req, self.tree, is_insert=False)
            req.prefix_indices = torch.empty(0, dtype=torch.int64)
            req.kv_len = req.prefix_len = 0
            req.retractions += 1
            retracted.append(req)
            self._note(evict_from_tree_cache(self.tree, len(order) * RETRACT_DECODE_STEPS, self.config.eviction))
        if not self._check_decode_mem(order):  # the last one cannot run even alone
            req = order.pop()
            release_kv_cache(req, self.tree, is_insert=False)
            self.totals.aborted += 1
        self.running = [r for r in self.running if r in order]
        self.waiting.extend(retracted)
        decoded = sum(len(r.output_ids) for r in order)
        planned = sum(r.max_new_tokens for r in order)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / (planned + 1))
        self.totals.retractions += len(retracted)
        return len(retracted)

    def _decode(self) -> int:
        if self.fast:
            return self.fast.decode()
        retracted = 0
        if not self._check_decode_mem(self.running):
            retracted = self._retract()
        else:
            self._decay_new_token_ratio()
        self._decode_alloc_emit()
        return retracted

    def _decode_alloc_emit(self) -> None:
        if not self.running:
            return
        self.decode_rounds += 1
        rows = self.req_to_token_pool.req_to_token
        if self.config.page_size == 1:
            result = alloc_token_slots(self.tree, len(self.running), self.config.eviction)
        else:
            last = [int(rows[r.req_pool_idx, r.seq_len - 2]) for r in self.running]
            result = alloc_paged_token_slots_decode(self.tree, [r.seq_len for r in self.running], last,
                                                    self.config.eviction)
        self._note(result)
        if result.out_cache_loc is None:
            raise RuntimeError(f"Decode out of memory: {len(self.running)} requests, "
                               f"{self.allocator.available_size()} slots available")
        still_running = []
        for req, loc in zip(self.running, result.out_cache_loc.tolist()):
            rows[req.req_pool_idx, req.seq_len - 1] = loc  # KV of the last emitted token
            req.kv_len = req.seq_len
            self._emit_token(req)
            if len(req.output_ids) >= req.max_new_tokens:
                self._finish(req)
            else:
                still_running.append(req)
        self.running = still_running

    def _future_tokens(self) -> int:
        """PrefillAdder's offset before the new-token ratio: tokens the running requests may still
        decode, each clipped at CLIP_MAX_NEW_TOKENS."""
        if self.fast:
            return self.fast.future_tokens()
        return sum(min(r.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS) for r in self.running)

    # ---- shared -----------------------------------------------------------------------------
    def _emit_token(self, req: SimReq) -> None:
        req.output_ids.append(req.planned_output[len(req.output_ids)])
        self.totals.output_tokens += 1

    def _finish(self, req: SimReq) -> None:
        release_kv_cache(req, self.tree)  # reads origin_input_ids + output_ids (fill_ids is not needed)
        req.origin_input_ids, req.fill_ids, req.output_ids = [], [], []  # the tree holds what is worth keeping
        self._finished += 1

    def check_invariants(self) -> None:
        """Pools and tree consistent, and every slot accounted for exactly once."""
        if self.fast:
            for req in self.running:
                self.fast.sync(req)
        self.allocator.check_invariants()
        self.req_to_token_pool.check_invariants()
        self.tree.check_invariants()
        held = 0
        for req in self.running + ([self.chunked] if self.chunked else []):
            held += req.kv_len - req.cache_protected_len
        ps = self.config.page_size
        owned = self.allocator.available_size() + self.tree.total_size() + held
        # ``held`` counts tokens; a paged request's partly filled last page is a whole page of the pool, so
        # the exact count is checked at page 1.
        require(ps != 1 or owned == self.config.kv_tokens,
                "no slot leak: available + cached + held by requests == kv_tokens",
                available=self.allocator.available_size(), cached=self.tree.total_size(), held=held,
                kv_tokens=self.config.kv_tokens)
        require(self.tree.evictable_size() + self.tree.protected_size() == self.tree.total_size(),
                "evictable + protected == cached", evictable=self.tree.evictable_size(),
                protected=self.tree.protected_size(), cached=self.tree.total_size())

    def _step_row(self, kind: str, computed: int, retracted: int) -> dict:
        """The per-step metrics row (one per step of the loop)."""
        ev, totals = self._step_evict, self.totals
        return {
            "step": totals.steps, "time_s": self.now_s, "kind": kind, "hit_tokens": self._step_hits,
            "prefill_tokens": computed, "pressure_events": self._step_pressure,
            "shortfall_tokens": ev.shortfall_tokens, "evicted_tokens": ev.evicted_tokens,
            "over_evicted_tokens": ev.over_evicted_tokens, "overshoot_tokens": ev.overshoot_tokens,
            "available_tokens": self.allocator.available_size(), "evictable_tokens": self.tree.evictable_size_,
            "protected_tokens": self.tree.protected_size_, "running": len(self.running),
            "waiting": len(self.waiting), "retracted": retracted, "finished": self._finished,
            "cached_prompt_tokens": totals.cached_prompt_tokens,
        }

    def _admit_arrivals(self) -> None:
        while self.pending and self.pending[0].arrival_time_s <= self.now_s:
            self.waiting.append(self.pending.popleft())

    def run(self, progress: bool | None = None) -> SimResult:
        # Every tensor here is a few thousand indices: waking a second intra-op thread for each op costs
        # more than the op (a 12k-request trace ran ~6x slower with torch's default 2 threads here).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._run(progress)
        finally:
            torch.set_num_threads(threads)

    def _run(self, progress: bool | None) -> SimResult:
        from kvlab.progress import progress_bar

        bar = progress_bar(total=self.totals.requests, desc=f"simulate ({self.config.eviction})",
                           enabled=progress, unit="req")
        cfg, totals, rows, allocator, tree = self.config, self.totals, self.rows, self.allocator, self.tree
        pending = self.pending
        while pending or self.waiting or self.running or self.chunked:
            if totals.steps >= cfg.max_steps:
                raise RuntimeError(f"simulation did not finish in {cfg.max_steps} steps")
            if pending and pending[0].arrival_time_s <= self.now_s:
                self._admit_arrivals()
            if not (self.waiting or self.running or self.chunked):
                self.now_s = pending[0].arrival_time_s
                continue
            self._step_evict = _NO_EVICTION
            self._step_hits = 0
            self._step_pressure = 0
            self._finished = 0
            batch = self._schedule_prefill()
            retracted = 0
            if batch:
                self._allocate_extend(batch)
                computed = sum(r.extend_len for r in batch)
                self._finish_prefill(batch)
                kind, dt = "prefill", cfg.cost.prefill_time_s(computed)
            elif self.running:
                computed = 0
                batch_size = len(self.running)
                retracted = self._decode()
                kind, dt = "decode", cfg.cost.decode_time_s(batch_size)
            else:
                raise RuntimeError(
                    f"scheduler stuck: {len(self.waiting)} waiting request(s) cannot be admitted into a pool of "
                    f"{cfg.kv_tokens} tokens ({allocator.available_size()} free, "
                    f"{tree.evictable_size()} evictable)")
            self.now_s += dt
            totals.steps += 1
            if cfg.debug:
                self.check_invariants()
            rows.append(self._step_row(kind, computed, retracted))
            if self._finished:
                bar.update(self._finished)
            if self.fast and kind == "decode" and not cfg.debug:
                self.fast.quiet_rounds()  # the rounds up to the next event, without the loop around them
        bar.close()
        return SimResult(self.config, replace(self.totals), self.now_s, self.rows, self.tree)


def simulate(requests: Sequence[Any], config: SchedulerConfig, *, progress: bool | None = None) -> SimResult:
    return Scheduler(config, requests).run(progress=progress)
