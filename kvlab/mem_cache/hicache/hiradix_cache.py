"""The hierarchical radix cache: a device tree (L1) whose nodes may also, or only, live in a host pool (L2).

Mirrors SGLang 0.5.16's ``sglang/srt/mem_cache/hiradix_cache.py::HiRadixCache`` op for op (the differential test
``tests/mem_cache/test_differential_hicache.py`` runs SGLang's own class against it). This module holds the class,
its match, insert, request flows and locks over slot tensors; the rest of the upstream class is mixed in from beside
it, what the page engine's two-tier tree shares written once (the walks: ``two_tier_core``; the moves between tiers:
``two_tier_moves``, over ``tier_moves``' copies and frees of slots; the leaf indexes: ``leaf_index``), and the
check (``invariants``). Each node holds
``value`` (device slots, None once evicted from the device) and ``host_value`` (host slots, None until backed
up)::

    residency     value      host_value   counted in            evictable from
    device only   slots      None         evictable/protected   device (destroyed, or written first: write_back)
    both          slots      slots        evictable/protected   device (demoted to host-only, no copy needed)
    host only     None       slots        host pool only        host (when a host leaf), or loaded back

Device residency is closed under prefixes (a node on the device has its whole path on the device); a node on
neither tier is deleted. Write policies (``--hicache-write-policy``):

- ``write_through``: every insert backs the node up at once (its hit count reaches the threshold 1);
- ``write_through_selective``: a node is backed up on its second hit (threshold 2);
- ``write_back``: nothing is backed up until device eviction, which writes an unbacked leaf to host first and
  frees its device slots only after the copy (the eviction waits for it); if the host pool is full even after
  host eviction, the leaf and its host-only subtree are dropped.

Under the write-through policies a backup is taken only when the parent is backed up (backups form a prefix
from the root), and the node stays locked (``lock_ref``) until its copy is acknowledged: an in-flight node
cannot be evicted. A load-back locks the node it ends at until its copy is acknowledged. Copies complete on the
controller's modelled clock (:meth:`HiRadixCache.advance` / :meth:`HiRadixCache.poll`), never at issue.

Differs on purpose:

- ``load_back_evict_mode``: how much a load-back evicts when the device pool is short. ``"shortfall"`` (0.5.23,
  ``UnifiedRadixCache._load_back_transfers``): ``needed - available``, before the allocation. ``"full"`` (0.5.16,
  ``HiRadixCache.load_back``): try to allocate, and on failure evict the whole load (finding 2's bug, here).
- Time is the cache's :class:`~kvlab.mem_cache.radix_tree.LogicalClock` (one tick wherever 0.5.16 reads
  ``time.monotonic()``); victim ties break by node id. Transfer time is a separate, modelled clock in seconds.
- 0.5.16 heapifies every evictable leaf on each ``evict`` / ``evict_host`` call; here each tier keeps one heap of
  its leaves across calls (a leaf is pushed again when its sort key changes, stale entries are skipped on pop), so
  a call costs what it evicts. The victims and their order are 0.5.16's (the sort key ends in the node id).
- ``structure_version`` moves with every change a match reads (a node made or deleted, device or host slots set or
  dropped); while it stands, a caller may replay a match of the same key instead of walking it
  (:meth:`HiRadixCache.restamp_path`: the walk's clock reads and heap refreshes; :meth:`HiRadixCache.match_ends`: the
  tiers' ends and the host hit). The scheduler's fast path does (``SchedulerKV.match``).
- ``cache_unfinished_req`` hands ``prefix_indices`` over as the path's slots, concatenated when first read (a
  request with ``defer_prefix_indices``), and rewrites the request's row only where the tree's slots differ.
- Insert walks the path a request holds locked (``cache_unfinished_req`` / ``cache_finished_req``) without looking
  its children up or comparing their tokens again; the effects on each node are the same.
- Locking an evicted or foreign node, or unlocking an unlocked one, raises :class:`LockRefError`.
- The storage tier (L3) is :mod:`~kvlab.mem_cache.hicache.storage_moves`' (off unless ``attach_storage``); no KV
  events, metrics or EAGLE bigram keys; ``match_prefix`` and ``insert`` take plain token sequences.
"""

from __future__ import annotations

from array import array

import numpy as np
import torch

from kvlab.errors import require
from kvlab.mem_cache.base_prefix_cache import KVAllocator, TokenKey
from kvlab.mem_cache.hicache.cache_controller import (
    DEFAULT_HOST_DEVICE_BYTES_PER_S,
    CacheOperation,
    HiCacheController,
)
from kvlab.mem_cache.hicache.invariants import HiInvariants
from kvlab.mem_cache.hicache.leaf_index import HiLeafIndex
from kvlab.mem_cache.hicache.memory_pool_host import HostKVCache
from kvlab.mem_cache.hicache.results import HiEvictResult, HiMatchResult, LoadBackResult
from kvlab.mem_cache.hicache.storage_moves import StorageMoves
from kvlab.mem_cache.hicache.tier_moves import TierMoves
from kvlab.mem_cache.hicache.tree_node import HiTreeNode
from kvlab.mem_cache.hicache.two_tier_core import TwoTierCore
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.radix_tree import BaseRadixTree, LogicalClock, as_tokens, common_prefix_len
from kvlab.mem_cache.request_flows import RequestFlows
from kvlab.mem_cache.shortfall import EVICTION_MODES, check_mode
from kvlab.mem_cache.tree_core import LeafIndex
from kvlab.units import align_down

_I64 = torch.int64
LOAD_BACK_EVICT_MODES = EVICTION_MODES  # the load-back's rule is finding 2's (kvlab.mem_cache.shortfall)


def _own(slots: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A copy of ``slots`` as an int64 tensor (the tree's own, whatever the caller's dtype). A request's row is
    int32: insert slices it as a numpy view (:func:`_slot_source`), whose conversion costs half of ``Tensor.to``'s."""
    if isinstance(slots, np.ndarray):
        return torch.from_numpy(slots.astype(np.int64))
    return slots.clone() if slots.dtype == _I64 else slots.to(_I64)


def _slot_source(value: torch.Tensor) -> torch.Tensor | np.ndarray:
    """What insert slices the caller's slots from: a CPU tensor of another dtype as its numpy view (same memory;
    slicing it costs a fraction of a torch slice), any other as it is."""
    return value.numpy() if value.dtype != _I64 and value.device.type == "cpu" else value


class HiRadixCache(RequestFlows, TierMoves, StorageMoves, TwoTierCore, HiLeafIndex, HiInvariants, BaseRadixTree):
    """SGLang 0.5.16's ``HiRadixCache``: a radix tree over a device allocator and a host pool.

    ``token_to_kv_pool_host``: the L2 pool (:class:`HostKVCache`); ``write_policy``: one of
    ``cache_controller.WRITE_POLICIES``; ``load_back_evict_mode``: ``"shortfall"`` (0.5.23) or ``"full"``
    (0.5.16), see the module docstring; ``d2h_bytes_per_s`` / ``h2d_bytes_per_s`` / ``transfer_latency_s``:
    the modelled copy speed (``cache_controller.HiCacheController``); ``load_back_threshold``: loads of fewer
    tokens are skipped (SGLang's 10)."""

    def __init__(self, req_to_token_pool: ReqToTokenPool | None, token_to_kv_pool_allocator: KVAllocator,
                 token_to_kv_pool_host: HostKVCache, page_size: int = 1, write_policy: str = "write_through",
                 eviction_policy: str = "lru", eviction_policy_config: dict | None = None,
                 load_back_evict_mode: str = "shortfall", d2h_bytes_per_s: float = DEFAULT_HOST_DEVICE_BYTES_PER_S,
                 h2d_bytes_per_s: float = DEFAULT_HOST_DEVICE_BYTES_PER_S, transfer_latency_s: float = 0.0,
                 load_back_threshold: int = 10):
        if token_to_kv_pool_allocator is None:
            raise ValueError("HiRadixCache needs a device allocator (load-backs allocate device slots)")
        if token_to_kv_pool_host.page_size != page_size:
            raise ValueError(f"HiRadixCache page_size {page_size} does not fit the host pool's page_size "
                             f"{token_to_kv_pool_host.page_size}")
        check_mode(load_back_evict_mode, "HiRadixCache load_back_evict_mode")
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, "HiRadixCache")
        self.token_to_kv_pool_host = token_to_kv_pool_host
        self.cache_controller = HiCacheController(token_to_kv_pool_allocator, token_to_kv_pool_host, write_policy,
                                                  d2h_bytes_per_s, h2d_bytes_per_s, transfer_latency_s)
        self.write_policy = write_policy
        self.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = load_back_threshold
        self.load_back_evict_mode = load_back_evict_mode
        self._priority_of = self._use_policy(eviction_policy, eviction_policy_config)
        self.reset()

    def reset(self) -> None:
        # Bumped whenever anything a match walk reads changes: a node made (splits included) or deleted, a node's
        # device or host slots set or dropped (eviction, demotion, backup, load-back, host eviction, a host-only
        # node adopting recomputed slots). Equal versions mean a match of the same key would visit the same
        # nodes and find the same device and host prefix, so a caller may replay its side effects
        # (:meth:`restamp_path`). Locks (copies completing) are not read by a match.
        self._reset_core(self._priority_of)  # (tree_core: a new version, the device-leaf index, the counters)
        self.cache_controller.reset()
        self.token_to_kv_pool_host.clear()
        self.clock = LogicalClock()
        self._empty = torch.empty(0, dtype=_I64)
        self.root_node = self._new_node(array("q"), self._empty, None, priority=-(2**63))
        self.root_node.host_value = self._empty  # the root counts as backed up (SGLang: host_value = [])
        self.root_node.lock_ref = 1
        self.host_leaf_index = LeafIndex(self._priority_of)  # the host tier's (tree_core's LeafIndex, as the device's)
        # in-flight copies: write op -> the node it locks (None under write_back); load op -> the node it locks
        self.ongoing_write_through: dict[int, tuple[CacheOperation, HiTreeNode | None]] = {}
        self.ongoing_load_back: dict[int, tuple[CacheOperation, HiTreeNode]] = {}
        self.host_evicted_tokens = 0  # running total of host copies freed by host eviction
        self._reset_storage()  # (storage_moves: prefetches and backups in flight; the store itself is kept)

    def _key_of(self, key: array, off: int = 0):
        return key[off] if self.page_size == 1 else key[off : off + self.page_size].tobytes()

    # -- match ---------------------------------------------------------------------------------------
    def match_prefix(self, key: TokenKey) -> HiMatchResult:
        """Longest cached prefix of ``key`` (whole pages) on either tier. Splits the node the match ends inside and
        stamps each node on the path (``_match_prefix_helper``: a fresh clock read per node)."""
        key = as_tokens(key)
        n = align_down(len(key), self.page_size)
        if n == 0:
            return HiMatchResult(self._empty, self.root_node, 0, self.root_node, 0)
        values: list[torch.Tensor] = []
        end, _ = self.match_walk(key, n, values)
        node, last_host, host_hit = self.match_ends(end)
        device = torch.cat(values) if values else self._empty
        return HiMatchResult(device, node, int(device.shape[0]), last_host, host_hit)

    def _split_len(self, ckey: array, key: array, off: int, n: int) -> int:
        """Where a walk splits a node whose key ``ckey`` diverges from ``key[off:n]``: the common prefix, whole pages."""
        return align_down(common_prefix_len(ckey, key, off, n), self.page_size)

    def _split_node(self, child: HiTreeNode, split_len: int) -> HiTreeNode:
        """``child`` -> ``upper[:split_len]`` -> ``child[split_len:]``, both tiers' slots split alike."""
        parent = child.parent
        ck = self._key_of(child.key)
        upper = self._new_node(child.key[:split_len], None, parent, child.priority)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        if child.value is not None:
            upper.value = child.value[:split_len].clone()
            child.value = child.value[split_len:].clone()
        if child.host_value is not None:  # host slots stay slices of the host pool's table (its free reads them so)
            upper.host_value = child.host_value[:split_len]
            child.host_value = child.host_value[split_len:]
        if child.hash_value is not None:  # storage keys, one per page (split_node_hash_value)
            upper.hash_value, child.hash_value = (child.hash_value[: split_len // self.page_size],
                                                  child.hash_value[split_len // self.page_size :])
        child.key = child.key[split_len:]
        child.parent = upper
        upper.children[self._key_of(child.key)] = child
        parent.children[ck] = upper
        return upper

    # -- insert --------------------------------------------------------------------------------------
    # insert_slots is BaseRadixTree's: insert, then free the caller's duplicates (device-resident nodes always form
    # the top of a path, so the prefix insert reports as already on the device is one run from the root)
    tree_words = "a two-tier radix tree"

    def insert(self, key: TokenKey, value: torch.Tensor | None = None, priority: int = 0, chunked: bool = False) -> int:
        """Cache ``key`` (whole pages) with device slots ``value``. Returns the length of the prefix that was
        already on the device: the caller frees its own slots for it. A matched node that is host-only takes the
        caller's slots instead (recomputed KV; the node is then on both tiers) and does not count in the return.
        Under the write-through policies a node whose hit count reaches the threshold is backed up."""
        key = as_tokens(key)
        return self._insert(key, align_down(len(key), self.page_size), value, priority, chunked)[0]

    def _insert(self, key: array, n: int, value: torch.Tensor | None, priority: int, chunked: bool,
                held: HiTreeNode | None = None, held_len: int = 0) -> tuple[int, HiTreeNode]:
        """:meth:`insert` of ``key[:n]`` (``n`` page-aligned), also returning the node it ends at (the root for
        an empty key). ``held``: the node a request holds locked, whose path spells ``key[:held_len]`` (matched or
        inserted from its own tokens): the walk over that path does what the loop does to each node it matches
        whole, without looking the children up or comparing their tokens again."""
        if value is None:
            value = torch.tensor(key[:n].tolist(), dtype=_I64)
        elif not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value, dtype=_I64)
        if value.shape[0] < n:
            raise ValueError(f"insert: {value.shape[0]} values for a key of {n} (page-aligned) tokens")
        src = _slot_source(value)  # a request's row is int32: only the slices the tree keeps are copied (_own)
        return self._insert_walk(key, n, src, priority, chunked, held, held_len)

    def _device_value(self, src: torch.Tensor | np.ndarray, start: int, end: int) -> torch.Tensor:
        """The device slots a node of ``key[start:end]`` takes from the caller's (insert's ``src``): its own copy."""
        return _own(src[start:end])

    # -- request flows (0.5.16's RadixCache.cache_finished_req / cache_unfinished_req, which HiRadixCache inherits
    # and runs over its own insert and match_prefix; cache_finished_req is request_flows.RequestFlows') -------------
    def _insert_finished(self, tokens: array, key_len: int, row: torch.Tensor, priority: int, req) -> int:
        return self._insert(tokens, key_len, row, priority, False, req.last_node, req.cache_protected_len)[0]

    def cache_unfinished_req(self, req, chunked: bool = False) -> None:
        """After a prefill (chunk): insert ``fill_ids``' page-aligned KV (``chunked``: no hit counted, so no
        write-through), free the duplicates, re-match, point the row at the tree's slots from
        ``cache_protected_len`` on, and move the request's lock to the node the key ends at. A partial last page
        stays the request's (in ``prefix_indices``, not the tree).

        The row is rewritten over ``[cache_protected_len, already_cached)`` only: from the prefix insert found on
        the device on (device residency is closed under prefixes, so every later node of the path is one this
        insert made or a host-only one that adopted the request's slots), the tree holds the row's own slots, and
        SGLang's write of them changes nothing. ``prefix_indices`` is handed over as the path's runs to a request
        with ``defer_prefix_indices`` (the simulator's ``SimReq``), as :class:`RadixCache` does."""
        tokens = as_tokens(req.fill_ids)
        n_tok = len(tokens)
        idx = req.req_pool_idx
        row = self.req_to_token_pool.req_to_token[idx]
        key_len = align_down(n_tok, self.page_size)
        free, view = self._row_freeing(row, idx)
        protected = req.cache_protected_len
        done, last = self._insert(tokens, key_len, row, getattr(req, "priority", 0) or 0, chunked, req.last_node,
                                  protected)
        free(view[protected:done])
        values = self.rematch(last, []) if key_len else []  # (TwoTierCore: insert's key walked again)
        found = sum(v.shape[0] for v in values)
        require(found == key_len, "cache_unfinished_req: the re-match finds every token just inserted on the device",
                found=found, inserted=key_len)
        if done > protected:  # req_to_token[protected:done] = the tree's slots (their duplicates were just freed)
            pos, write = 0, self.req_to_token_pool.write
            for v in values:
                end = pos + v.shape[0]
                if end > protected:
                    lo = max(pos, protected)
                    write((idx, slice(lo, min(end, done))), v[lo - pos : min(end, done) - pos])
                if end >= done:
                    break
                pos = end
        if key_len < n_tok:  # copied: the row's later positions change
            tail = view[key_len:n_tok]
            values.append(torch.from_numpy(tail.astype(np.int64)) if view is not row else tail.to(_I64))
        req.cache_protected_len = key_len
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(last)
        defer = getattr(req, "defer_prefix_indices", None)
        if defer is not None:  # the request concatenates the path's slots when (if ever) it reads prefix_indices
            defer(values)
        else:
            req.prefix_indices = torch.cat(values) if values else self._empty
        req.last_node = last

    # -- locks: tree_core's inc_lock_ref / dec_lock_ref (a locked node is on the device, so never a host leaf) -------
    gone_words = "is not on the device"  # (BaseRadixTree._lock_guard: only a device node is locked)

    # -- sizes and views -----------------------------------------------------------------------------
    def host_size(self) -> int:
        """Tokens with a host copy (both tiers or host only)."""
        return sum(len(x.host_value) for x in self.nodes() if x is not self.root_node and x.host_value is not None)

    def all_values_flatten(self) -> torch.Tensor:
        values = [x.value for x in self.nodes() if x is not self.root_node and x.value is not None]
        return torch.cat(values) if values else self._empty

    def _node_note(self, node: HiTreeNode) -> str:
        return "" if node is self.root_node else f" {node.residency}"


__all__ = ["HiEvictResult", "HiMatchResult", "HiRadixCache", "HiTreeNode", "LOAD_BACK_EVICT_MODES", "LoadBackResult"]
