"""SGLang's KV memory subsystem, re-implemented with SGLang's names so learners can grep upstream.

- ``memory_pool``: ``ReqToTokenPool`` (request rows), ``MHATokenToKVPool`` (per-layer K/V buffers).
- ``allocator`` / ``swa_allocator``: which KV slots are free (``TokenToKVPoolAllocator``,
  ``PagedTokenToKVPoolAllocator``; ``SWATokenToKVPoolAllocator``: all kept to one protocol, ``KVAllocator``).
- ``base_prefix_cache``: the contract every prefix cache keeps (``BasePrefixCache``) and its
  request/result types (``MatchResult``, ``InsertResult``, ``EvictParams``, ``EvictResult``).
- ``tree_core``: what every radix tree does with only key lengths, locks, access times, ids and priorities, written
  once (``TreeCore``: the lock walk and size counters, ``nodes()``, version bumps; ``LeafIndex``: a tier's evictable
  leaves and their heap), for the token, page and two-tier trees. No torch.
- ``tree_walk``: the one prefix walk the token tree and the page tree share (``PrefixWalk._descend``). No torch.
- ``radix_tree``: the tree mechanics the slot-holding trees share (``BaseRadixTree``, on ``TreeCore``).
- ``radix_cache`` + ``evict_policy``: the prefix tree, its locks and whole-leaf eviction; ``request_flows``: the
  request API the token trees share (``Req``, ``SimpleReq``, ``cache_finished_req`` / ``cache_unfinished_req``).
- ``swa_radix_cache`` / ``mamba_radix_cache``: hybrid trees (SWA tombstones; recurrent-state slots).
- ``hicache/``: HiCache's host tier (L2), one module per upstream file: the host pool (``memory_pool_host``:
  ``HostKVCache``, sized as SGLang sizes it), copies timed on a modelled clock (``cache_controller``:
  ``HiCacheController``), and the two-tier tree (``hiradix_cache``: ``HiRadixCache``, with its leaf indexes, tier
  moves (write policies, demotion, host eviction, load-back) and check beside it).
- ``common``: evict-then-allocate, with the shortfall / full eviction toggle, and
  ``match_alloc_insert`` (match -> lock -> evict + allocate -> insert -> free duplicates -> unlock).
- ``options``: what a run's configuration checks against, with no torch: ``EVICTION_MODES``, ``WRITE_POLICIES``,
  ``host_pool_size`` (re-exported from ``common``, ``hicache.cache_controller``, ``hicache.memory_pool_host``).

Names are imported on first use (``__getattr__`` below), so ``import kvlab.mem_cache.options`` or
``base_prefix_cache``'s result types cost no torch import. Imports point one way: options <- hicache.memory_pool_host;
tree_core <- tree_walk; memory_pool <- allocator <- swa_allocator, base_prefix_cache <- evict_policy, radix_tree <- request_flows
<- radix_cache, swa_radix_cache <- mamba_radix_cache <- common; hicache (``memory_pool_host`` <- ``cache_controller``
<- ``hiradix_cache``, which uses base_prefix_cache, evict_policy, radix_tree and request_flows).
Errors: ``kvlab.errors``.
"""

from __future__ import annotations

from kvlab.lazy import lazy_exports

_EXPORTS = {  # module -> the names the package re-exports from it, imported on first use (see __getattr__)
    "kvlab.errors": ("DoubleFreeError", "InvariantError", "LockRefError"),
    "kvlab.mem_cache.options": ("EVICTION_MODES", "WRITE_POLICIES", "host_pool_size"),  # no torch
    "kvlab.mem_cache.base_prefix_cache": ("BasePrefixCache", "EvictParams", "EvictResult", "HybridEvictResult",
                                          "InsertResult", "LogicalClock", "MatchResult", "PrefixNode",
                                          "TreeLock"),  # no torch
    "kvlab.mem_cache.allocator": ("BaseTokenToKVPoolAllocator", "KVAllocator", "PagedTokenToKVPoolAllocator",
                                  "TokenToKVPoolAllocator"),
    "kvlab.mem_cache.swa_allocator": ("SWATokenToKVPoolAllocator",),
    "kvlab.mem_cache.hicache.cache_controller": ("HiCacheController",),
    "kvlab.mem_cache.common": ("AllocResult", "MatchAllocInsertResult", "alloc_paged_token_slots_decode",
                               "alloc_paged_token_slots_extend", "alloc_token_slots", "ensure_mamba_capacity",
                               "evict_from_tree_cache", "match_alloc_insert", "release_kv_cache"),
    "kvlab.mem_cache.evict_policy": ("EVICTION_POLICIES", "EvictionStrategy", "get_eviction_strategy",
                                     "register_policy"),
    "kvlab.mem_cache.hicache.hiradix_cache": ("HiRadixCache",),
    "kvlab.mem_cache.hicache.results": ("HiEvictResult", "HiMatchResult", "LoadBackResult"),
    "kvlab.mem_cache.hicache.tree_node": ("HiTreeNode",),
    "kvlab.mem_cache.mamba_radix_cache": ("MambaEvictParams", "MambaInsertResult", "MambaPool", "MambaRadixCache"),
    "kvlab.mem_cache.memory_pool": ("MHATokenToKVPool", "ReqToTokenPool"),
    "kvlab.mem_cache.hicache.memory_pool_host": ("HostKVCache",),
    "kvlab.mem_cache.radix_cache": ("RadixCache", "TreeNode"),
    "kvlab.mem_cache.request_flows": ("Req", "SimpleReq"),
    "kvlab.mem_cache.radix_tree": ("BaseRadixTree",),
    "kvlab.mem_cache.swa_radix_cache": ("HybridTreeNode", "SWARadixCache", "SWATreeLock"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "HiCacheController",
    "HiEvictResult",
    "HiMatchResult",
    "HiRadixCache",
    "HiTreeNode",
    "HostKVCache",
    "LoadBackResult",
    "WRITE_POLICIES",
    "host_pool_size",
    "BasePrefixCache",
    "BaseRadixTree",
    "PrefixNode",
    "HybridEvictResult",
    "HybridTreeNode",
    "MambaEvictParams",
    "MambaInsertResult",
    "MambaPool",
    "MambaRadixCache",
    "SWARadixCache",
    "SWATreeLock",
    "ensure_mamba_capacity",
    "AllocResult",
    "BaseTokenToKVPoolAllocator",
    "DoubleFreeError",
    "EVICTION_MODES",
    "EVICTION_POLICIES",
    "EvictParams",
    "EvictResult",
    "EvictionStrategy",
    "InsertResult",
    "InvariantError",
    "KVAllocator",
    "LockRefError",
    "LogicalClock",
    "MHATokenToKVPool",
    "MatchResult",
    "PagedTokenToKVPoolAllocator",
    "RadixCache",
    "Req",
    "ReqToTokenPool",
    "SWATokenToKVPoolAllocator",
    "SimpleReq",
    "TokenToKVPoolAllocator",
    "TreeLock",
    "TreeNode",
    "alloc_paged_token_slots_decode",
    "alloc_paged_token_slots_extend",
    "alloc_token_slots",
    "evict_from_tree_cache",
    "match_alloc_insert",
    "MatchAllocInsertResult",
    "get_eviction_strategy",
    "register_policy",
    "release_kv_cache",
]
