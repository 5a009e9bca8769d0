"""The two-tier radix cache at page granularity, for the page engine with a host tier (``kvlab.sched.page_kv.PageKV``):
:class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` op for op over page ids, with no slot values.

It is to ``HiRadixCache`` what :class:`~kvlab.mem_cache.page_tree.PageRadixTree` is to ``RadixCache``: at a page
size P > 1 a paged two-tier tree compares only whole pages (children filed by their first page, splits on page
boundaries, sizes in whole pages), and nothing it decides reads a device or host slot id. So a node holds its key
(page ids, :class:`~kvlab.mem_cache.page_tree.PageKeys`) and, instead of slot tensors, ``value`` / ``host_value``
set to ``True`` or ``None`` (on the device / backed up: the same ``HiTreeNode``, whose residency, host protection
and clock reads are the token tree's). The device pool is the page engine's count of free pages, the host pool a
count too, and the copies are timed by :class:`~kvlab.mem_cache.hicache.cache_controller.HiCacheController` itself
(:class:`~kvlab.mem_cache.hicache.page_host.PageHiController`: one clock for both memories).

Shared, not copied: the leaf rules and each tier's heap (``leaf_index.HiLeafIndex`` over ``tree_core.LeafIndex``),
the lock walk, counters and structure-version bumps (``tree_core.TreeCore``), the node (``tree_node.HiTreeNode``),
the copy clock, and the token tree's own code for the walks (match with a clock read per node, insert with the
locked-path shortcut and write-through hit counting, the re-match after an insert: ``two_tier_core.TwoTierCore``)
and the tier moves (backup, demotion, write-back, host eviction, load-back, acks: ``two_tier_moves.TwoTierMoves``).
Written here: what reads page ids (the child key, the split, the storage keys), and in
:mod:`~kvlab.mem_cache.hicache.page_tier_moves` the copies and frees over counts. Sizes (``evictable_size_``,
``protected_size_``) are in pages; what reaches the scheduler and the ledger is in tokens, as the token tree gives it. The twin test
(``tests/sched/test_page_hicache.py``) runs both memories on the same workloads and requires the same rows, totals,
clock, host-tier traffic and final tree (:meth:`PageHiRadixTree.to_hiradix_cache` rebuilds it at token level).

No torch (``to_hiradix_cache`` imports it when called).
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from functools import partial

from kvlab.errors import require
from kvlab.mem_cache.base_prefix_cache import LogicalClock, common_prefix_len
from kvlab.mem_cache.evict_policy import get_eviction_strategy
from kvlab.mem_cache.hicache.leaf_index import HiLeafIndex
from kvlab.mem_cache.hicache.page_host import PageHiController, PageHostPool
from kvlab.mem_cache.hicache.page_tier_moves import PageTierMoves
from kvlab.mem_cache.hicache.storage_moves import StorageMoves
from kvlab.mem_cache.hicache.tree_node import HiTreeNode
from kvlab.mem_cache.hicache.two_tier_core import TwoTierCore
from kvlab.mem_cache.shortfall import check_mode
from kvlab.mem_cache.tree_core import LeafIndex, TreeCore


class PageHiRadixTree(PageTierMoves, StorageMoves, TwoTierCore, HiLeafIndex, TreeCore):
    """``HiRadixCache`` over page ids. ``allocator``: the device pool's free pages (``free``, ``take(pages)``);
    ``host_pool``: a :class:`PageHostPool`; the rest as ``HiRadixCache`` takes them (bandwidths in bytes/s)."""

    # Its fields, listed (its bases and mixins list none): with a storage tier it has more than CPython 3.11's 30
    # attributes an instance keeps in a class-shared key table, past which each instance gets a dict of its own and
    # none of its method calls or attribute reads is specialized (each looked up in its dict, then its class's).
    __slots__ = ("page_size", "allocator", "host_pool", "cache_controller", "write_policy", "write_through_threshold",
                 "load_back_threshold", "load_back_evict_mode", "eviction_policy", "_priority_of", "structure_version",
                 "_next_id", "leaf_index", "_leaves", "evictable_size_", "protected_size_", "clock", "root_node",
                 "host_leaf_index", "ongoing_write_through", "ongoing_load_back", "host_evicted_tokens", "key_tokens",
                 "page_keys", "storage_controller", "prefetch_stop_policy", "prefetch_threshold", "prefetch_timeout",
                 "ongoing_prefetch", "_awaiting_slots", "timed_ops", "prefetch_loaded_tokens_by_reqid",
                 "_storage_backups", "_storage_due_s", "_lock_guard")

    def __init__(self, allocator, host_pool: PageHostPool, write_policy: str = "write_through",
                 eviction_policy: str = "lru", load_back_evict_mode: str = "shortfall",
                 d2h_bytes_per_s: float = 25e9, h2d_bytes_per_s: float = 25e9, load_back_threshold: int = 10):
        check_mode(load_back_evict_mode, "PageHiRadixTree load_back_evict_mode")
        self.page_size = host_pool.page_size
        self.allocator = allocator
        self.host_pool = host_pool
        self.cache_controller = PageHiController(allocator, host_pool, write_policy, d2h_bytes_per_s,
                                                 h2d_bytes_per_s)
        self.write_policy = write_policy
        self.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = load_back_threshold
        self.load_back_evict_mode = load_back_evict_mode
        self.eviction_policy = eviction_policy.lower()
        self._priority_of = get_eviction_strategy(self.eviction_policy, None).get_priority
        self.structure_version = 0
        self._lock_guard = None  # (TreeCore's: no lock refused; a field, read per lock walk, not a class attribute)
        self._reset_core(self._priority_of)
        self.clock = LogicalClock()
        self.root_node = self._new_node(array("q"), True, None, -(2**63))
        self.root_node.host_value = True
        self.root_node.lock_ref = 1
        self.host_leaf_index = LeafIndex(self._priority_of)
        self.ongoing_write_through: dict = {}
        self.ongoing_load_back: dict = {}
        self.host_evicted_tokens = 0
        self.key_tokens = self.page_size  # (storage_moves: a key element is a page)
        self.page_keys = None  # the run's PageKeys (the page engine's), read to hash pages for the storage tier
        self.storage_controller = None  # (attach_page_storage)
        self._reset_storage()

    def attach_page_storage(self, page_keys, storage, **options) -> None:
        """``attach_storage`` (storage_moves) with the run's :class:`~kvlab.mem_cache.page_tree.PageKeys`: a page's
        storage key is interned by the store from its id's tokens."""
        self.page_keys = page_keys
        self.attach_storage(storage, **options)
        # the store's keys of the pages ``ids`` chained from the key ``prior``, ``hash_keys(ids, prior, known)``
        # (``get_hash_str``'s chain, interned, as ``HiCacheStorage.page_ids`` has their tokens): a page of consecutive
        # ids (id >= 0) by its id, any other by its tokens (bound positionally: a partial with keywords costs three
        # times a frame per call in CPython 3.11)
        self.storage_controller.hash_keys = partial(self.storage_controller.storage.chain, self.page_size,
                                                    self.page_keys.page)

    def _key_of(self, key: array, off: int = 0):
        return key[off]

    def _host_part(self, host_value, start: int, end: int):
        return True

    def evict_host_tokens(self, tokens: int) -> int:
        return self.evict_host(-(-tokens // self.page_size)) * self.page_size

    # -- match and insert: TwoTierCore's walks (match_walk, _insert_walk) ---------------------------------------------
    def _split_len(self, ckey: array, key: array, off: int, n: int) -> int:
        return common_prefix_len(ckey, key, off, n)

    def _device_value(self, src, start: int, end: int) -> bool:
        return True  # (on the device: the page engine's count holds its pages)

    def _split_node(self, child: HiTreeNode, m: int) -> HiTreeNode:
        """``child`` -> ``upper[:m]`` -> ``child[m:]`` (pages), both tiers' residency kept by both halves."""
        parent = child.parent
        upper = self._new_node(child.key[:m], None, parent, child.priority)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        upper.value = child.value
        upper.host_value = child.host_value
        if child.hash_value is not None:  # storage keys, one per page (split_node_hash_value)
            upper.hash_value, child.hash_value = child.hash_value[:m], child.hash_value[m:]
        child.key = child.key[m:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        return upper

    # -- insert ----------------------------------------------------------------------------------------------------
    def _held_path(self, held, held_len: int) -> list | None:
        """``RequestFlows._held_path`` in pages: the root-to-``held`` nodes if ``held`` is a live, locked device node
        whose path holds ``held_len`` pages; else None."""
        if held is None or held.value is None or held.lock_ref <= 0 or held is self.root_node:
            return None
        path, length, root = [], 0, self.root_node
        while held is not root:
            path.append(held)
            length += len(held.key)
            held = held.parent
        return path[::-1] if length == held_len else None

    def insert(self, key: array, n: int, priority: int = 0, chunked: bool = False, held: HiTreeNode | None = None,
               held_len: int = 0) -> tuple[int, HiTreeNode]:
        """``HiRadixCache._insert`` of the first ``n`` pages of ``key`` (TwoTierCore's ``_insert_walk``): (pages
        already on the device, the node ending at ``n``). ``held``: the node the request holds locked, its path
        ``held_len`` pages."""
        return self._insert_walk(key, n, None, priority, chunked, held, held_len)

    # -- sizes, invariants and the token-level view ---------------------------------------------------------------
    def host_size(self) -> int:
        """Pages with a host copy (both tiers or host only)."""
        return sum(len(x.key) for x in self.nodes() if x is not self.root_node and x.host_value is not None)

    def check_invariants(self) -> None:
        """``HiRadixCache.check_invariants`` in pages: children filed by their first page and pointing back; device
        residency closed under prefixes; every node on a tier; host-only nodes unlocked; write-through backups a
        prefix from the root; lock counts; the counters; the host pool holding exactly the tree's host copies; both
        leaf indexes and heaps; every node an in-flight copy protects locked."""
        nodes, on_device = self._check_tiers("PageHiRadixTree")  # (two_tier_core: what both two-tier trees check)
        host_pages = self.host_size()
        held = sum(len(x) for x in self.prefetch_host_slots())  # (storage_moves: a prefetch's slots, not yet in it)
        require(host_pages * self.page_size + held == self.host_pool.used_size(),
                "PageHiRadixTree: the host pool holds exactly the tree's host copies and the prefetches' slots",
                tree=host_pages, prefetch=held, pool_used=self.host_pool.used_size())
        self.host_pool.check_invariants()
        self._check_tier_indexes(nodes, on_device, "PageHiRadixTree")

    def to_hiradix_cache(self, page_keys, kv_tokens: int):
        """This tree as the token-level ``HiRadixCache`` the token-level run ends with: the same nodes (ids, keys as
        tokens, residency, access and creation times, hit counts, priorities, locks), clock, sizes and host
        evictions and copy totals, over a fresh paged allocator of ``kv_tokens`` and a fresh host pool of the same size whose slots
        the nodes hold (slot ids are the simulator's own and never compared; a ``kv_tokens`` other than the run's
        device pool gets a host pool just big enough for the tree's copies)."""
        import torch

        from kvlab.mem_cache.allocator import PagedTokenToKVPoolAllocator
        from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
        from kvlab.mem_cache.hicache.memory_pool_host import HostKVCache

        ps, hp = self.page_size, self.host_pool
        allocator = PagedTokenToKVPoolAllocator(kv_tokens, ps)
        if kv_tokens == hp.device_size_tokens:  # the run's own host pool
            host = HostKVCache(hp.device_size_tokens, hp.size_per_token, ps, hp.hicache_ratio, hp.hicache_size_gb)
        else:  # (a device pool cut to the tree's size: a host pool just big enough for its copies)
            host = HostKVCache(max(hp.used_size(), ps), hp.size_per_token, ps, 1.0)
        ctl = self.cache_controller
        cache = HiRadixCache(None, allocator, host, page_size=ps, write_policy=self.write_policy,
                             eviction_policy=self.eviction_policy, load_back_evict_mode=self.load_back_evict_mode,
                             d2h_bytes_per_s=ctl.d2h_bytes_per_s, h2d_bytes_per_s=ctl.h2d_bytes_per_s)
        made: dict = {}
        for node in self.nodes():  # (pre-order: a parent before its children)
            parent = made.get(node.parent)
            if parent is None:
                twin = cache.root_node
            else:
                tokens = page_keys.tokens(node.key)
                value = host_value = None
                if node.value is not None:
                    pages = allocator.alloc_decode_page_ids(len(node.key), len(node.key))
                    require(pages is not None, "to_hiradix_cache: the pool holds the tree", pages=len(node.key))
                    value = torch.tensor([p * ps + i for p in pages for i in range(ps)], dtype=torch.int64)
                if node.host_value is not None:
                    host_value = host.alloc(len(tokens))
                twin = HiTreeNode(tokens, value, parent, cache.clock, node.id, node.priority)
                twin.host_value = host_value
                parent.children[tokens[:ps].tobytes()] = twin  # (HiRadixCache files a child by its first page)
            twin.last_access_time, twin.creation_time = node.last_access_time, node.creation_time
            twin.hit_count, twin.lock_ref = node.hit_count, node.lock_ref
            twin.hash_value = None if node.hash_value is None else list(node.hash_value)
            made[node] = twin
        cache.adopt(cache.root_node, self._next_id)  # (files each node's leaf status on both tiers)
        cache.clock.now = self.clock.now
        cache.structure_version = self.structure_version
        cache.evictable_size_ = self.evictable_size_ * ps
        cache.protected_size_ = self.protected_size_ * ps
        cache.host_evicted_tokens = self.host_evicted_tokens
        cache.cache_controller.totals = replace(ctl.totals)  # (the run's copies: tokens, seconds, waits, failures)
        cache.cache_controller.now_s = ctl.now_s
        return cache
