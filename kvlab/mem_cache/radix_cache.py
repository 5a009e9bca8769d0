"""Prefix cache as a radix tree over token ids (``sglang/srt/mem_cache/radix_cache.py``).

Each edge holds a run of tokens (``key``) and their KV slot indices (``value``, int64 tensor, one
per token). A root-to-node path spells a cached prefix; its KV is the concatenation of the values
on the path. ``page_size > 1``: keys are whole pages, children are keyed by their first page.

Accounting (all in tokens)::

    total_size() = evictable_size() + protected_size() = sum(len(node.value) for every node)
    protected    = tokens of nodes with lock_ref > 0 (a running request's prefix and its ancestors)
    evictable    = tokens of unlocked nodes; only unlocked *leaves* can be evicted, whole

Behaviour mirrored from SGLang, op for op (the differential test checks it against 0.5.16 and
0.5.23): match splits a node where the match ends inside it and refreshes access times along the
path; insert returns the length already cached so the caller frees its duplicate slots; locks walk
to the root; evict pops whole leaves in the strategy's order, a parent that becomes a leaf joins
the candidates, and the last leaf may overshoot the request.

Differs on purpose:
- Time is a per-cache :class:`LogicalClock` (one tick wherever SGLang calls ``time.monotonic()``),
  so runs are reproducible and victim order never depends on the wall clock.
- SGLang re-heapifies every evictable leaf on each ``evict`` call (O(leaves) even for
  ``evict(1)``). Here the evictable leaves live in a heap maintained incrementally: a leaf is
  (re)pushed when it becomes evictable or its priority fields change, stale entries are skipped on
  pop (lazy invalidation) and the heap is compacted when stale entries outnumber live ones. The
  victim order is SGLang's; the cost grows with what is evicted.
- Unlocking an unlocked node, or locking/unlocking an evicted or foreign node, raises
  :class:`LockRefError` (SGLang lets ``lock_ref`` go negative).
- ``_split_node`` leaves both halves views of the split node's value tensor (SGLang clones them): same values,
  and a chain of split nodes holds adjacent slices of one tensor, which ``match_prefix`` concatenates as one run.
  A node's view is made when ``value`` is first read, so a split makes no tensor at all; each node links the
  child that continues its run (``_next``), which the walks try before the children dict.
- ``insert`` right after ``match_prefix`` of the same key, with no node made or deleted in between (a scheduler's
  match-then-insert), replays that match walk's effects node by node instead of comparing the tokens again.
- ``match_prefix`` / ``insert`` take plain token sequences (no ``RadixKey`` / params objects;
  no ``extra_key`` namespaces, EAGLE bigram keys, HiCache fields or KV events).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from types import MappingProxyType

import torch

from kvlab.errors import InvariantError, LockRefError
from kvlab.mem_cache.base_prefix_cache import (
    ChildKey,
    EvictParams,
    EvictResult,
    KVAllocator,
    MatchResult,
    SlotIndices,
    TokenKey,
    TreeLock,
)
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.radix_tree import BaseRadixTree, LogicalClock, as_tokens
from kvlab.mem_cache.request_flows import RadixRequestFlows, Req
from kvlab.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
from kvlab.mem_cache.tree_walk import PrefixWalk
from kvlab.units import align_down

# Old import paths (``from kvlab.mem_cache.radix_cache import LockRefError, MatchResult, ...``); the request API
# (``Req``, ``SimpleReq``, the request flows) is in request_flows.py.
__all__ = ["LockRefError", "LogicalClock", "MatchResult", "RadixCache", "TreeLock", "TreeNode"]

_I64 = torch.int64


# A childless node's ``children``: one shared, read-only empty mapping (a leaf gets its own dict with its first
# child), so a new leaf allocates no dict.
NO_CHILDREN: Mapping[ChildKey, TreeNode] = MappingProxyType({})


class TreeNode:
    """One edge of the tree. ``value is None`` once evicted. ``children`` maps the first token
    (page_size 1) or the first page's token tuple (page_size > 1) to the child (read-only
    :data:`NO_CHILDREN` until the first child)."""

    # the match/insert walks' fields first (they share the object's first cache lines)
    __slots__ = ("children", "key", "last_access_time", "_next", "_vbase", "_vstart", "priority", "hit_count",
                 "parent", "_value", "lock_ref", "creation_time", "id")

    def __init__(self, key: array, value: torch.Tensor | None, parent: TreeNode | None,
                 last_access_time: int, creation_time: int, node_id: int, priority: int = 0):
        self.children: Mapping[ChildKey, TreeNode] = NO_CHILDREN
        self.parent = parent
        self.key = key
        self._value = value
        self.lock_ref = 0
        self.last_access_time = last_access_time
        self.creation_time = creation_time
        self.hit_count = 0
        self.priority = priority
        self.id = node_id
        # value is _vbase[_vstart : _vstart + len(key)]: a split leaves both halves views of one tensor, so the
        # values of a chain of split nodes are one slice (match_prefix concatenates runs, not nodes); the view is
        # made when ``value`` is first read (_value caches it; a split resets it), not at each split
        self._vbase = value
        self._vstart = 0
        # the child that continues this node's _vbase (value and key) where this node ends: the lower half of this
        # node's last split, if still cached. The walks try it before the children dict (a chain of split nodes
        # is read without a lookup per node).
        self._next = None

    @property
    def value(self) -> torch.Tensor | None:
        """This node's KV slots (int64, one per token of ``key``); None once evicted."""
        v = self._value
        if v is None and self._vbase is not None:
            v = self._value = self._vbase[self._vstart : self._vstart + len(self.key)]
        return v

    @value.setter
    def value(self, value: torch.Tensor | None) -> None:
        self._value = self._vbase = value
        self._vstart = 0

    @property
    def evicted(self) -> bool:
        return self._vbase is None

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        head = list(self.key[:6])
        more = "..." if len(self.key) > 6 else ""
        return f"TreeNode(id={self.id}, key={head}{more} ({len(self.key)}), lock_ref={self.lock_ref})"


class RadixCache(RadixRequestFlows, PrefixWalk, BaseRadixTree):
    """SGLang's ``RadixCache`` with the classic (0.5.16) request API and 0.5.23's insert semantics.

    ``token_to_kv_pool_allocator`` receives the slots of evicted leaves (``free_segment``) and the
    duplicate/tail slots of finished requests (``free``); ``req_to_token_pool`` is read by the
    request flows. Both may be None for a tree-only cache (values are then just numbers).
    ``eviction_policy``: a name from ``evict_policy.EVICTION_POLICIES``.
    """

    def __init__(self, req_to_token_pool: ReqToTokenPool | None = None,
                 token_to_kv_pool_allocator: KVAllocator | None = None, page_size: int = 1,
                 eviction_policy: str = "lru", eviction_policy_config: dict | None = None, disable: bool = False):
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, "RadixCache")
        self.disable = disable
        self._prio = self._use_policy(eviction_policy, eviction_policy_config)
        self.reset()

    # -- construction helpers -------------------------------------------------------------------
    def reset(self) -> None:
        # Bumped by every node created or deleted (splits included): equal versions mean a match walk
        # would visit the same nodes, so a caller may replay its side effects (``restamp_path``).
        self._reset_core(self._prio)  # (tree_core: a new structure_version, the leaf index, the counters)
        self.clock = LogicalClock()
        self.root_node = self._new_node(array("q"), torch.empty(0, dtype=_I64), None, priority=-(2**63))
        self.root_node.lock_ref = 1  # never evictable, never counted
        # the last match walk: (the bytes of the key it read: up to its last node and the next page, n,
        # structure_version after it, its last node, matched tokens); insert
        # replays it instead of walking again when nothing changed the tree's structure since (see _insert)
        self._last_walk: tuple[bytes, int, int, TreeNode, int] | None = None
        self._empty = torch.empty(0, dtype=_I64)

    def _new_node(self, key: array, value: torch.Tensor, parent: TreeNode | None, priority: int = 0) -> TreeNode:
        # Two ticks, as SGLang's TreeNode.__init__ reads time.monotonic() twice.
        clock = self.clock
        now = clock.now = clock.now + 2  # (clock.tick() twice, inlined)
        return TreeNode(key, value, parent, now - 1, now, self._register_node(), priority)

    # -- the evictable-leaf index: tree_core's (LeafIndex: leaf_index.push / touch / pop; _update_leaf_status) ---------

    # -- match / insert -------------------------------------------------------------------------
    def match_prefix(self, key: TokenKey) -> MatchResult:
        """Longest cached prefix of ``key`` (truncated to whole pages). Mutates the tree: splits the
        node the match ends inside, and stamps the access time of every node on the path."""
        key = as_tokens(key)
        n = align_down(len(key), self.page_size)
        if self.disable or n == 0:
            return MatchResult(self._empty, self.root_node, 0)
        node, matched = self._match_walk(key, n)
        runs = self._value_runs(node)
        if len(runs) == 1:  # one run: one copy of one slice, as SGLang's result is a copy
            base, start, stop = runs[0]
            return MatchResult(base.narrow_copy(0, start, stop - start), node, matched)
        if not runs:
            return MatchResult(self._empty, node, matched)
        return MatchResult(torch.cat([base[start:stop] for base, start, stop in reversed(runs)]), node, matched)

    def touch_prefix(self, key: TokenKey) -> None:
        """0.5.23: the match walk (access times, splits) without building the result."""
        key = as_tokens(key)
        n = align_down(len(key), self.page_size)
        if not self.disable and n:
            self._match_walk(key, n)

    # restamp_path (what repeating a match walk does when the structure has not changed): tree_core's

    def _match_walk(self, key: array, n: int) -> tuple[TreeNode, int]:
        """(the node the match ends at, matched tokens): the shared walk (``PrefixWalk._descend``: access times, a
        split where the key diverges inside an edge), which tries a node's split-chain child (``_next``) before its
        children. Only the walk's last node can be an evictable leaf (every other one has the next as a child), so
        the heap is touched at most once. Recorded for an insert of the same key to replay (``_last_walk``)."""
        clock = self.clock
        now = clock.now = clock.now + 1  # (clock.tick(), inlined)
        node = self.root_node
        node.last_access_time = now
        ps = self.page_size
        node, off, _ = self._descend(key, n, node, 0, now, ps)
        self.leaf_index.touch(node)
        self._last_walk = (memoryview(key)[: off + ps if off < n else n].tobytes(), n, self.structure_version, node,
                           off)
        return node, off

    def _value_runs(self, node: TreeNode) -> list[tuple[torch.Tensor, int, int]]:
        """The KV of the path to ``node`` as runs of contiguous slices ``(base, start, stop)`` for
        ``base[start:stop]``, from ``node`` up (the last run first). The values of consecutive nodes that are
        adjacent slices of one tensor (split halves) make one run: a deep chain of split nodes (about 33 a walk in
        bench_radix_cache.py) is one ``torch.cat`` input, not 33. A node continues its parent's run exactly when it
        is the parent's ``_next`` (what check_invariants checks), so that is the one test per node."""
        root = self.root_node
        if node is root:
            return []
        runs = []
        base, stop = node._vbase, node._vstart + len(node.key)  # the open run ends at stop; child is its top node
        child, node = node, node.parent
        while node is not root:
            if node._next is not child:  # the open run starts at child: node ends another
                runs.append((base, child._vstart, stop))
                base, stop = node._vbase, node._vstart + len(node.key)
            child, node = node, node.parent
        runs.append((base, child._vstart, stop))
        return runs

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """``child`` -> ``upper[:split_len]`` -> ``child[split_len:]``. Sizes and leaf set unchanged."""
        parent = child.parent
        ck = self._child_key(child.key)
        # SGLang clones both halves; here they stay views of the one tensor (same values, no copies), so a
        # match over a chain of split nodes reads one slice (see _match_walk). Both views are made when read.
        upper = self._new_node(child.key[:split_len], None, parent, child.priority)
        upper._vbase, upper._vstart = child._vbase, child._vstart
        upper.hit_count = child.hit_count
        upper.lock_ref = child.lock_ref
        upper._next = child
        if parent._next is child:
            parent._next = upper
        child.key = child.key[split_len:]
        child._value = None
        child._vstart += split_len
        child.parent = upper
        upper.children = {self._child_key(child.key): child}
        parent.children[ck] = upper
        return upper

    def insert(self, key: TokenKey, value: SlotIndices | None = None, priority: int = 0, inserted_len: int = 0) -> int:
        """Cache ``key`` (truncated to whole pages) with KV slots ``value[:len(key)]``.

        Returns the number of leading tokens that were *already* cached: the tree keeps its own
        slots for them, so the caller's ``value[cache_protected_len:returned]`` are duplicates to
        free (RadixCache never frees them itself). ``inserted_len``: tokens this request inserted
        before (0.5.23); nodes within it are not hit-counted again. ``value=None`` stores the
        token ids as values (SGLang's debug fallback).
        """
        if self.disable:
            return 0
        key = as_tokens(key)
        n = align_down(len(key), self.page_size)
        if value is None:
            value = torch.tensor(key[:n].tolist(), dtype=_I64)
        elif not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value, dtype=_I64)
        return self._insert(key, n, value, priority, inserted_len)[0]

    def _insert(self, key: array, n: int, value: torch.Tensor, priority: int, inserted_len: int,
                held: TreeNode | None = None, held_len: int = 0) -> tuple[int, TreeNode]:
        """``insert`` of ``key[:n]`` (``n`` page-aligned): the request flows pass the whole token array and
        the request row (int32) without slicing or converting them; only the new leaf's slots are copied
        (as int64). ``held``: the node a request holds locked, whose path spells ``key[:held_len]`` (it was
        matched or inserted from the request's own tokens); the walk over that path has the same effects
        node by node without comparing its tokens again (a chunked prompt is not re-read once per chunk)."""
        if value.shape[0] < n:
            raise ValueError(f"insert: {value.shape[0]} values for a key of {n} (page-aligned) tokens")
        clock = self.clock
        now = clock.now = clock.now + 1  # (clock.tick(), inlined)
        node = self.root_node
        node.last_access_time = now
        if priority > node.priority:
            node.priority = priority
        ps = self.page_size
        off = 0
        held_ok = 0 < held_len <= n and self._holds_path(held, held_len)
        last = self._last_walk
        if (not held_ok and last is not None and last[2] == self.structure_version and last[1] == n
                and memoryview(key)[: len(last[0]) // 8].tobytes() == last[0]):
            # The match walk of this very key ran last and no node was made or deleted since: this walk would visit
            # the same nodes, matched whole (that walk split where the key diverges), so it is replayed upwards from
            # its last node (same effects, node by node). Below that node no child starts with the key's next
            # token or page (the match would have gone on, or split there), so the walk ends there. What that walk
            # read of the key is compared: the tokens up to its last node and the next page (not the whole key).
            node, off, split = last[3], last[4], False
        else:
            if held_ok:  # the held path is taken as matched, not compared again
                node, off = held, held_len
            node, off, split = self._descend(key, n, node, off, now, ps)
        self._credit_path(node, off, now, priority, inserted_len, split)
        if off == n:  # the key ends at a node boundary: no leaf is added below it
            self.leaf_index.touch(node)
        if off < n:
            new = value.narrow_copy(0, off, n - off) if value.dtype == _I64 else value[off:n].to(_I64)
            leaf = self._new_node(key[off:n], new, node, priority)
            self._attach_leaf(node, leaf, self._child_key(leaf.key), n > inserted_len)
            return off, leaf
        return off, node  # (the node that ends at n: cache_unfinished_req re-matches up to it)

    # -- request flows (0.5.16 classic API): request_flows.RadixRequestFlows' over this insert ---------------
    def _insert_finished(self, tokens: array, key_len: int, row: torch.Tensor, priority: int, req: Req) -> int:
        return self._insert(tokens, key_len, row, priority, 0, req.last_node, req.cache_protected_len)[0]

    # -- locks: tree_core's inc_lock_ref / dec_lock_ref (refusing an evicted or foreign node: _lock_guard) --

    # -- eviction -------------------------------------------------------------------------------
    def evict(self, params: EvictParams | int) -> EvictResult:
        """Free whole unlocked leaves, in the strategy's order, until ``num_tokens`` are freed or no
        evictable leaf is left; may free up to one leaf more than asked (``overshoot_tokens``).

        With an SWA allocator every cached token holds one full and one SWA slot, so the tree evicts
        until ``max(num_tokens, swa_num_tokens)`` (SGLang's plain RadixCache ignores the SWA count;
        its SWA tree tombstones instead). Cost: O((victims + stale entries) log leaves).
        """
        if isinstance(params, int):
            params = EvictParams(num_tokens=params)
        target = params.num_tokens
        allocator = self.token_to_kv_pool_allocator
        if params.swa_num_tokens and isinstance(allocator, SWATokenToKVPoolAllocator):
            target = max(target, params.swa_num_tokens)
        evicted = 0
        if not self.disable:
            while evicted < target:
                x = self.leaf_index.pop()
                if x is None:
                    break
                if allocator is not None:
                    allocator.free_segment(x.value, start_pos=0)
                evicted += len(x.key)  # len(key) == len(value); array len is cheaper
                self._delete_leaf(x)
        return EvictResult.of(params.num_tokens, params.num_tokens, evicted,
                              params.swa_num_tokens, params.swa_num_tokens)

    def _delete_leaf(self, node: TreeNode) -> None:
        self._drop_leaf(node)
        parent = node.parent
        del parent.children[self._child_key(node.key)]
        if parent._next is node:
            parent._next = None
        node._value = node._vbase = None  # (a split half may still hold the base: it is that half's memory)
        self._update_leaf_status(parent)

    # -- invariants -----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` unless the tree's bookkeeping is consistent.

        Checks: evictable + protected == total == sum of value lengths; every lock_ref >= 0 and
        >= the sum of its children's (a lock covers the path to the root); children keyed by their
        first token/page; keys whole pages; no slot in two nodes, and every cached slot allocated;
        the evictable-leaf set and heap equal a brute-force recomputation.
        """
        nodes = self._check_tree(self.evictable_size_, self.protected_size_, "RadixCache")
        for node in nodes:  # the run bookkeeping _match_walk merges slices by: value is _vbase[_vstart:...]
            v, base = node.value, node._vbase
            if (base is None or v.data_ptr() != base.data_ptr() + node._vstart * base.element_size()
                    or node._vstart + len(v) > len(base)):
                raise InvariantError("RadixCache: every node's value is the slice of its base tensor it records",
                                     node=node, vstart=node._vstart, base_len=None if base is None else len(base))
        for node in self.nodes():  # the split chain the walks follow first: _next is the child continuing _vbase
            stop = node._vstart + len(node.key)
            cont = [c for c in node.children.values()
                    if node is not self.root_node and c._vbase is node._vbase and c._vstart == stop]
            if node._next is not (cont[0] if cont else None):
                raise InvariantError("RadixCache: a node's _next is the child that continues its value's base tensor",
                                     node=node, next=node._next, continuing=cont)
        self._check_leaf_index(nodes, "RadixCache")
