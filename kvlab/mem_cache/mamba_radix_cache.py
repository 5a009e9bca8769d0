"""Prefix cache for hybrid linear-attention / SSM models (SGLang 0.5.16
``mem_cache/mamba_radix_cache.py``; 0.5.23 keeps the semantics as ``UnifiedRadixCache``'s MAMBA
component).

Each node holds full-attention KV slots (``value``, as in RadixCache) and maybe one recurrent-state
slot (``mamba_value``) in a :class:`MambaPool`: the conv + SSM state *after the node's last token*.
A KV cache stores one entry per token, so any prefix of it is usable; an SSM state summarises the
whole prefix in a fixed size, so a prefix is resumable only where a snapshot exists. Hence:

- ``match_prefix`` returns the deepest matched node that *has* a state; KV matched beyond it is
  useless. A split creates an upper node without state (a mamba tombstone).
- ``evict(num_tokens, mamba_num)``: full LRU over unlocked leaves (frees KV **and** state; tombstone
  ancestors left childless are deleted too), then mamba LRU over unlocked nodes with a state: an
  internal node only loses its state, a leaf is deleted. An evicted state is gone for good: only
  a re-prefill brings it back, which is why over-eviction costs more here than on a plain tree.
- Full lock to the root; the mamba lock on the node itself.

Differs on purpose: LRU scans instead of linked lists; no copy-on-write of the matched state and no
chunk-aligned ``mamba_branching_seqlen`` (states are inserted where the caller says).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from kvlab.errors import DoubleFreeError, InvariantError, LockRefError, require
from kvlab.mem_cache.base_prefix_cache import (
    EvictParams,
    EvictResult,
    HybridEvictResult,
    InsertResult,
    KVAllocator,
    SlotIndices,
    TokenKey,
)
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.swa_radix_cache import HybridTreeBase, HybridTreeNode
from kvlab.mem_cache.tree_core import size_readers

_I64 = torch.int64


class MambaPool:
    """State slots for recurrent layers (``memory_pool.MambaPool``): per slot a conv state
    ``[layers, conv_dim, conv_kernel-1]`` and an SSM state ``[layers, heads, head_dim, state]``,
    real tensors. Slot indices 0..size-1; ``alloc``/``free`` raise on misuse."""

    def __init__(self, size: int, num_layers: int = 2, conv_dim: int = 8, conv_kernel: int = 4,
                 num_heads: int = 2, head_dim: int = 4, state_size: int = 4, dtype: torch.dtype = torch.float32):
        if size < 1:
            raise ValueError(f"MambaPool size must be >= 1, got {size}")
        self.size = size
        self.conv_state = torch.zeros(size, num_layers, conv_dim, conv_kernel - 1, dtype=dtype)
        self.ssm_state = torch.zeros(size, num_layers, num_heads, head_dim, state_size, dtype=dtype)
        self.free_slots: list[int] = list(range(size))
        self._is_free = torch.ones(size, dtype=torch.bool)

    def available_size(self) -> int:
        return len(self.free_slots)

    def used_size(self) -> int:
        return self.size - len(self.free_slots)

    def alloc(self, need_size: int = 1) -> torch.Tensor | None:
        if need_size > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        idx = torch.tensor(out, dtype=_I64)
        self._is_free[idx] = False
        self.conv_state[idx] = 0
        self.ssm_state[idx] = 0
        return idx

    def free(self, idx: int | Sequence[int] | torch.Tensor) -> None:
        idx = torch.as_tensor(idx, dtype=_I64).reshape(-1)
        if idx.numel() == 0:
            return
        if bool(((idx < 0) | (idx >= self.size)).any()):
            raise DoubleFreeError(f"MambaPool.free: slot out of range 0..{self.size - 1}: {idx.tolist()}")
        if bool(self._is_free[idx].any()) or len(torch.unique(idx)) != len(idx):
            raise DoubleFreeError(f"MambaPool.free: double free of state slot(s) {idx.tolist()}")
        self._is_free[idx] = True
        self.free_slots.extend(idx.tolist())

    def copy_from(self, src: int | torch.Tensor, dst: int | torch.Tensor) -> None:
        """Copy states (copy-on-write of a matched state into a request's own slot)."""
        self.conv_state[dst] = self.conv_state[src]
        self.ssm_state[dst] = self.ssm_state[src]

    def check_invariants(self) -> None:
        free = self.free_slots
        require(len(set(free)) == len(free), "MambaPool: no slot is on the free list twice", free_slots=len(free),
                distinct=len(set(free)))
        bad = [x for x in free if not 0 <= x < self.size]
        require(not bad, "MambaPool: the free list holds slots 0..size-1 only", slots=bad, size=self.size)
        marked = int(self._is_free.sum())
        idx = torch.tensor(free, dtype=_I64)
        unmarked = idx[~self._is_free[idx]].tolist() if free else []
        require(marked == len(free) and not unmarked, "MambaPool: the free list and the free mask agree",
                marked_free=marked, listed_free=len(free), listed_but_not_marked=unmarked)
        available, used = self.available_size(), self.used_size()
        require(available + used == self.size, "MambaPool: free + used == size", free=available, used=used,
                size=self.size)


class MambaInsertResult(NamedTuple):
    """``prefix_len``: KV tokens already cached (caller frees its duplicates);
    ``mamba_exist``: the final node already had a state, so the caller must free its own."""

    prefix_len: int
    last_node: HybridTreeNode
    mamba_exist: bool


@dataclass(frozen=True)
class MambaEvictParams(EvictParams):
    """``EvictParams`` with SGLang's ``mamba_num`` (states to free)."""

    mamba_num: int = 0


class MambaRadixCache(HybridTreeBase):
    """SGLang's ``MambaRadixCache`` over a standard KV allocator and a :class:`MambaPool`.

    Sizes: ``full_*`` in KV tokens by full lock; ``mamba_*`` in states by mamba lock.
    """

    kind = "mamba"  # BasePrefixCache.kind: nodes carry mamba_value (None: a tombstone, KV without its state)

    def __init__(self, token_to_kv_pool_allocator: KVAllocator, mamba_pool: MambaPool, page_size: int = 1,
                 req_to_token_pool: ReqToTokenPool | None = None):
        if not isinstance(mamba_pool, MambaPool):
            raise TypeError(f"MambaRadixCache needs a MambaPool, got {type(mamba_pool).__name__}")
        self.mamba_pool = mamba_pool
        super().__init__(token_to_kv_pool_allocator, page_size, req_to_token_pool)

    @property
    def state_pool(self) -> MambaPool:
        """``BasePrefixCache.state_pool``: every insert takes one recurrent-state slot of it."""
        return self.mamba_pool

    def insert_slots(self, key: TokenKey, value: SlotIndices, *, prev_prefix_len: int = 0,
                     state_slot: int | None = None) -> InsertResult:
        """The contract's insert (``BasePrefixCache.insert_slots``): :meth:`insert`, which frees the duplicate KV;
        a state slot the tree did not take (``state_exist``) is left to the caller."""
        if state_slot is None:
            raise ValueError("MambaRadixCache.insert_slots: state_slot is required (a slot of state_pool holding the "
                             "state after the key's last token)")
        res = self.insert(key, value, state_slot, prev_prefix_len=prev_prefix_len)
        return InsertResult(res.prefix_len, res.mamba_exist)

    def reset(self) -> None:
        super().reset()
        self.mamba_evictable_size_ = 0
        self.mamba_protected_size_ = 0

    def _split_extra(self, upper: HybridTreeNode, child: HybridTreeNode) -> None:
        upper.mamba_value = None  # no snapshot exists at the split point
        upper.mamba_lock_ref = 0  # the mamba lock stays on the node that has the state

    def _node_note(self, node: HybridTreeNode) -> str:
        if node is self.root_node:
            return ""
        return f" mamba={node.mamba_value} mr={node.mamba_lock_ref}"

    # -- match / insert -------------------------------------------------------------------------
    def _usable_end(self, path: list[HybridTreeNode]) -> tuple[HybridTreeNode, int]:
        """The deepest matched node with a recurrent state (``_match_prefix_helper``; the root counts: the empty
        prefix), and its prefix length."""
        best, best_len, matched = self.root_node, 0, 0
        for node in path:
            matched += len(node.key)
            if node.mamba_value is not None:
                best, best_len = node, matched
        return best, best_len

    def _match_post(self, best: HybridTreeNode) -> None:
        """``_match_post_processor``: the full LRU along the path to ``best``, the mamba LRU only for its state."""
        super()._match_post(best)
        if best is not self.root_node:
            best.mamba_last_access_time = self.clock.tick()

    def insert(self, key: TokenKey, value: SlotIndices, mamba_value: int, prev_prefix_len: int = 0) -> MambaInsertResult:
        """Cache ``key`` with KV ``value`` and the state slot ``mamba_value`` (the state after the
        key's last token); ``_insert_helper``. As in SGLang, the tree frees the caller's
        duplicate KV itself (matched tokens past ``prev_prefix_len``). The tree takes the state
        slot unless the final node already has one (``mamba_exist``: the caller frees its slot)."""
        key, value, n = self._prep_value(key, value)
        if n == 0:
            raise ValueError("MambaRadixCache.insert: empty (page-aligned) key")
        mamba_value = int(mamba_value)
        if mamba_value < 0 or mamba_value >= self.mamba_pool.size or bool(self.mamba_pool._is_free[mamba_value]):
            raise ValueError(f"MambaRadixCache.insert: state slot {mamba_value} is not allocated in the MambaPool")
        path = self._walk(key, n, touch=True)
        off = self._take_duplicates(path, value, prev_prefix_len)
        if off < n:
            last = self._add_leaf(path, key, value, off, n)
        else:
            last = path[-1]
            self._touch(last)
        exist = last.mamba_value is not None
        if not exist:
            last.mamba_value = mamba_value
            last.mamba_last_access_time = self.clock.tick()
            if last.mamba_lock_ref:
                self.mamba_protected_size_ += 1
            else:
                self.mamba_evictable_size_ += 1
        return MambaInsertResult(off, last, exist)

    # -- locks ----------------------------------------------------------------------------------
    def inc_lock_ref(self, node: HybridTreeNode) -> int:
        """Full lock to the root; mamba lock on ``node`` (its state must exist)."""
        if node is self.root_node:
            return 0
        self._check_member(node, "inc_lock_ref")
        if node.mamba_value is None:
            raise LockRefError(f"inc_lock_ref: {node!r} has no mamba state (match ends at a node with one)")
        delta = self._full_lock(node)
        if node.mamba_lock_ref == 0:
            self.mamba_evictable_size_ -= 1
            self.mamba_protected_size_ += 1
        node.mamba_lock_ref += 1
        return delta

    def dec_lock_ref(self, node: HybridTreeNode) -> int:
        if node is self.root_node:
            return 0
        self._check_member(node, "dec_lock_ref")
        if node.mamba_lock_ref <= 0:
            raise LockRefError(f"dec_lock_ref: {node!r} has no mamba lock (unlocked twice, or never locked)")
        delta = self._full_unlock(node)
        node.mamba_lock_ref -= 1
        if node.mamba_lock_ref == 0:
            self.mamba_evictable_size_ += 1
            self.mamba_protected_size_ -= 1
        return delta

    # -- eviction -------------------------------------------------------------------------------
    def _free_state(self, node: HybridTreeNode) -> int:
        if node.mamba_value is None:
            return 0
        self.mamba_pool.free([node.mamba_value])
        node.mamba_value = None
        self.mamba_evictable_size_ -= 1
        return 1

    def _free_slots(self, node: HybridTreeNode) -> int:
        """A deleted node's KV and state. Returns the states freed."""
        self.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
        return self._free_state(node)

    def _dead(self, node: HybridTreeNode) -> bool:
        """A node without a state: left as an unlocked leaf it can never be hit, and goes with its child."""
        return node.mamba_value is None

    def _component_victim(self) -> HybridTreeNode | None:
        """The mamba pass's next victim: the least recently used (mamba recency) node with an unlocked state."""
        cands = [x for x in self.nodes() if x.mamba_value is not None and x.mamba_lock_ref == 0]
        return min(cands, key=lambda x: (x.mamba_last_access_time, x.id)) if cands else None

    _drop_component = _free_state  # an internal node keeps its KV and becomes a mamba tombstone

    def evict(self, params: EvictParams | int, mamba_num: int = 0) -> HybridEvictResult:
        """``evict_full(num_tokens)`` then ``evict_mamba(mamba_num)`` (see module doc).

        As in SGLang, the mamba pass counts only its own frees: states freed by the full pass (every
        deleted leaf takes its state along) do not reduce ``mamba_num``. ``mamba_num_evicted`` in
        the result counts both passes."""
        if isinstance(params, int):
            params = MambaEvictParams(num_tokens=params, mamba_num=mamba_num)
        want_states = max(mamba_num, getattr(params, "mamba_num", 0))
        if self.disable:
            return HybridEvictResult()
        tokens, full_pass_states = self._evict_full(params.num_tokens)
        tokens, states = self._evict_component(want_states, tokens, 0)  # (only its own frees count: see above)
        res = EvictResult.of(params.num_tokens, params.num_tokens, tokens)
        return HybridEvictResult(**res.__dict__, mamba_shortfall=want_states,
                                 mamba_num_evicted=full_pass_states + states)

    # -- sizes / invariants ---------------------------------------------------------------------
    mamba_evictable_size, mamba_protected_size, mamba_total_size = size_readers("mamba_")

    def check_invariants(self) -> None:
        """Tree shape and full counters, plus: every leaf has a state; mamba_lock_ref in
        [0, lock_ref] and 0 on nodes without a state; states unique and allocated in the pool;
        mamba counters match."""
        nodes = self._check_tree_shape()
        ev = pr = 0
        slots = []
        for x in nodes:
            if not x.children and x.mamba_value is None:
                raise InvariantError("MambaRadixCache: every leaf has a mamba state", node=x)
            if x.mamba_lock_ref < 0 or x.mamba_lock_ref > x.lock_ref:
                raise InvariantError("MambaRadixCache: 0 <= mamba_lock_ref <= lock_ref", node=x,
                                     mamba_lock_ref=x.mamba_lock_ref, lock_ref=x.lock_ref)
            if x.mamba_value is None:
                if x.mamba_lock_ref:
                    raise InvariantError("MambaRadixCache: only a node with a state is mamba-locked", node=x,
                                         mamba_lock_ref=x.mamba_lock_ref)
                continue
            slots.append(x.mamba_value)
            if x.mamba_lock_ref:
                pr += 1
            else:
                ev += 1
        require(len(set(slots)) == len(slots), "MambaRadixCache: no state slot is held by two nodes",
                states=len(slots), distinct=len(set(slots)))
        if slots:
            free = [s for s, f in zip(slots, self.mamba_pool._is_free[torch.tensor(slots)].tolist()) if f]
            require(not free, "MambaRadixCache: every cached state slot is allocated in the MambaPool", slots=free)
        require((ev, pr) == (self.mamba_evictable_size_, self.mamba_protected_size_),
                "MambaRadixCache: mamba counters match the tree", evictable=self.mamba_evictable_size_,
                protected=self.mamba_protected_size_, tree_evictable=ev, tree_protected=pr)
