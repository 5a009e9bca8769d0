"""SGLang's KV memory subsystem, re-implemented with SGLang's names so learners can grep upstream.

- ``memory_pool``: ``ReqToTokenPool`` (request rows), ``MHATokenToKVPool`` (per-layer K/V buffers).
- ``allocator``: which KV slots are free (``TokenToKVPoolAllocator``, ``PagedTokenToKVPoolAllocator``,
  ``SWATokenToKVPoolAllocator``, all kept to one protocol, ``KVAllocator``).
- ``base_prefix_cache``: the contract every prefix cache keeps (``BasePrefixCache``) and its
  request/result types (``MatchResult``, ``InsertResult``, ``EvictParams``, ``EvictResult``).
- ``radix_tree``: the tree mechanics the three trees share (``BaseRadixTree``).
- ``radix_cache`` + ``evict_policy``: the prefix tree, its locks and whole-leaf eviction.
- ``swa_radix_cache`` / ``mamba_radix_cache``: hybrid trees (SWA tombstones; recurrent-state slots).
- ``memory_pool_host`` / ``cache_controller`` / ``hiradix_cache``: HiCache's host tier (L2): the host pool
  (``HostKVCache``, sized as SGLang sizes it), copies timed on a modelled clock (``HiCacheController``), and the
  two-tier tree (``HiRadixCache``: write policies, demotion, host eviction, load-back).
- ``common``: evict-then-allocate, with the shortfall / full eviction toggle, and
  ``match_alloc_insert`` (match -> lock -> evict + allocate -> insert -> free duplicates -> unlock).

Imports point one way: memory_pool <- allocator <- base_prefix_cache <- evict_policy, radix_tree
<- radix_cache, swa_radix_cache <- mamba_radix_cache <- common; memory_pool_host <- cache_controller <-
hiradix_cache (which uses base_prefix_cache, evict_policy and radix_tree, not radix_cache). Errors: ``kvlab.errors``.
"""

from kvlab.errors import DoubleFreeError, InvariantError, LockRefError
from kvlab.mem_cache.allocator import (
    BaseTokenToKVPoolAllocator,
    KVAllocator,
    PagedTokenToKVPoolAllocator,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from kvlab.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    EvictParams,
    EvictResult,
    HybridEvictResult,
    InsertResult,
    MatchResult,
    PrefixNode,
    TreeLock,
)
from kvlab.mem_cache.cache_controller import WRITE_POLICIES, HiCacheController
from kvlab.mem_cache.common import (
    EVICTION_MODES,
    AllocResult,
    MatchAllocInsertResult,
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
    alloc_token_slots,
    ensure_mamba_capacity,
    evict_from_tree_cache,
    match_alloc_insert,
    release_kv_cache,
)
from kvlab.mem_cache.evict_policy import EVICTION_POLICIES, EvictionStrategy, get_eviction_strategy, register_policy
from kvlab.mem_cache.hiradix_cache import HiEvictResult, HiMatchResult, HiRadixCache, HiTreeNode, LoadBackResult
from kvlab.mem_cache.mamba_radix_cache import MambaEvictParams, MambaInsertResult, MambaPool, MambaRadixCache
from kvlab.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from kvlab.mem_cache.memory_pool_host import HostKVCache, host_pool_size
from kvlab.mem_cache.radix_cache import RadixCache, Req, SimpleReq, TreeNode
from kvlab.mem_cache.radix_tree import BaseRadixTree, LogicalClock
from kvlab.mem_cache.swa_radix_cache import HybridTreeNode, SWARadixCache, SWATreeLock

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
