"""The hierarchical radix cache: a device tree (L1) whose nodes may also, or only, live in a host pool (L2).

Mirrors SGLang 0.5.16's ``sglang/srt/mem_cache/hiradix_cache.py::HiRadixCache`` op for op (the differential test
``tests/mem_cache/test_differential_hicache.py`` runs SGLang's own class against it). Each node holds
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
- No storage tier (L3), prefetch, KV events, metrics, hash values or EAGLE bigram keys; ``match_prefix`` and
  ``insert`` take plain token sequences.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import torch

from kvlab.errors import InvariantError, LockRefError, require
from kvlab.mem_cache.base_prefix_cache import (
    EvictParams,
    EvictResult,
    KVAllocator,
    TokenKey,
)
from kvlab.mem_cache.cache_controller import DEFAULT_HOST_DEVICE_BYTES_PER_S, CacheOperation, HiCacheController
from kvlab.mem_cache.evict_policy import get_eviction_strategy
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.memory_pool_host import HostKVCache
from kvlab.mem_cache.radix_cache import RequestFlows
from kvlab.mem_cache.radix_tree import BaseRadixTree, LogicalClock, as_tokens, common_prefix_len
from kvlab.mem_cache.shortfall import EVICTION_MODES, over_evicted_tokens, shortfall_tokens, tokens_to_evict
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


class HiTreeNode:
    """One edge of the hierarchical tree (0.5.16's ``TreeNode`` with its HiCache fields).

    ``value``: device slots or None (``evicted``); ``host_value``: host slots or None (``backuped``);
    ``host_ref_counter``: holds that keep the host copy from host eviction (a load-back reading it, a write-back
    staging it)."""

    __slots__ = ("children", "parent", "key", "value", "host_value", "lock_ref", "host_ref_counter",
                 "last_access_time", "creation_time", "hit_count", "priority", "id", "_dver", "_hver")

    def __init__(self, key: array, value: torch.Tensor | None, parent: HiTreeNode | None, clock: LogicalClock,
                 node_id: int, priority: int = 0):
        self.children: dict = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.host_value: torch.Tensor | None = None
        self.lock_ref = 0
        self.host_ref_counter = 0
        self.last_access_time = clock.tick()  # two reads of the clock, as TreeNode.__init__ does
        self.creation_time = clock.tick()
        self.hit_count = 0
        self.priority = priority
        self.id = node_id
        self._dver = 0  # version of this node's live entry in the device-leaf heap (HiRadixCache._dheap)
        self._hver = 0  # ... and in the host-leaf heap (HiRadixCache._hheap)

    @property
    def evicted(self) -> bool:
        return self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    def protect_host(self) -> None:
        self.host_ref_counter += 1

    def release_host(self) -> None:
        if self.host_ref_counter <= 0:
            raise LockRefError(f"release_host: {self!r} holds no host protection")
        self.host_ref_counter -= 1

    @property
    def residency(self) -> str:
        """``"device"``, ``"both"`` or ``"host"``."""
        if self.value is None:
            return "host"
        return "device" if self.host_value is None else "both"

    def __repr__(self) -> str:
        head = list(self.key[:6])
        more = "..." if len(self.key) > 6 else ""
        return f"HiTreeNode(id={self.id}, key={head}{more} ({len(self.key)}), {self.residency}, lock_ref={self.lock_ref})"


class HiMatchResult(NamedTuple):
    """``match_prefix``'s answer (0.5.16's ``MatchResult`` with its host fields).

    ``device_indices`` / ``last_device_node`` / ``device_prefix_len``: the prefix on the device (lock
    ``last_device_node`` to pin it); ``last_host_node``: the deepest matched node with a host copy (where a
    load-back starts, SGLang's ``best_match_node``); ``host_hit_length``: matched tokens that are on host only,
    below ``last_device_node``."""

    device_indices: torch.Tensor
    last_device_node: HiTreeNode
    device_prefix_len: int
    last_host_node: HiTreeNode
    host_hit_length: int

    @property
    def prefix_len(self) -> int:
        return self.device_prefix_len

    @property
    def best_match_node(self) -> HiTreeNode:
        return self.last_host_node


@dataclass(frozen=True)
class HiEvictResult(EvictResult):
    """:class:`EvictResult` (device tokens) split by what became of them: ``demoted_tokens`` left the device but
    stay on host (already backed up, or written back first: ``written_back_tokens``), ``destroyed_tokens`` are
    gone from both tiers (``evicted = demoted + destroyed``); ``host_evicted_tokens``: host copies freed to make
    room for write-backs."""

    demoted_tokens: int = 0
    written_back_tokens: int = 0
    destroyed_tokens: int = 0
    host_evicted_tokens: int = 0


class LoadBackResult(NamedTuple):
    """What :meth:`HiRadixCache.load_back` did. ``device_indices``: the new device slots of the loaded tokens
    (None when nothing was loaded; ``reason`` says why: ``"below_threshold"``, ``"over_quota"``,
    ``"device_full"``); ``evict``: the device eviction it ran to make room (empty when none was needed)."""

    device_indices: torch.Tensor | None
    evict: EvictResult
    reason: str | None = None

    @property
    def loaded_tokens(self) -> int:
        return 0 if self.device_indices is None else int(self.device_indices.shape[0])


_NO_EVICT = EvictResult()


class HiRadixCache(RequestFlows, BaseRadixTree):
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
        if load_back_evict_mode not in LOAD_BACK_EVICT_MODES:
            raise ValueError(f"load_back_evict_mode must be 'shortfall' (SGLang 0.5.23) or 'full' (0.5.16), "
                             f"got {load_back_evict_mode!r}")
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, "HiRadixCache")
        self.token_to_kv_pool_host = token_to_kv_pool_host
        self.cache_controller = HiCacheController(token_to_kv_pool_allocator, token_to_kv_pool_host, write_policy,
                                                  d2h_bytes_per_s, h2d_bytes_per_s, transfer_latency_s)
        self.write_policy = write_policy
        self.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = load_back_threshold
        self.load_back_evict_mode = load_back_evict_mode
        self.eviction_policy = eviction_policy.lower()
        self.eviction_strategy = get_eviction_strategy(self.eviction_policy, eviction_policy_config)
        self._priority_of = self.eviction_strategy.get_priority
        self.reset()

    def reset(self) -> None:
        # Bumped whenever anything a match walk reads changes: a node made (splits included) or deleted, a node's
        # device or host slots set or dropped (eviction, demotion, backup, load-back, host eviction, a host-only
        # node adopting recomputed slots). Equal versions mean a match of the same key would visit the same
        # nodes and find the same device and host prefix, so a caller may replay its side effects
        # (:meth:`restamp_path`). Locks (copies completing) are not read by a match.
        self.structure_version = getattr(self, "structure_version", 0) + 1
        self.cache_controller.reset()
        self.token_to_kv_pool_host.clear()
        self.clock = LogicalClock()
        self._next_id = 0
        self._empty = torch.empty(0, dtype=_I64)
        self.root_node = self._new_node(array("q"), self._empty, None, priority=-(2**63))
        self.root_node.host_value = self._empty  # the root counts as backed up (SGLang: host_value = [])
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves: set[HiTreeNode] = set()
        self.evictable_host_leaves: set[HiTreeNode] = set()
        # one long-lived heap per tier over its leaf set (see "the leaf indexes" below)
        self._dheap: list = []
        self._hheap: list = []
        self._evicting = self._host_evicting = False
        # in-flight copies: write op -> the node it locks (None under write_back); load op -> the node it locks
        self.ongoing_write_through: dict[int, tuple[CacheOperation, HiTreeNode | None]] = {}
        self.ongoing_load_back: dict[int, tuple[CacheOperation, HiTreeNode]] = {}
        self.host_evicted_tokens = 0  # running total of host copies freed by host eviction

    def _new_node(self, key: array, value: torch.Tensor | None, parent: HiTreeNode | None,
                  priority: int = 0) -> HiTreeNode:
        node = HiTreeNode(key, value, parent, self.clock, self._next_id, priority)
        self._next_id += 1
        self.structure_version += 1
        return node

    def _key_of(self, key: array, off: int = 0):
        return key[off] if self.page_size == 1 else key[off : off + self.page_size].tobytes()

    def nodes(self):
        """Every node, the root first (depth-first)."""
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _prio(self, node: HiTreeNode) -> tuple:
        return (self._priority_of(node), node.last_access_time, node.id)

    # -- the leaf indexes (device leaves, host leaves) ------------------------------------------------
    # Each tier's evictable leaves are a set (membership) and a heap of (priority, last_access_time, id, version,
    # node) entries kept across calls. SGLang 0.5.16 heapifies every leaf on each evict / evict_host call; here a
    # node is pushed when it joins the set and again whenever a field of its sort key changes while it is in it
    # (``_touch``), and an entry is live only while the node is in the set with the entry's version (lazy
    # deletion: stale entries are skipped on pop, and the heap is rebuilt from the set when they outnumber the live
    # ones, never during an eviction). The sort key ends in the unique node id, so pops come out in exactly the
    # order a fresh heapify would give.
    def _push_dev(self, node: HiTreeNode) -> None:
        node._dver += 1
        heap = self._dheap
        heapq.heappush(heap, (self._priority_of(node), node.last_access_time, node.id, node._dver, node))
        if len(heap) > 2 * len(self.evictable_leaves) + 64 and not self._evicting:
            self._dheap = self._rebuild(self.evictable_leaves, "_dver")

    def _push_host(self, node: HiTreeNode) -> None:
        node._hver += 1
        heap = self._hheap
        heapq.heappush(heap, (self._priority_of(node), node.last_access_time, node.id, node._hver, node))
        if len(heap) > 2 * len(self.evictable_host_leaves) + 64 and not self._host_evicting:
            self._hheap = self._rebuild(self.evictable_host_leaves, "_hver")

    def _rebuild(self, leaves: set[HiTreeNode], ver: str) -> list:
        heap = []
        for n in leaves:
            v = getattr(n, ver) + 1
            setattr(n, ver, v)
            heap.append((self._priority_of(n), n.last_access_time, n.id, v, n))
        heapq.heapify(heap)
        return heap

    def _touch(self, node: HiTreeNode) -> None:
        """``node``'s sort key changed (access time, hit count, priority): a leaf gets a fresh heap entry."""
        if node in self.evictable_leaves:
            self._push_dev(node)
        if node in self.evictable_host_leaves:
            self._push_host(node)

    @staticmethod
    def _pop(heap: list, leaves: set, ver: str) -> HiTreeNode | None:
        """The next leaf of ``leaves`` by sort key from its tier's ``heap``, skipping stale entries (an entry is live
        while its version is the node's ``ver`` and the node is still a leaf)."""
        while heap:
            entry = heapq.heappop(heap)
            node = entry[4]
            if entry[3] == getattr(node, ver) and node in leaves:
                return node
        return None

    def _update_leaf_status(self, node: HiTreeNode) -> None:
        """A device leaf: on the device, unlocked, and no child on the device."""
        leaf = node.value is not None and node.lock_ref <= 0
        if leaf:
            for c in node.children.values():
                if c.value is not None:
                    leaf = False
                    break
        if not leaf:
            self.evictable_leaves.discard(node)
        elif node not in self.evictable_leaves:
            self.evictable_leaves.add(node)
            self._push_dev(node)

    def _update_host_leaf_status(self, node: HiTreeNode) -> None:
        """A host leaf: host-only, unlocked, and no child with a host copy."""
        leaf = node.value is None and node.lock_ref <= 0
        if leaf:
            for c in node.children.values():
                if c.host_value is not None:
                    leaf = False
                    break
        if not leaf:
            self.evictable_host_leaves.discard(node)
        elif node not in self.evictable_host_leaves:
            self.evictable_host_leaves.add(node)
            self._push_host(node)

    # -- match ---------------------------------------------------------------------------------------
    def match_prefix(self, key: TokenKey) -> HiMatchResult:
        """Longest cached prefix of ``key`` (whole pages) on either tier. Splits the node the match ends inside and
        stamps each node on the path (``_match_prefix_helper``: a fresh clock read per node)."""
        key = as_tokens(key)
        n = align_down(len(key), self.page_size)
        if n == 0:
            return HiMatchResult(self._empty, self.root_node, 0, self.root_node, 0)
        values, end = self._match_walk(key, n)
        node, last_host, host_hit = self.match_ends(end)
        device = torch.cat(values) if values else self._empty
        return HiMatchResult(device, node, int(device.shape[0]), last_host, host_hit)

    def match_ends(self, end: HiTreeNode) -> tuple[HiTreeNode, HiTreeNode, int]:
        """Where a match walk that ended at ``end`` (the deepest node it matched, on either tier) stops on each
        tier: ``(last_device_node, last_host_node, host_hit_length)`` as :class:`HiMatchResult` names them. The
        walk's end is ``last_host_node`` when ``host_hit_length`` is not 0, else ``last_device_node``."""
        node, host_hit = end, 0
        while node.value is None:
            host_hit += len(node.key)
            node = node.parent
        last_host = end
        while last_host.host_value is None:
            last_host = last_host.parent
        return node, last_host, host_hit

    def restamp_path(self, node: HiTreeNode, times: int = 1) -> None:
        """What ``times`` repeats of the match walk that ended at ``node`` do while :attr:`structure_version` is
        unchanged since it (the walk would visit the same nodes and split none): each reads the clock for the root
        and then for each node of the path, top down (``_match_walk``), so the clock moves ``times`` times the path
        length plus one and the path keeps the last walk's times; a node of the path that is a leaf of a tier gets
        a fresh heap entry (once: the earlier walks' entries would be stale)."""
        path, root = [], self.root_node
        while node is not root:
            path.append(node)
            node = node.parent
        clock = self.clock
        now = clock.now + (times - 1) * (len(path) + 1) + 1
        root.last_access_time = now
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        for x in reversed(path):
            now += 1
            x.last_access_time = now
            if x in leaves:
                self._push_dev(x)
            if x in host_leaves:
                self._push_host(x)
        clock.now = now

    def _match_walk(self, key: array, n: int) -> tuple[list[torch.Tensor], HiTreeNode]:
        tick, ps = self.clock.tick, self.page_size
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        node = self.root_node
        node.last_access_time = tick()
        values, off = [], 0
        while off < n:
            child = node.children.get(key[off] if ps == 1 else key[off : off + ps].tobytes())
            if child is None:
                break
            child.last_access_time = tick()
            if child in leaves:  # _touch: its sort key changed
                self._push_dev(child)
            if child in host_leaves:
                self._push_host(child)
            ckey = child.key
            m = len(ckey)
            if off + m > n or ckey != key[off : off + m]:
                node = self._split_node(child, align_down(common_prefix_len(ckey, key, off, n), ps))
                if node.value is not None:
                    values.append(node.value)
                break
            if child.value is not None:
                values.append(child.value)
            node = child
            off += m
        return values, node

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
        if n == 0:
            return 0, self.root_node
        node, off, prefix = self.root_node, 0, 0
        ps, tick = self.page_size, self.clock.tick
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        count_hits = not chunked and self.write_policy != "write_back"
        for child in (self._held_path(held, held_len) if 0 < held_len <= n else None) or ():
            child.last_access_time = tick()  # (on the device: a locked path)
            if priority > child.priority:
                child.priority = priority
            if child in leaves:
                self._push_dev(child)
            if child in host_leaves:
                self._push_host(child)
            node = child
            if count_hits:
                self._inc_hit_count(node)
            m = len(child.key)
            prefix += m
            off += m
        while off < n:
            child = node.children.get(key[off] if ps == 1 else key[off : off + ps].tobytes())
            if child is None:
                break
            child.last_access_time = tick()
            if priority > child.priority:
                child.priority = priority
            if child in leaves:  # _touch: its sort key changed
                self._push_dev(child)
            if child in host_leaves:
                self._push_host(child)
            ckey = child.key
            m = len(ckey)
            if off + m > n or ckey != key[off : off + m]:  # the key diverges (or ends) inside this edge: split it
                m = align_down(common_prefix_len(ckey, key, off, n), ps)
                node = self._split_node(child, m)
                if priority > node.priority:  # (the upper half: a new node, never a leaf)
                    node.priority = priority
            else:
                node = child
            if node.value is None:  # host-only: adopt the caller's (recomputed) slots
                node.value = _own(src[off : off + m])
                self.structure_version += 1
                self.evictable_size_ += m
                self._update_leaf_status(node)
                self._update_host_leaf_status(node)
                self._update_leaf_status(node.parent)
            else:
                if count_hits:
                    self._inc_hit_count(node)
                prefix += m
            off += m
        if off < n:
            leaf = self._new_node(key[off:n], _own(src[off:n]), node, priority)
            node.children[self._key_of(leaf.key)] = leaf
            self.evictable_size_ += n - off
            self._update_leaf_status(node)
            self._update_leaf_status(leaf)
            if count_hits:
                self._inc_hit_count(leaf)
            node = leaf
        return prefix, node

    # -- request flows (0.5.16's RadixCache.cache_finished_req / cache_unfinished_req, which HiRadixCache inherits
    # and runs over its own insert and match_prefix; cache_finished_req is radix_cache.RequestFlows') ----------------
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
        values = self._rematch(last, key_len)
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

    def _rematch(self, last: HiTreeNode, key_len: int) -> list[torch.Tensor]:
        """``match_prefix`` of the key that insert just made end at ``last``, without comparing its tokens again:
        the same walk (no split is possible, every node is on the device), the same clock reads (the root, then
        each node from the top); returns the device slots of the path, node by node."""
        if key_len == 0:
            return []
        path = []
        node = last
        while node is not self.root_node:
            path.append(node)
            node = node.parent
        tick, leaves = self.clock.tick, self.evictable_leaves
        self.root_node.last_access_time = tick()
        values = []
        for node in reversed(path):
            node.last_access_time = tick()
            if node in leaves:  # _touch (on the device: never a host leaf)
                self._push_dev(node)
            values.append(node.value)
        return values

    def _inc_hit_count(self, node: HiTreeNode, chunked: bool = False) -> None:
        if self.write_policy == "write_back" or chunked:
            return
        node.hit_count += 1
        self._touch(node)
        if node.host_value is None and node.hit_count >= self.write_through_threshold:
            self.write_backup(node)

    # -- backups (device -> host) ---------------------------------------------------------------------
    def write_backup(self, node: HiTreeNode, write_back: bool = False) -> int:
        """Copy ``node``'s device KV to fresh host slots (evicting host leaves once if the pool is full). Under the
        write-through policies only a node whose parent is backed up is copied, and it stays locked until the copy
        is acknowledged. Returns the tokens issued (0: not backed up)."""
        if not write_back and node.parent is not self.root_node and node.parent.host_value is None:
            return 0
        host = self.cache_controller.write(node.value, node.id)
        if host is None:
            self.evict_host(len(node.key))
            host = self.cache_controller.write(node.value, node.id)
            if host is None:
                return 0
        self.structure_version += 1
        node.host_value = host  # the host pool's slots (the copy's op holds the same tensor; neither writes to it)
        op = self.cache_controller.write_queue[-1]
        self.ongoing_write_through[id(op)] = (op, None if write_back else node)
        if not write_back:
            self.inc_lock_ref(node)
        return host.shape[0]

    def writing_check(self, write_back: bool = False) -> int:
        """Consume acknowledged backups (unlocking their nodes). ``write_back=True`` first waits for every issued
        copy (the clock jumps forward: ``cache_controller.totals.stall_s``). Returns the acks consumed."""
        ctl = self.cache_controller
        if write_back:
            ctl.wait_writes()
        acks, ctl.ack_write_queue = ctl.ack_write_queue, []
        for op in acks:
            _, lock_node = self.ongoing_write_through.pop(id(op), (op, None))
            if lock_node is not None:
                self.dec_lock_ref(lock_node)
        return len(acks)

    def loading_check(self) -> int:
        """Consume acknowledged load-backs (unlocking the node each one locked). Returns the acks consumed."""
        ctl = self.cache_controller
        acks, ctl.ack_load_queue = ctl.ack_load_queue, []
        for op in acks:
            _, node = self.ongoing_load_back.pop(id(op))
            self.dec_lock_ref(node)
        return len(acks)

    def check_hicache_events(self) -> None:
        """The scheduler's per-step poll (storage parts omitted): ``writing_check`` then ``loading_check``."""
        self.writing_check()
        self.loading_check()

    # -- the modelled clock ---------------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self.cache_controller.now_s

    def poll(self, now_s: float) -> None:
        """Move the transfer clock to ``now_s`` and complete every copy finished by then."""
        ctl = self.cache_controller
        ctl.poll(now_s)
        if ctl.ack_write_queue or ctl.ack_load_queue:  # check_hicache_events (which does nothing without acks)
            self.check_hicache_events()

    def advance(self, seconds: float) -> None:
        self.poll(self.now_s + seconds)

    def drain(self) -> float:
        """Advance until every issued copy is complete; returns the seconds that took."""
        start = self.now_s
        self.poll(self.cache_controller.drain_time())
        return self.now_s - start

    # -- locks ---------------------------------------------------------------------------------------
    def inc_lock_ref(self, node: HiTreeNode) -> int:
        """Lock ``node`` and its ancestors against device eviction. Returns the evictable-size delta (<= 0)."""
        if node is self.root_node:
            return 0
        self._check_member(node, "inc_lock_ref", "is not on the device")
        delta = 0
        root, leaves, host_leaves = self.root_node, self.evictable_leaves, self.evictable_host_leaves
        while node is not root:
            if node.lock_ref == 0:  # a locked node is no leaf of either tier (it is never in either index)
                n = len(node.key)
                self.evictable_size_ -= n
                self.protected_size_ += n
                delta -= n
                leaves.discard(node)
                host_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: HiTreeNode) -> int:
        """Undo one ``inc_lock_ref(node)``. Returns the evictable-size delta (>= 0)."""
        if node is self.root_node:
            return 0
        self._check_member(node, "dec_lock_ref", "is not on the device")
        if node.lock_ref <= 0:
            raise LockRefError(f"dec_lock_ref: {node!r} is not locked (unlocked twice, or never locked)")
        delta = 0
        root = self.root_node
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:  # unlocked: it may be a device leaf again (a locked node is on the device, so
                n = len(node.key)  # never a host leaf)
                self.evictable_size_ += n
                self.protected_size_ -= n
                delta += n
                self._update_leaf_status(node)
            node = node.parent
        return delta

    # -- device eviction -----------------------------------------------------------------------------
    def evict(self, params: EvictParams | int) -> HiEvictResult:
        """Free at least ``num_tokens`` device tokens from unlocked device leaves, in the strategy's order (or all
        there are). A backed-up leaf is demoted to host-only; an unbacked one is destroyed (write-through
        policies) or written to host first (``write_back``: the eviction waits for the copy; if the host pool
        stays full, the leaf and its host-only subtree are dropped). A parent whose children all left the device
        becomes a candidate. ``HiRadixCache.evict`` -> ``_evict_write_through`` / ``_evict_write_back``."""
        num_tokens = params if isinstance(params, int) else params.num_tokens
        tally = {"demoted": 0, "written": 0, "destroyed": 0}
        host_before = self.host_evicted_tokens
        staged: list[tuple[HiTreeNode, torch.Tensor]] = []
        kept: list[HiTreeNode] = []  # popped but still leaves (a protected subtree): candidates again next call
        evicted = 0
        self._evicting = True
        try:
            evicted = self._evict_loop(num_tokens, tally, staged, kept)
        finally:
            self._evicting = False
            for x in kept:
                if x in self.evictable_leaves:
                    self._push_dev(x)
        res = EvictResult.of(num_tokens, num_tokens, evicted)
        return HiEvictResult(**res.__dict__, demoted_tokens=tally["demoted"] + tally["written"],
                             written_back_tokens=tally["written"], destroyed_tokens=tally["destroyed"],
                             host_evicted_tokens=self.host_evicted_tokens - host_before)

    def _evict_loop(self, num_tokens: int, tally: dict, staged: list, kept: list) -> int:
        """:meth:`evict`'s loop over the device-leaf heap; a parent whose children all left the device joins the
        heap as it becomes a leaf (``_update_leaf_status``), as 0.5.16 pushes it. Returns the tokens evicted."""
        evicted = 0
        while evicted < num_tokens:
            x = self._pop(self._dheap, self.evictable_leaves, "_dver")
            if x is None:
                break
            if x.host_value is not None:
                evicted += self._evict_backuped(x)
                tally["demoted"] += len(x.key)
            elif self.write_policy != "write_back":
                evicted += self._evict_regular(x)
                tally["destroyed"] += len(x.key)
            elif self.write_backup(x, write_back=True) > 0:
                x.protect_host()
                staged.append((x, x.value))
                evicted += self._detach_backuped(x)
                tally["written"] += len(x.key)
            else:
                self._flush_staged(staged)
                dropped = self._drop_subtree_no_host(x)
                evicted += dropped
                tally["destroyed"] += dropped
            if x in self.evictable_leaves:  # not dropped (a host-protected node below it)
                kept.append(x)
        self._flush_staged(staged)
        return evicted

    def _flush_staged(self, staged: list[tuple[HiTreeNode, torch.Tensor]]) -> None:
        """Write-back: wait for the staged copies, then free their device slots."""
        if not staged:
            return
        self.writing_check(write_back=True)
        for node, device_indices in staged:
            self.cache_controller.evict_device(device_indices)
            node.release_host()
        staged.clear()

    def _detach_backuped(self, node: HiTreeNode) -> int:
        """Make ``node`` host-only (its device slots are freed by the caller)."""
        n = len(node.key)
        self.evictable_size_ -= n
        node.value = None
        self.structure_version += 1
        self._update_leaf_status(node)
        self._update_host_leaf_status(node)
        self._update_leaf_status(node.parent)
        return n

    def _evict_backuped(self, node: HiTreeNode) -> int:
        device_indices = node.value
        n = self._detach_backuped(node)
        self.cache_controller.evict_device(device_indices)
        return n

    def _evict_regular(self, node: HiTreeNode) -> int:
        require(not node.children, "HiRadixCache: an unbacked device leaf has no children (write-through)", node=node)
        n = len(node.key)
        self.cache_controller.evict_device(node.value)
        self._delete_leaf(node)
        return n

    def _delete_leaf(self, node: HiTreeNode) -> None:
        self.structure_version += 1
        del node.parent.children[self._key_of(node.key)]
        self.evictable_size_ -= len(node.key)
        self.evictable_leaves.discard(node)
        node.value = None
        self._update_leaf_status(node.parent)

    def _drop_subtree_no_host(self, top: HiTreeNode) -> int:
        """Write-back with the host pool full: drop ``top`` (a device leaf) and its host-only descendants from both
        tiers, unless any of them is host-protected. Returns the device tokens freed."""
        nodes, stack = [], [top]
        while stack:
            x = stack.pop()
            nodes.append(x)
            stack.extend(x.children.values())
        if any(x.host_ref_counter > 0 for x in nodes):
            return 0
        self.structure_version += 1
        freed = 0
        for x in nodes:
            if x.host_value is not None:
                self.cache_controller.evict_host(x.host_value)
                x.host_value = None
            if x.value is not None:
                self.cache_controller.evict_device(x.value)
                freed += len(x.value)
                self.evictable_size_ -= len(x.value)
                x.value = None
            self.evictable_leaves.discard(x)
            self.evictable_host_leaves.discard(x)
        del top.parent.children[self._key_of(top.key)]
        self._update_leaf_status(top.parent)
        self._update_host_leaf_status(top.parent)
        return freed

    # -- host eviction -------------------------------------------------------------------------------
    def evict_host(self, num_tokens: int) -> int:
        """Free the host copies of host-only leaves (never host-protected ones), in the strategy's order, until
        ``num_tokens`` are freed or none is left; the node is deleted, and a parent left childless and host-only
        becomes a candidate. Returns the host tokens freed (``HiRadixCache.evict_host``)."""
        freed = 0
        kept = []  # host-protected leaves: skipped, candidates again next call
        self._host_evicting = True
        try:
            while freed < num_tokens:
                x = self._pop(self._hheap, self.evictable_host_leaves, "_hver")
                if x is None:
                    break
                if x.host_ref_counter > 0:
                    kept.append(x)
                    continue
                freed += self.cache_controller.evict_host(x.host_value)
                self.structure_version += 1
                parent = x.parent
                del parent.children[self._key_of(x.key)]
                self.evictable_host_leaves.discard(x)
                x.host_value = None
                self._update_host_leaf_status(parent)  # a parent left childless and host-only joins the heap
        finally:
            self._host_evicting = False
            for x in kept:
                if x in self.evictable_host_leaves:
                    self._push_host(x)
        self.host_evicted_tokens += freed
        return freed

    # -- load-back (host -> device) ------------------------------------------------------------------
    def load_back(self, node: HiTreeNode, mem_quota: int | None = None) -> LoadBackResult:
        """Bring the host-only path ending at ``node`` back to the device, all or nothing. Skipped under
        ``load_back_threshold`` tokens or over ``mem_quota`` (device tokens the caller may still use; the
        evictable tokens the load would pin count against it). Device slots come from the allocator, evicting
        first if it is short (``load_back_evict_mode``). On success the loaded nodes hold their new slots at once
        and ``node`` stays locked until the copy is acknowledged (``loading_check``)."""
        last_hit = node
        to_load = []
        while node.value is None:
            require(node.host_value is not None, "HiRadixCache: a node off the device has a host copy", node=node)
            to_load.append(node)
            node = node.parent
        to_load.reverse()
        ancestor = node
        delta = self.inc_lock_ref(ancestor)
        host_indices = torch.cat([x.host_value for x in to_load]) if to_load else self._empty
        n = int(host_indices.shape[0])
        if n < self.load_back_threshold or (mem_quota is not None and n > mem_quota + delta):
            self.dec_lock_ref(ancestor)
            return LoadBackResult(None, _NO_EVICT, "below_threshold" if n < self.load_back_threshold else "over_quota")
        for x in to_load:
            x.protect_host()
        ctl, alloc = self.cache_controller, self.token_to_kv_pool_allocator
        ev = _NO_EVICT
        available = alloc.available_size()
        if self.load_back_evict_mode == "shortfall":  # 0.5.23: make room first, then allocate
            if n > available:
                ev = self._evict_for_load(n, available)
            device_indices = ctl.load(host_indices, last_hit.id)
        else:  # 0.5.16: try to allocate, and on failure evict (the bug: all of n) and try again
            device_indices = ctl.load(host_indices, last_hit.id)
            if device_indices is None:
                ev = self._evict_for_load(n, available)
                device_indices = ctl.load(host_indices, last_hit.id)
        self.dec_lock_ref(ancestor)
        for x in to_load:
            x.release_host()
        if device_indices is None:
            return LoadBackResult(None, ev, "device_full")
        op = ctl.load_queue[-1]
        off = 0
        self.structure_version += 1
        for x in to_load:
            x.value = device_indices[off : off + len(x.host_value)].clone()
            off += len(x.host_value)
        self.evictable_size_ += n
        self.inc_lock_ref(last_hit)
        self.ongoing_load_back[id(op)] = (op, last_hit)
        return LoadBackResult(device_indices, ev)

    def _evict_for_load(self, n: int, available: int) -> HiEvictResult:
        """A load-back of ``n`` tokens found ``available`` device slots free: evict what finding 2's rule asks for
        (:func:`~kvlab.mem_cache.shortfall.tokens_to_evict` in ``load_back_evict_mode``), counted against the
        shortfall."""
        shortfall = shortfall_tokens(n, available)
        requested = tokens_to_evict(n, available, self.load_back_evict_mode)
        got = self.evict(requested)
        return replace(got, shortfall_tokens=shortfall,
                       over_evicted_tokens=over_evicted_tokens(got.evicted_tokens, requested, shortfall))

    def init_load_back(self, last_node: HiTreeNode, mem_quota: int | None = None) -> tuple[torch.Tensor, HiTreeNode]:
        """The scheduler's entry (``init_load_back``): load back if ``last_node`` is host-only; returns the loaded
        device slots (empty if none) and the node the request's device prefix now ends at."""
        if last_node.value is not None:
            return self._empty, last_node
        res = self.load_back(last_node, mem_quota)
        if res.device_indices is not None:
            return res.device_indices, last_node
        while last_node.value is None:
            last_node = last_node.parent
        return self._empty, last_node

    # -- sizes and views -----------------------------------------------------------------------------
    def host_size(self) -> int:
        """Tokens with a host copy (both tiers or host only)."""
        return sum(len(x.host_value) for x in self.nodes() if x is not self.root_node and x.host_value is not None)

    def all_values_flatten(self) -> torch.Tensor:
        values = [x.value for x in self.nodes() if x is not self.root_node and x.value is not None]
        return torch.cat(values) if values else self._empty

    def _node_note(self, node: HiTreeNode) -> str:
        return "" if node is self.root_node else f" {node.residency}"

    # -- invariants ----------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` unless the two tiers' bookkeeping is consistent.

        Every node is on the device, on host, or both, with one slot per token of a whole-page key; device
        residency is closed under prefixes; host-only nodes are unlocked; under the write-through policies
        backups form a prefix from the root; lock_ref >= the children's; the evictable/protected counters equal
        the device tokens of unlocked/locked nodes; no device or host slot is cached twice, each is allocated in
        its pool, and the host pool holds exactly the tree's host copies; both leaf indexes equal a brute-force
        recomputation, and each of their leaves has a live entry with its current sort key in its tier's heap;
        every node an in-flight copy protects is locked.
        """
        root, ps = self.root_node, self.page_size
        require(root.lock_ref == 1 and not len(root.key) and root.parent is None,
                "HiRadixCache: root has lock_ref 1, an empty key and no parent", lock_ref=root.lock_ref)
        evictable = protected = 0
        dev, host, nodes = [], [], []
        for node in self.nodes():
            child_locks = 0
            for ck, child in node.children.items():
                require(child.parent is node, "HiRadixCache: each child points back at its parent", child=child)
                require(ck == self._key_of(child.key), "HiRadixCache: each child is filed under its first token/page",
                        child=child, filed_under=ck)
                child_locks += child.lock_ref
                if node.value is None and child.value is not None:
                    raise InvariantError("HiRadixCache: device residency is closed under prefixes (a device node's "
                                         "parent is on the device)", child=child, parent=node)
            if node is root:
                continue
            require(node.lock_ref >= child_locks, "HiRadixCache: lock_ref >= the sum of the children's", node=node,
                    lock_ref=node.lock_ref, children_lock_ref=child_locks)
            nodes.append(node)
            k = len(node.key)
            if not k or k % ps:
                raise InvariantError("HiRadixCache: every key is a non-empty whole number of pages", node=node,
                                     key_len=k, page_size=ps)
            if node.value is None and node.host_value is None:
                raise InvariantError("HiRadixCache: every node is on the device or on host", node=node)
            for tier, v in (("device", node.value), ("host", node.host_value)):
                if v is not None and len(v) != k:
                    raise InvariantError(f"HiRadixCache: a node's {tier} slots number its tokens", node=node,
                                         key_len=k, slots=len(v))
            if node.value is None:
                require(node.lock_ref == 0, "HiRadixCache: a host-only node is unlocked", node=node)
            else:
                dev.append(node.value)
                if node.lock_ref:
                    protected += k
                else:
                    evictable += k
            if node.host_value is not None:
                host.append(node.host_value)
                if (self.write_policy != "write_back" and node.parent is not root
                        and node.parent.host_value is None):
                    raise InvariantError("HiRadixCache: write-through backups form a prefix from the root",
                                         node=node, parent=node.parent)
        require((evictable, protected) == (self.evictable_size_, self.protected_size_),
                "HiRadixCache: counters evictable/protected match the device tokens of unlocked/locked nodes",
                evictable=self.evictable_size_, protected=self.protected_size_, tree_evictable=evictable,
                tree_protected=protected)
        for tier, slots, pool in (("device", dev, self.token_to_kv_pool_allocator),
                                  ("host", host, self.token_to_kv_pool_host)):
            flat = torch.cat(slots) if slots else self._empty
            require(len(torch.unique(flat)) == len(flat), f"HiRadixCache: no {tier} slot is cached in two nodes",
                    slots=len(flat))
            require(pool.all_allocated(flat), f"HiRadixCache: every cached {tier} slot is allocated in its pool",
                    slots=len(flat))
        host_tokens = sum(len(h) for h in host)
        require(host_tokens == self.token_to_kv_pool_host.used_size(),
                "HiRadixCache: the host pool holds exactly the tree's host copies", tree=host_tokens,
                pool_used=self.token_to_kv_pool_host.used_size())
        leaves = {x for x in nodes if x.value is not None and not x.lock_ref
                  and all(c.value is None for c in x.children.values())}
        require(leaves == self.evictable_leaves, "HiRadixCache: the device-leaf index holds exactly the unlocked "
                "device leaves", missing=sorted(x.id for x in leaves - self.evictable_leaves),
                extra=sorted(x.id for x in self.evictable_leaves - leaves))
        host_leaves = {x for x in nodes if x.value is None and all(c.host_value is None for c in x.children.values())}
        require(host_leaves == self.evictable_host_leaves, "HiRadixCache: the host-leaf index holds exactly the "
                "host-only nodes without backed-up children",
                missing=sorted(x.id for x in host_leaves - self.evictable_host_leaves),
                extra=sorted(x.id for x in self.evictable_host_leaves - host_leaves))
        for tier, index, heap, ver in (("device", self.evictable_leaves, self._dheap, "_dver"),
                                       ("host", self.evictable_host_leaves, self._hheap, "_hver")):
            live = {}
            for prio, last, nid, v, x in heap:
                if x in index and v == getattr(x, ver):
                    live[x] = (prio, last, nid)
            for x in index:
                want = (self._priority_of(x), x.last_access_time, x.id)
                if live.get(x) != want:
                    raise InvariantError(f"HiRadixCache: every {tier} leaf has a live heap entry with its current "
                                         "sort key", node=x, heap_entry=live.get(x), expected=want)
        for op, lock_node in self.ongoing_write_through.values():
            if lock_node is not None:
                require(lock_node.lock_ref > 0, "HiRadixCache: a node with a backup in flight is locked",
                        node=lock_node, finish_s=op.finish_s)
        for op, node in self.ongoing_load_back.values():
            require(node.value is not None and node.lock_ref > 0,
                    "HiRadixCache: a node with a load-back in flight is on the device and locked", node=node,
                    finish_s=op.finish_s)
        self.token_to_kv_pool_host.check_invariants()


__all__ = ["HiEvictResult", "HiMatchResult", "HiRadixCache", "HiTreeNode", "LOAD_BACK_EVICT_MODES", "LoadBackResult"]
