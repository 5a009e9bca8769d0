"""Prefix cache for hybrid sliding-window models (SGLang 0.5.16 ``mem_cache/swa_radix_cache.py``;
0.5.23 folds the same semantics into ``UnifiedRadixCache``'s SWA component).

A model with full-attention layers and sliding-window (SWA) layers keeps two KV pools
(:class:`~kvlab.mem_cache.swa_allocator.SWATokenToKVPoolAllocator`). Tree values are *full* slot
indices; each maps to its SWA peer. SWA KV older than the window is never read again, so the SWA
pool can drop it while the full pool keeps it: the node becomes an *SWA tombstone*.

- A match is usable only up to the deepest node that has no tombstone on its path, or has at
  least ``sliding_window_size`` un-tombstoned tokens since the last tombstone (the window the
  SWA layers attend to must be present).
- A lock takes the full lock to the root, and the SWA lock only over the last
  ``sliding_window_size`` tokens (``swa_uuid`` marks where that lock stops, so a later split
  cannot make the unlock walk stop in a different place).
- ``evict(EvictParams(num_tokens, swa_num_tokens))``: first full LRU leaves (both sides freed),
  then, if the SWA pool is still short, SWA LRU over unlocked un-tombstoned nodes: an internal
  node is tombstoned (``free_swa``), a leaf is deleted. Tombstone leaves are deleted at once.

Differs on purpose: LRU only (scans, not linked lists); insert does not re-fill a tombstoned
node's SWA KV (the caller's duplicate slots are freed, the tombstone stays until evicted).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch

from kvlab.errors import InvariantError, LockRefError, require
from kvlab.mem_cache.base_prefix_cache import (
    EvictParams,
    EvictResult,
    HybridEvictResult,
    InsertResult,
    KVAllocator,
    MatchResult,
    SlotIndices,
    TokenKey,
)
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.radix_tree import BaseRadixTree, LogicalClock, as_tokens, common_prefix_len
from kvlab.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
from kvlab.mem_cache.tree_core import NodeCore, TreeCore, size_readers
from kvlab.units import align_down

# HybridEvictResult lives in base_prefix_cache; kept importable from here.
__all__ = ["HybridEvictResult", "HybridTreeNode", "SWARadixCache", "SWATreeLock"]

_I64 = torch.int64


class HybridTreeNode(NodeCore):
    """A tree edge with the attributes ``tree_view.tree_frame`` reads (``id``, ``key``,
    ``children``, ``parent``, ``lock_ref``, ``last_access_time``, ``hit_count``) plus the second
    component's state (``swa_tombstone`` / ``swa_lock_ref`` / ``swa_uuid``, or ``mamba_value`` /
    ``mamba_lock_ref``)."""

    __slots__ = ("value", "swa_tombstone", "swa_lock_ref", "swa_uuid", "mamba_value", "mamba_lock_ref",
                 "mamba_last_access_time", "swa_last_access_time")

    def __init__(self, key: array, value: torch.Tensor | None, parent: HybridTreeNode | None, now: int,
                 node_id: int):
        super().__init__(key, parent, now, now, node_id)
        self.value = value
        self.swa_tombstone = False
        self.swa_lock_ref = 0
        self.swa_uuid: int | None = None
        self.mamba_value: int | None = None
        self.mamba_lock_ref = 0
        self.mamba_last_access_time = now
        self.swa_last_access_time = now

    @property
    def evicted(self) -> bool:
        return self.value is None

    def __repr__(self) -> str:
        head = list(self.key[:6])
        return f"{type(self).__name__}(id={self.id}, key={head}{'...' if len(self.key) > 6 else ''} ({len(self.key)}), lock_ref={self.lock_ref})"


class SWATreeLock(NamedTuple):
    node: HybridTreeNode
    swa_uuid: int | None


class HybridTreeBase(BaseRadixTree):
    """What the SWA and Mamba trees share beyond :class:`BaseRadixTree`: LRU recency by clock ticks,
    the walk with splits, the insert value check, full-attention locks and ``full_*`` sizes."""

    root_node: HybridTreeNode

    def __init__(self, token_to_kv_pool_allocator: KVAllocator, page_size: int,
                 req_to_token_pool: ReqToTokenPool | None = None):
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, type(self).__name__)
        self.reset()

    def reset(self) -> None:
        self.clock = LogicalClock()
        self._ids = itertools.count()
        self.root_node = HybridTreeNode(array("q"), torch.empty(0, dtype=_I64), None, self.clock.tick(), next(self._ids))
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self._empty = torch.empty(0, dtype=_I64)

    def _new_node(self, key: array, value: torch.Tensor, parent: HybridTreeNode | None) -> HybridTreeNode:
        return HybridTreeNode(key, value, parent, self.clock.tick(), next(self._ids))

    # -- walk / split ---------------------------------------------------------------------------
    # Recency: SGLang keeps doubly-linked LRU lists; "move to MRU" is one logical-clock tick here,
    # so the LRU order is the order of last ticks. A path touch ticks root-side first, so a child
    # is more recent than its parent (SGLang's ``reset_node_and_parents_mru``).
    def _touch(self, node: HybridTreeNode) -> None:
        """``reset_node_mru``: the full list, plus the component's list (see subclasses)."""
        node.last_access_time = self.clock.tick()

    def _touch_path(self, node: HybridTreeNode) -> None:
        """``reset_node_and_parents_mru(node)``: :meth:`_touch` on each node of the path, root-side first."""
        path = []
        while node is not self.root_node:
            path.append(node)
            node = node.parent
        for x in reversed(path):
            self._touch(x)

    def match_prefix(self, key: TokenKey) -> MatchResult:
        """Longest cached prefix the second component can resume from (``_match_prefix_helper``): the walk splits
        like RadixCache's, then the deepest usable node on it (:meth:`_usable_end`, each tree's rule) is the match,
        and only the path to that node is refreshed (:meth:`_match_post`)."""
        key = as_tokens(key)
        n = align_down(len(key), self.page_size)
        if self.disable or n == 0:
            return MatchResult(self._empty, self.root_node, 0)
        best, best_len = self._usable_end(self._walk(key, n))
        self._match_post(best)
        return MatchResult(self.path_device_indices(best), best, best_len)

    def _usable_end(self, path: list[HybridTreeNode]) -> tuple[HybridTreeNode, int]:
        raise NotImplementedError

    def _match_post(self, best: HybridTreeNode) -> None:
        """``_match_post_processor``: the full LRU refreshed along the path to the match's node."""
        self._touch_path(best)

    def _walk(self, key: array, n: int, touch: bool = False) -> list[HybridTreeNode]:
        """Nodes matched along ``key[:n]``, splitting where the match ends inside an edge.
        ``touch``: insert's walk, which moves each node to MRU as it passes (before a split)."""
        node = self.root_node
        path = []
        off, ps = 0, self.page_size
        while off < n:
            child = node.children.get(self._child_key(key, off))
            if child is None:
                break
            if touch:
                self._touch(child)
            end = off + len(child.key)
            if end <= n and child.key == key[off:end]:
                path.append(child)
                node = child
                off = end
                continue
            m = align_down(common_prefix_len(child.key, key, off, n), ps)
            if m:
                path.append(self._split_node(child, m))
            break
        return path

    def _split_node(self, child: HybridTreeNode, split_len: int) -> HybridTreeNode:
        """``child`` -> ``upper[:split_len]`` -> ``child[split_len:]``; both re-enter the LRU
        as most recent, the lower piece after the upper (SGLang's ``_split_node``)."""
        parent = child.parent
        ck = self._child_key(child.key)
        upper = self._new_node(child.key[:split_len], child.value[:split_len].clone(), parent)
        upper.hit_count = child.hit_count
        upper.lock_ref = child.lock_ref
        self._split_extra(upper, child)
        child.key = child.key[split_len:]
        child.value = child.value[split_len:].clone()
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        parent.children[ck] = upper
        self._split_times(upper, child)
        return upper

    def _split_times(self, upper: HybridTreeNode, child: HybridTreeNode) -> None:
        upper.last_access_time = self.clock.tick()
        child.last_access_time = self.clock.tick()

    def _split_extra(self, upper: HybridTreeNode, child: HybridTreeNode) -> None:
        pass

    def _prep_value(self, key: TokenKey, value: SlotIndices) -> tuple[array, torch.Tensor, int]:
        key = as_tokens(key)
        n = align_down(len(key), self.page_size)
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value, dtype=_I64)
        value = value.to(_I64)
        if len(value) < n:
            raise ValueError(f"insert: {len(value)} values for a key of {n} (page-aligned) tokens")
        return key, value, n

    def _take_duplicates(self, path: list[HybridTreeNode], value: torch.Tensor, prev_prefix_len: int,
                         adopt: Callable[[HybridTreeNode, torch.Tensor], bool] | None = None) -> int:
        """An insert's matched ``path``: each node is hit-counted, and the caller's slots for its tokens past
        ``prev_prefix_len`` are freed (the tree keeps its own), unless ``adopt(node, slots)`` takes them for the
        node's whole key. Returns the tokens matched."""
        alloc = self.token_to_kv_pool_allocator
        off = 0
        for x in path:
            ln = len(x.key)
            x.hit_count += 1
            if prev_prefix_len < off + ln:
                start = max(0, prev_prefix_len - off)
                mine = value[off : off + ln]
                if not (adopt is not None and start == 0 and adopt(x, mine)):
                    alloc.free(mine[start:])
            off += ln
        return off

    def _delete_node(self, node: HybridTreeNode) -> tuple[int, int]:
        """Free a childless unlocked node (:meth:`_free_slots`) and delete it, then its ancestors that it leaves as
        unlocked leaves that are dead (:meth:`_dead`: an SWA tombstone, a node without a mamba state). Returns the
        full tokens and the second component's units (SWA tokens, mamba states) freed."""
        full = other = 0
        while True:
            parent = node.parent
            other += self._free_slots(node)
            full += len(node.key)
            self.evictable_size_ -= len(node.key)
            del parent.children[self._child_key(node.key)]
            node.value = None
            if parent is self.root_node or parent.children or parent.lock_ref or not self._dead(parent):
                return full, other
            node = parent

    def _evict_full(self, num_tokens: int) -> tuple[int, int]:
        """An eviction's full pass: the least recently used unlocked leaf is deleted (``_delete_node``, with the
        ancestors it leaves as dead leaves) until ``num_tokens`` full slots are freed or none is left. Returns the
        full tokens freed and the second component's units freed with them (SWA tokens, mamba states)."""
        full = other = 0
        while full < num_tokens:
            leaves = self._leaf_candidates()
            if not leaves:
                break
            f, o = self._delete_node(min(leaves, key=lambda x: (x.last_access_time, x.id)))
            full, other = full + f, other + o
        return full, other

    def _evict_component(self, want: int, full: int, freed: int) -> tuple[int, int]:
        """An eviction's second pass (SWA tokens, mamba states), after the full pass freed ``full`` tokens and
        ``freed`` units: while fewer than ``want`` units are freed, the next victim (:meth:`_component_victim`, by
        the component's own recency) loses its component: a childless node no request holds is deleted
        (``_delete_node``), any other keeps its KV (:meth:`_drop_component`). Returns the full tokens and the
        units freed."""
        while freed < want:
            x = self._component_victim()
            if x is None:
                break
            if not x.children and x.lock_ref == 0:
                f, o = self._delete_node(x)
                full, freed = full + f, freed + o
            else:
                freed += self._drop_component(x)
        return full, freed

    def _component_victim(self) -> HybridTreeNode | None:
        raise NotImplementedError

    def _drop_component(self, node: HybridTreeNode) -> int:
        raise NotImplementedError

    def _add_leaf(self, path: list[HybridTreeNode], key: array, value: torch.Tensor, off: int,
                  n: int) -> HybridTreeNode:
        """An insert's new leaf for ``key[off:n]`` below the matched ``path``, holding a copy of the slots."""
        parent = path[-1] if path else self.root_node
        leaf = self._new_node(key[off:n], value[off:n].clone(), parent)
        parent.children[self._child_key(leaf.key)] = leaf
        self.evictable_size_ += n - off
        return leaf

    # -- full locks: tree_core's lock walk on the full counters (evictable_size_ / protected_size_) --------
    # The hybrid trees keep no leaf index (they scan for victims: _leaf_candidates), so the walk files nothing.
    _leaves: Mapping = MappingProxyType({})
    _lock_guard = None  # (inc_lock_ref / dec_lock_ref check the node themselves: _check_member)
    _full_lock = TreeCore.inc_lock_ref
    _full_unlock = TreeCore.dec_lock_ref

    def _update_leaf_status(self, node: HybridTreeNode) -> None:
        pass

    # -- sizes ----------------------------------------------------------------------------------
    # the plain sizes (TreeCore's) are the full pool's: what SGLang's PrefillAdder reads for hybrid trees
    full_evictable_size, full_protected_size = TreeCore.evictable_size, TreeCore.protected_size

    def _leaf_candidates(self) -> list[HybridTreeNode]:
        return [n for n in self.nodes() if n is not self.root_node and not n.children and n.lock_ref == 0]

    def _check_tree_shape(self) -> list[HybridTreeNode]:
        """``BaseRadixTree._check_tree`` on the full-attention side; returns the non-root nodes."""
        return self._check_tree(self.evictable_size_, self.protected_size_, type(self).__name__)


class SWARadixCache(HybridTreeBase):
    """SGLang's ``SWARadixCache`` over an :class:`SWATokenToKVPoolAllocator` (see module doc).

    Sizes: ``full_*`` count tokens by full lock; ``swa_*`` count un-tombstoned tokens by SWA lock.
    """

    kind = "swa"  # BasePrefixCache.kind: nodes carry swa_tombstone

    def __init__(self, token_to_kv_pool_allocator: SWATokenToKVPoolAllocator, sliding_window_size: int,
                 page_size: int = 1, req_to_token_pool: ReqToTokenPool | None = None):
        if not isinstance(token_to_kv_pool_allocator, SWATokenToKVPoolAllocator):
            raise TypeError(f"SWARadixCache needs an SWATokenToKVPoolAllocator, got {type(token_to_kv_pool_allocator).__name__}")
        if sliding_window_size < 1:
            raise ValueError(f"sliding_window_size must be >= 1, got {sliding_window_size}")
        self.sliding_window_size = sliding_window_size
        super().__init__(token_to_kv_pool_allocator, page_size, req_to_token_pool)

    def reset(self) -> None:
        super().reset()
        self.swa_evictable_size_ = 0
        self.swa_protected_size_ = 0
        self._uuids = itertools.count(1)

    def _split_extra(self, upper: HybridTreeNode, child: HybridTreeNode) -> None:
        upper.swa_tombstone = child.swa_tombstone
        upper.swa_lock_ref = child.swa_lock_ref
        upper.swa_uuid, child.swa_uuid = child.swa_uuid, None  # the lock boundary is the topmost piece

    def _node_note(self, node: HybridTreeNode) -> str:
        if node is self.root_node:
            return ""
        return f" swa_r={node.swa_lock_ref}" + (" tombstone" if node.swa_tombstone else "")

    # -- recency (the SWA list holds only un-tombstoned nodes) -----------------------------------
    def _touch(self, node: HybridTreeNode) -> None:
        node.last_access_time = self.clock.tick()
        if not node.swa_tombstone:
            node.swa_last_access_time = node.last_access_time

    def _split_times(self, upper: HybridTreeNode, child: HybridTreeNode) -> None:
        self._touch(upper)
        self._touch(child)

    # -- match / insert -------------------------------------------------------------------------
    def _usable_end(self, path: list[HybridTreeNode]) -> tuple[HybridTreeNode, int]:
        """The match the SWA layers can use (``_match_prefix_helper``): the deepest matched node that is either
        reached without crossing a tombstone, or has at least ``sliding_window_size`` un-tombstoned tokens since
        the last tombstone; and its prefix length."""
        best, best_len = self.root_node, 0
        matched, since = 0, float("inf")  # no tombstone seen yet: any prefix is usable
        for node in path:
            matched += len(node.key)
            since = 0 if node.swa_tombstone else since + len(node.key)
            if since >= self.sliding_window_size:
                best, best_len = node, matched
        return best, best_len

    def insert_slots(self, key: TokenKey, value: SlotIndices, *, prev_prefix_len: int = 0,
                     state_slot: int | None = None) -> InsertResult:
        """The contract's insert (``BasePrefixCache.insert_slots``): :meth:`insert`, which frees the duplicates."""
        if state_slot is not None:
            raise ValueError(f"SWARadixCache.insert_slots: an SWA tree keeps no recurrent state, got "
                             f"state_slot={state_slot}")
        return InsertResult(self.insert(key, value, prev_prefix_len=prev_prefix_len))

    def insert(self, key: TokenKey, value: SlotIndices, prev_prefix_len: int = 0) -> int:
        """Cache ``key`` with full slots ``value`` (each already paired with an SWA slot); returns
        the length that was already cached (``_insert_helper``).

        Unlike RadixCache, the tree frees the caller's duplicates itself: for every matched
        token past ``prev_prefix_len`` (what the caller got from the tree), the caller's slot is
        freed, or, where the tree's node is an SWA tombstone, the node adopts the caller's slots
        (its old full slots are freed, or, if a running request still holds them, re-paired with
        the caller's SWA slots) and stops being a tombstone (SGLang's branch 1; kvlab does not
        track a request's own sliding-window frees, ``swa_evicted_seqlen`` is 0)."""
        key, value, n = self._prep_value(key, value)
        if self.disable or n == 0:
            return 0
        path = self._walk(key, n, touch=True)
        off = self._take_duplicates(path, value, prev_prefix_len, self._adopt_slots)
        if off < n:
            self._add_leaf(path, key, value, off, n)
            self.swa_evictable_size_ += n - off
        return off

    def _adopt_slots(self, x: HybridTreeNode, mine: torch.Tensor) -> bool:
        """An SWA tombstone takes the caller's slots for its whole key (SGLang's branch 1)."""
        if not x.swa_tombstone:
            return False
        self._recover_tombstone(x, mine.clone())
        return True

    def _recover_tombstone(self, x: HybridTreeNode, mine: torch.Tensor) -> None:
        alloc = self.token_to_kv_pool_allocator
        if x.lock_ref > 0:  # _recover_tombstone_keeping_locked_full
            alloc.full_to_swa_index_mapping[x.value] = alloc.full_to_swa_index_mapping[mine]
            alloc.full_to_swa_index_mapping[mine] = 0
            alloc.free_full(mine)
        else:
            alloc.free_full(x.value)
            x.value = mine
        x.swa_tombstone = False
        x.swa_last_access_time = self.clock.tick()
        self.swa_evictable_size_ += len(x.key)

    # -- locks ----------------------------------------------------------------------------------
    def inc_lock_ref(self, node: HybridTreeNode) -> int | None:
        """Full lock to the root, SWA lock over the last window. Returns the ``swa_uuid`` to pass
        to :meth:`dec_lock_ref` (None: the SWA lock reached the root)."""
        if node is self.root_node:
            return None
        self._check_member(node, "inc_lock_ref")
        self._full_lock(node)
        acc, x, uuid = 0, node, None
        while x is not self.root_node:
            if x.swa_tombstone:
                raise LockRefError(f"inc_lock_ref: {x!r} inside the window is an SWA tombstone (match ends above it)")
            if x.swa_lock_ref == 0:
                self.swa_evictable_size_ -= len(x.key)
                self.swa_protected_size_ += len(x.key)
            x.swa_lock_ref += 1
            acc += len(x.key)
            if acc >= self.sliding_window_size:
                if x.swa_uuid is None:
                    x.swa_uuid = next(self._uuids)
                uuid = x.swa_uuid
                break
            x = x.parent
        return uuid

    def dec_lock_ref(self, node: HybridTreeNode, swa_uuid: int | None = None) -> None:
        if node is self.root_node:
            return
        self._check_member(node, "dec_lock_ref")
        self._full_unlock(node)
        x = node
        while x is not self.root_node:
            if x.swa_lock_ref <= 0:
                raise LockRefError(f"dec_lock_ref: {x!r} has no SWA lock (wrong swa_uuid?)")
            x.swa_lock_ref -= 1
            if x.swa_lock_ref == 0:
                self.swa_evictable_size_ += len(x.key)
                self.swa_protected_size_ -= len(x.key)
            if swa_uuid is not None and x.swa_uuid == swa_uuid:
                break
            x = x.parent

    def lock(self, node: HybridTreeNode) -> SWATreeLock:
        return SWATreeLock(node, self.inc_lock_ref(node))

    def unlock(self, lock: SWATreeLock) -> None:
        self.dec_lock_ref(lock.node, lock.swa_uuid)

    # -- eviction -------------------------------------------------------------------------------
    def _free_slots(self, node: HybridTreeNode) -> int:
        """A deleted node's slots: both sides, or the full side only if it is a tombstone. Returns the SWA tokens
        freed."""
        alloc = self.token_to_kv_pool_allocator
        if node.swa_tombstone:
            alloc.free_full(node.value)
            return 0
        alloc.free(node.value)
        self.swa_evictable_size_ -= len(node.key)
        return len(node.key)

    def _dead(self, node: HybridTreeNode) -> bool:
        return node.swa_tombstone

    def _component_victim(self) -> HybridTreeNode | None:
        """The SWA pass's next victim: the least recently used (SWA recency) unlocked un-tombstoned node."""
        cands = [x for x in self.nodes() if x is not self.root_node and not x.swa_tombstone and x.swa_lock_ref == 0]
        return min(cands, key=lambda x: (x.swa_last_access_time, x.id)) if cands else None

    def _drop_component(self, node: HybridTreeNode) -> int:
        """An internal node (or a leaf whose full KV a request still holds) is tombstoned: its SWA KV is freed
        (``free_swa``). Returns the SWA tokens freed."""
        self.token_to_kv_pool_allocator.free_swa(node.value)
        node.swa_tombstone = True
        self.swa_evictable_size_ -= len(node.key)
        return len(node.key)

    def evict(self, params: EvictParams | int) -> HybridEvictResult:
        """``SWARadixCache.evict``: full LRU leaves (both sides freed, tombstone ancestors left
        childless deleted too) until ``num_tokens`` full slots are freed; then, while fewer than
        ``swa_num_tokens`` SWA slots were freed, SWA LRU over unlocked un-tombstoned nodes: an
        internal node is tombstoned (``free_swa``), a leaf is deleted.

        The result counts what was really freed; SGLang's own ``num_tokens_evicted`` leaves out the
        tombstone ancestors deleted during the SWA pass."""
        if isinstance(params, int):
            params = EvictParams(num_tokens=params)
        if self.disable:
            return HybridEvictResult()
        full, swa = self._evict_component(params.swa_num_tokens, *self._evict_full(params.num_tokens))
        res = EvictResult.of(params.num_tokens, params.num_tokens, full, params.swa_num_tokens,
                             params.swa_num_tokens)
        return HybridEvictResult(**res.__dict__, swa_evicted_tokens=swa)

    # -- sizes / invariants ---------------------------------------------------------------------
    swa_evictable_size, swa_protected_size, swa_total_size = size_readers("swa_")

    def check_invariants(self) -> None:
        """Tree shape and full counters (see the base), plus: no tombstone leaf; swa counters
        match the un-tombstoned tokens; swa_lock_ref in [0, lock_ref]; every un-tombstoned value has
        an SWA peer and every tombstoned one has none."""
        nodes = self._check_tree_shape()
        ev = pr = 0
        m = self.token_to_kv_pool_allocator.full_to_swa_index_mapping
        for x in nodes:
            if x.swa_lock_ref < 0 or x.swa_lock_ref > x.lock_ref:
                raise InvariantError("SWARadixCache: 0 <= swa_lock_ref <= lock_ref", node=x,
                                     swa_lock_ref=x.swa_lock_ref, lock_ref=x.lock_ref)
            if x.swa_tombstone:
                if not x.children:
                    raise InvariantError("SWARadixCache: no tombstone is a leaf", node=x)
                if x.swa_lock_ref:
                    raise InvariantError("SWARadixCache: no tombstone is under an SWA lock", node=x,
                                         swa_lock_ref=x.swa_lock_ref)
                if bool((m[x.value] != 0).any()):
                    raise InvariantError("SWARadixCache: a tombstone maps to no SWA slot", node=x,
                                         swa_slots=m[x.value].tolist())
                continue
            if bool((m[x.value] <= 0).any()):
                raise InvariantError("SWARadixCache: every value of a live (un-tombstoned) node has an SWA peer",
                                     node=x, swa_slots=m[x.value].tolist())
            if x.swa_lock_ref:
                pr += len(x.key)
            else:
                ev += len(x.key)
        require((ev, pr) == (self.swa_evictable_size_, self.swa_protected_size_),
                "SWARadixCache: swa counters match the un-tombstoned tokens", swa_evictable=self.swa_evictable_size_,
                swa_protected=self.swa_protected_size_, tree_evictable=ev, tree_protected=pr)
