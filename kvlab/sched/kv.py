"""The scheduler's one view of memory: the slot allocator, the request-to-token rows, the radix tree and the eviction
mode, with SGLang's flows over them (match, extend and decode allocation, caching a request into the tree).

Every ``evict_from_tree_cache`` call goes through here with the run's eviction mode, the only switch between the two
arms of finding 2, and is reported to the :class:`~kvlab.sched.ledger.Ledger`, so no call site can forget either.

With HiCache on (``config.hicache``) the tree is a :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` over a
host pool: a match reports device and host hits, admission loads the host part back (:meth:`SchedulerKV.load_back`,
whose own eviction follows the run's mode too), and the copies complete on the controller's clock, which
:class:`~kvlab.sched.host_timing.HostTierTiming` moves to each step's start (SGLang's ``check_hicache_events``) and
prices each step with.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np
import torch

from kvlab.errors import require
from kvlab.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvlab.mem_cache.common import (
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
    alloc_token_slots,
    evict_from_tree_cache,
    release_kv_cache,
)
from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
from kvlab.mem_cache.hicache.memory_pool_host import HostKVCache
from kvlab.mem_cache.hicache.storage import HiCacheStorage
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.radix_cache import RadixCache
from kvlab.sched.config import SchedulerConfig
from kvlab.sched.ledger import Ledger, PoolSizes
from kvlab.sched.memory import AllocationError, RowsExhaustedError
from kvlab.sched.request import HostTierState, MatchMemo, SimReq
from kvlab.sched.storage_tier import prefetch_done, start_prefetch, storage_options, storage_store
from kvlab.units import align_down, align_up


class SchedulerKV:
    """Pools and tree of one run. ``allocator`` is a :class:`TokenToKVPoolAllocator` at page size 1 and a
    :class:`PagedTokenToKVPoolAllocator` otherwise; ``req_to_token`` is ``req_to_token_pool.req_to_token`` (one
    row of KV slots per request)."""

    def __init__(self, config: SchedulerConfig, longest_request_tokens: int, ledger: Ledger,
                 storage: HiCacheStorage | None = None) -> None:
        ps = self.page_size = config.page_size
        self.kv_tokens = config.kv_tokens
        self.eviction = config.eviction
        # replay a request's repeated match (same tokens, tree structure unchanged) instead of walking the tree
        # again: a shortcut of the fast path; the reference loop walks every time, and the tests compare the two
        self.replay_matches = config.fast_decode
        self.ledger = ledger
        if ps == 1:
            self.allocator = TokenToKVPoolAllocator(config.kv_tokens)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(config.kv_tokens, ps)
        self.req_to_token_pool = ReqToTokenPool(config.max_running + 1, align_up(longest_request_tokens, ps) + ps)
        self.req_to_token = self.req_to_token_pool.req_to_token
        # the same rows as a numpy view (same memory): the scheduler's own row reads and writes go through it,
        # a fraction of a torch call's cost each; the tree reads the torch tensor
        self.rows = self.req_to_token.numpy()
        self.hicache = config.hicache
        if self.hicache:
            cost = config.cost
            self.host_pool = HostKVCache(config.kv_tokens, cost.kv_bytes_per_token, ps,
                                         hicache_ratio=config.hicache_ratio or 2.0,
                                         hicache_size_gb=config.hicache_size_gb)
            self.tree = HiRadixCache(self.req_to_token_pool, self.allocator, self.host_pool, page_size=ps,
                                     write_policy=config.hicache_write_policy, eviction_policy=config.policy,
                                     load_back_evict_mode=config.eviction,
                                     d2h_bytes_per_s=cost.device_to_host_bytes_per_s,
                                     h2d_bytes_per_s=cost.host_to_device_bytes_per_s)
            if config.hicache_storage:
                self.storage = attach_storage(self.tree, config, storage)
        else:
            self.tree = RadixCache(self.req_to_token_pool, self.allocator, page_size=ps, eviction_policy=config.policy)

    # ---- sizes ----------------------------------------------------------------------------------
    def available(self) -> int:
        return self.allocator.available_size()

    def evictable(self) -> int:
        return self.tree.evictable_size()

    def sizes(self) -> PoolSizes:
        tree = self.tree  # read once per step: the tree's public size counters, without two method calls
        return PoolSizes(self.allocator.available_size(), tree.evictable_size_, tree.protected_size_)

    # ---- eviction -------------------------------------------------------------------------------
    def evict(self, tokens: int) -> None:
        """``evict_from_tree_cache(tree, tokens, mode)``, noted in the ledger."""
        self.ledger.note_eviction(evict_from_tree_cache(self.tree, tokens, self.eviction))

    def reserve(self, tokens: int) -> bool:
        """``check_decode_mem`` once the need is known: evict for ``tokens``; does the pool now hold them?"""
        self.evict(tokens)
        return self.allocator.available_size() >= tokens

    # ---- prefill --------------------------------------------------------------------------------
    def match(self, req: SimReq) -> None:
        """``Req.init_next_round_input``: match with the input − 1 cap, page aligned."""
        if not req.origin_input_ids:  # token arrays: the tree matches them without a conversion
            to_array = getattr(req.prompt, "to_array", None)  # kvlab.workloads.TokenSequence has one
            req.origin_input_ids = to_array() if to_array else array("q", req.prompt)
        tree = self.tree
        if (self.replayable(req)
                and req.match_memo.fill_len == len(req.origin_input_ids) + len(req.output_ids) == len(req.fill_ids)):
            # the same tokens matched again (fill_ids as the last match built them: outputs only grow), the tree's
            # structure unchanged since (a waiting request that did not fit, tried again next step): the walk would
            # visit the same nodes and find the same prefix, so only its side effects are replayed (one clock
            # tick, a tick per node on a HiRadixCache; the access times of the path and the root; the heap entries
            # of its leaves)
            memo = req.match_memo
            tree.restamp_path(memo.last_node)
            req.prefix_indices = memo.prefix_indices
            req.prefix_len = req.cache_protected_len = req.kv_len = memo.prefix_len
            if self.hicache:  # the walk's end may be host-only: the tiers' ends and the host hit, as the walk found
                host = _host(req)
                req.last_node, host.best_match_node, host.hit_len = tree.match_ends(memo.last_node)
            else:
                req.last_node = memo.last_node
            return
        # a first admission matches the prompt itself (nothing mutates fill_ids in place)
        req.fill_ids = req.origin_input_ids + array("q", req.output_ids) if req.output_ids else req.origin_input_ids
        fill, ps = req.fill_ids, self.page_size
        cap = align_down(len(fill) - 1, ps)
        # match_prefix truncates its key to whole pages: unless fill_ids ends at a page end, all of it is the same
        # key as fill_ids[:cap], without copying a prompt's array
        m = tree.match_prefix(fill if align_down(len(fill), ps) == cap else fill[:cap])
        req.prefix_indices = m.device_indices
        req.prefix_len = m.device_prefix_len
        req.last_node = m.last_device_node
        if cap:  # the memo keeps the walk's end: on a HiRadixCache, below the device prefix when it hit on host
            end = m.last_host_node if self.hicache and m.host_hit_length else m.last_device_node
            req.match_memo = MatchMemo(tree.structure_version, len(req.fill_ids), m.device_indices, end,
                                       m.device_prefix_len)
        req.cache_protected_len = req.prefix_len
        req.kv_len = req.prefix_len
        if self.hicache:
            host = _host(req)
            host.hit_len, host.best_match_node = m.host_hit_length, m.last_host_node

    def state(self) -> tuple:
        """What a waiting request's admission check reads of the pools and tree, as one comparable value: free
        tokens, evictable and locked tokens, and the tree's structure version."""
        tree = self.tree
        return self.allocator.available_size(), tree.evictable_size_, tree.protected_size_, tree.structure_version

    def replayable(self, req: SimReq) -> bool:
        """Would matching ``req`` again now be a replay (:meth:`match`'s shortcut)?"""
        memo = req.match_memo
        return memo is not None and self.replay_matches and memo.version == self.tree.structure_version

    def replay_matches_of(self, req: SimReq, times: int) -> None:
        """The side effects of matching ``req`` ``times`` more times while :meth:`replayable` (each a clock tick
        and the path's access times; a tick per node too on a HiRadixCache): the clock moves as the walks would
        and the path is stamped with the last."""
        if times:
            tree = self.tree
            if self.hicache:
                tree.restamp_path(req.match_memo.last_node, times)
            else:
                tree.clock.now += times - 1
                tree.restamp_path(req.match_memo.last_node)

    def load_back(self, req: SimReq) -> int:
        """HiCache admission (``PrefillAdder.add_one_req`` -> ``init_load_back``): bring the request's host-only
        match back to the device, its device prefix locked meanwhile. The load allocates device slots and may
        evict first (the run's mode: the shortfall, or the whole load as 0.5.16 did), noted in the ledger. On
        success the request's prefix grows by the loaded tokens and ends at the loaded node (locked by the load
        until its copy lands). Returns the tokens loaded (0: nothing on host, under SGLang's 10-token threshold,
        or no room even after eviction: the host part is then computed again)."""
        host = req.host
        if host is None or not host.hit_len:
            return 0
        tree = self.tree
        tree.inc_lock_ref(req.last_node)
        res = tree.load_back(host.best_match_node)
        tree.dec_lock_ref(req.last_node)
        self.ledger.note_eviction(res.evict)
        host.hit_len = 0
        if res.device_indices is None:
            return 0
        req.prefix_indices = torch.cat([req.prefix_indices, res.device_indices])
        req.last_node = host.best_match_node
        req.prefix_len = req.cache_protected_len = req.kv_len = int(req.prefix_indices.shape[0])
        host.loaded_len += res.loaded_tokens
        return res.loaded_tokens

    # ---- the storage tier (L3) -----------------------------------------------------------------
    def prefetch(self, req: SimReq) -> None:
        """On arrival (``Scheduler._prefetch_kvcache``): match, and prefetch the prompt past the host match from
        storage, up to the input − 1 cap (``_compute_max_prefix_len``)."""
        self.match(req)
        host = _host(req)
        last_host = host.best_match_node
        if last_host.host_value is not None:  # backed up, or the root
            tree = self.tree
            matched = req.prefix_len + host.hit_len
            tokens = req.fill_ids[matched : max(len(req.fill_ids) - 1, 0)]
            start_prefetch(tree, req, last_host, tokens)

    def prefetch_done(self, req: SimReq) -> bool:
        """Before admission: may the request be scheduled now (:func:`kvlab.sched.storage_tier.prefetch_done`)?"""
        return prefetch_done(self.tree, req)

    def lock(self, req: SimReq) -> None:
        """Lock the request's matched prefix (``inc_lock_ref(req.last_node)``)."""
        self.tree.inc_lock_ref(req.last_node)

    def unlock(self, req: SimReq) -> None:
        self.tree.dec_lock_ref(req.last_node)

    def alloc_extend(self, batch: Sequence[SimReq]) -> None:
        """A row per new request, the matched prefix copied into it, then slots for every ``extend_len``."""
        ps, rows = self.page_size, self.rows
        if self.req_to_token_pool.alloc(batch) is None:
            raise RowsExhaustedError("request rows exhausted (max_running too small for the batch)")
        for req in batch:  # the matched prefix's slots go into the row first
            if req.kv_len == req.prefix_len and req.prefix_len:
                rows[req.req_pool_idx, : req.prefix_len] = req.prefix_indices[: req.prefix_len].numpy()  # casts
        if ps == 1:
            result = alloc_token_slots(self.tree, sum(r.extend_len for r in batch), self.eviction)
        else:
            last = [int(rows[r.req_pool_idx, r.kv_len - 1]) if r.kv_len else -1 for r in batch]
            result = alloc_paged_token_slots_extend(
                self.tree, [r.kv_len for r in batch], [r.kv_len + r.extend_len for r in batch], last, self.eviction)
        self.ledger.note_eviction(result.evict)
        if result.out_cache_loc is None:
            raise AllocationError(
                f"Prefill out of memory: {sum(r.extend_len for r in batch)} tokens wanted, "
                f"{self.allocator.available_size()} available, {self.tree.evictable_size()} evictable")
        start, out = 0, result.out_cache_loc.numpy()
        for req in batch:
            rows[req.req_pool_idx, req.kv_len : req.kv_len + req.extend_len] = out[start : start + req.extend_len]
            start += req.extend_len  # (int64 -> int32 in the copy)

    def cache_chunk(self, req: SimReq) -> None:
        """A chunked request's computed part goes into the tree (``cache_unfinished_req(chunked=True)``)."""
        saved = req.fill_ids
        req.fill_ids = saved[: req.kv_len]
        self.tree.cache_unfinished_req(req, chunked=True)
        req.fill_ids = saved

    def cache_unfinished(self, req: SimReq) -> None:
        self.tree.cache_unfinished_req(req)

    # ---- decode ---------------------------------------------------------------------------------
    def alloc_decode(self, running: Sequence[SimReq]) -> None:
        """One slot per running request for the KV of its last emitted token (evicting first), written into its
        row; each request's ``kv_len`` becomes its ``seq_len``."""
        rows = self.rows
        if self.page_size == 1:
            result = alloc_token_slots(self.tree, len(running), self.eviction)
        else:
            last = [int(rows[r.req_pool_idx, r.seq_len - 2]) for r in running]
            result = alloc_paged_token_slots_decode(self.tree, [r.seq_len for r in running], last, self.eviction)
        self.ledger.note_eviction(result.evict)
        if result.out_cache_loc is None:
            raise AllocationError(f"Decode out of memory: {len(running)} requests, "
                               f"{self.allocator.available_size()} slots available")
        for req, loc in zip(running, result.out_cache_loc.tolist()):
            rows[req.req_pool_idx, req.seq_len - 1] = loc  # KV of the last emitted token
            req.kv_len = req.seq_len

    def take_decode_pages(self, batch_size: int, num_pages: int) -> list[int]:
        """The page take of a paged decode round (``alloc_decode_page_ids``): ``num_pages`` page ids."""
        pages = self.allocator.alloc_decode_page_ids(batch_size, num_pages)
        if pages is None:
            raise AllocationError(f"Decode out of memory: {batch_size} requests, "
                               f"{self.allocator.available_size()} slots available")
        return pages

    def last_slot(self, req: SimReq) -> int:
        """The slot of the request's last token with KV (row position ``kv_len - 1``)."""
        return int(self.rows[req.req_pool_idx, req.kv_len - 1])

    def write_decoded(self, req: SimReq, written_len: int, last_slot: int, opened_pages: list, end: int) -> int:
        """Write the event-driven rounds' slots into the request's row: positions ``[written_len, end)`` follow
        ``last_slot`` contiguously except where a page was opened (``opened_pages``: (row position, first slot)).
        Returns the slot at position ``end - 1``."""
        row = self.rows[req.req_pool_idx]
        pos, slot, last = written_len, last_slot + 1, last_slot
        for page_pos, page_slot in [*opened_pages, (end, 0)]:
            if page_pos > pos:
                row[pos:page_pos] = np.arange(slot, slot + page_pos - pos, dtype=np.int32)
                last = slot + page_pos - pos - 1
            pos, slot = page_pos, page_slot
        return last

    def row(self, req: SimReq) -> np.ndarray:
        """The request's row of ``req_to_token``, as a numpy view (writes go to the pool)."""
        return self.rows[req.req_pool_idx]

    # ---- leaving --------------------------------------------------------------------------------
    def finish(self, req: SimReq) -> None:
        """``release_kv_cache``: prompt + outputs cached into the tree, the row freed; noted as finished."""
        release_kv_cache(req, self.tree)  # reads origin_input_ids + output_ids (fill_ids is not needed)
        req.origin_input_ids, req.fill_ids, req.output_ids = [], [], []  # the tree holds what is worth keeping
        req.match_memo = None
        self.ledger.note_finished(req)

    def release_retracted(self, req: SimReq) -> None:
        """A retracted request gives its slots back without caching them (``is_insert=False``)."""
        release_kv_cache(req, self.tree, is_insert=False)
        req.prefix_indices = torch.empty(0, dtype=torch.int64)
        req.kv_len = req.prefix_len = 0

    def release_aborted(self, req: SimReq) -> None:
        release_kv_cache(req, self.tree, is_insert=False)

    def result_tree(self) -> RadixCache | HiRadixCache:
        """The run's final tree (``SimResult.tree``)."""
        return self.tree

    def check_invariants(self, holders: Sequence[SimReq]) -> None:
        """Pools and tree consistent, and every slot accounted for exactly once (``holders``: the running and
        chunked requests, each holding its tokens past the tree's part of its prefix)."""
        self.allocator.check_invariants()
        self.req_to_token_pool.check_invariants()
        self.tree.check_invariants()  # HiRadixCache's covers the host pool and the copies in flight
        held_tokens = sum(r.kv_len - r.cache_protected_len for r in holders)
        owned = self.allocator.available_size() + self.tree.total_size() + held_tokens
        # ``held`` counts tokens; a paged request's partly filled last page is a whole page of the pool, so
        # the exact count is checked at page 1.
        require(self.page_size != 1 or owned == self.kv_tokens,
                "no slot leak: available + cached + held by requests == kv_tokens",
                available=self.allocator.available_size(), cached=self.tree.total_size(), held=held_tokens,
                kv_tokens=self.kv_tokens)
        require(self.tree.evictable_size() + self.tree.protected_size() == self.tree.total_size(),
                "evictable + protected == cached", evictable=self.tree.evictable_size(),
                protected=self.tree.protected_size(), cached=self.tree.total_size())


def attach_storage(tree: HiRadixCache, config: SchedulerConfig, storage: HiCacheStorage | None) -> HiCacheStorage:
    """Give ``tree`` the run's storage tier: ``storage`` (a store kept from an earlier run: what ``/flush_cache``
    leaves) or a new empty one, sized and timed by the config's backend preset."""
    storage = storage_store(config, storage)
    tree.attach_storage(storage, **storage_options(config))
    return storage


def _host(req: SimReq) -> HostTierState:
    """The request's host-tier state, made on its first match with a host tier."""
    host = req.host
    if host is None:
        host = req.host = HostTierState()
    return host
