"""The tree core: what every kvlab radix tree does that reads only a node's key length, lock count, access time, id
and priority, written once for the token tree (``radix_cache.RadixCache``), the page tree (``page_tree.PageRadixTree``)
and both tiers of the two-tier tree (``hicache.hiradix_cache.HiRadixCache``).

- :class:`NodeCore`: the fields above, the base of every tree's node.
- :class:`LeafIndex`: one tier's evictable leaves and the heap they are evicted from. SGLang heapifies every
  evictable leaf on each ``evict`` call (``RadixCache.evict``, 0.5.16's ``HiRadixCache._make_eviction_heap`` /
  ``evict_host``); here the heap lives across calls: a leaf gets a fresh entry when it joins the index or its sort
  key changes, stale entries are skipped on pop and the heap is rebuilt when they outnumber the live ones. The sort
  key ``(policy priority, last_access_time, id)`` ends in the unique node id, so the victims and their order are
  what a fresh heapify would give.
- :class:`TreeCore`: the lock walk with its size counters (``inc_lock_ref`` / ``dec_lock_ref``: a lock covers the
  path to the root; tokens move between ``evictable_size_`` and ``protected_size_`` as a node is first locked or
  last unlocked), ``nodes()``, the ``structure_version`` bumps (a node made or deleted), a deleted leaf's
  bookkeeping, and the invariants those share; a repeated match's effects (``restamp_path``), an insert's credit
  to the path it matched, walked, held (``_holds_path``) or replayed (``_credit_path``), and the filing of its new
  leaf (``_attach_leaf``).
Each tree keeps its own split (what its nodes hold), its own leaf rule (which node is an evictable leaf of which
tier: ``_update_leaf_status``) and its own check of what its nodes hold; the walks read keys and are not
here: the token tree and the page tree share one (``tree_walk.PrefixWalk``), the two-tier trees and the SWA / Mamba
trees keep their own (theirs differ: tiers, tombstones). No torch here: the page tree, which the simulator's
fast engine runs on, imports none.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import Any

from kvlab.errors import InvariantError, LockRefError, require
from kvlab.mem_cache.evict_policy import get_eviction_strategy


class NodeCore:
    """What every tree's node holds for the tree core (a base class): ``children`` (a child by its first token or
    page), ``parent``, ``key``, ``lock_ref``, the fields the eviction policies read (``last_access_time``,
    ``creation_time``, ``hit_count``, ``priority``) and ``id`` (creation order). ``children``: a fresh dict unless
    given (the token tree's shared empty mapping)."""

    __slots__ = ("children", "key", "last_access_time", "priority", "hit_count", "parent", "lock_ref",
                 "creation_time", "id")  # (the walks' fields first: the object's first cache line)

    def __init__(self, key, parent, last_access_time: int, creation_time: int, node_id: int, priority: int = 0,
                 children=None) -> None:
        self.children = {} if children is None else children
        self.key = key
        self.last_access_time = last_access_time
        self.priority = priority
        self.hit_count = 0
        self.parent = parent
        self.lock_ref = 0
        self.creation_time = creation_time
        self.id = node_id


class LeafIndex:
    """One tier's evictable leaves: ``leaves`` maps each to the version of its live heap entry, and ``heap`` holds
    ``(priority(node), last_access_time, id, version, node)`` entries, live while ``leaves[node]`` is their version.
    ``frozen``: no rebuild (an eviction that re-files the leaves it popped and kept sets it while it runs)."""

    __slots__ = ("leaves", "heap", "priority", "frozen", "_version")

    def __init__(self, priority: Callable[[Any], Any]) -> None:
        self.leaves: dict = {}
        self.heap: list = []
        self.priority = priority
        self.frozen = False
        self._version = 0

    def push(self, node) -> None:
        """File ``node`` as a leaf with a fresh heap entry (it joins the index, or its sort key changed)."""
        v = self._version = self._version + 1
        self.leaves[node] = v
        heapq.heappush(self.heap, (self.priority(node), node.last_access_time, node.id, v, node))
        if len(self.heap) > 2 * len(self.leaves) + 64 and not self.frozen:
            self.rebuild()

    def touch(self, node) -> None:
        """``node``'s sort key changed: a leaf gets a fresh heap entry."""
        if node in self.leaves:
            self.push(node)

    def file(self, node, is_leaf: bool) -> None:
        """``node`` is (``is_leaf``) or is not an evictable leaf: join the index, or leave it."""
        if not is_leaf:
            self.leaves.pop(node, None)
        elif node not in self.leaves:
            self.push(node)

    def discard(self, node) -> None:
        self.leaves.pop(node, None)

    def pop(self):
        """The next leaf by sort key (it stays in the index until the tree deletes or re-files it), or None."""
        heap, leaves = self.heap, self.leaves
        while heap:
            entry = heapq.heappop(heap)
            node = entry[4]
            if leaves.get(node) == entry[3]:
                return node
        return None

    def rebuild(self) -> None:
        """One entry per leaf, with its current sort key."""
        heap, priority, v = [], self.priority, self._version
        leaves = self.leaves
        for node in leaves:
            v += 1
            leaves[node] = v
            heap.append((priority(node), node.last_access_time, node.id, v, node))
        heapq.heapify(heap)
        self.heap, self._version = heap, v

    def check(self, brute_force: set, index_rule: str, entry_rule: str) -> None:
        """Raise :class:`InvariantError` unless the index holds exactly ``brute_force`` (the leaves recomputed from the
        tree: ``index_rule`` names them) and each has a live heap entry with its current sort key (``entry_rule``)."""
        if brute_force != self.leaves.keys():
            raise InvariantError(index_rule, index=len(self.leaves), brute_force=len(brute_force),
                                 missing=sorted(n.id for n in brute_force - self.leaves.keys()),
                                 extra=sorted(n.id for n in self.leaves.keys() - brute_force))
        leaves = self.leaves
        live = {e[4]: e[:3] for e in self.heap if leaves.get(e[4]) == e[3]}
        for node in brute_force:
            want = (self.priority(node), node.last_access_time, node.id)
            if live.get(node) != want:
                raise InvariantError(entry_rule, node=node, heap_entry=live.get(node), expected=want)


def size_readers(pool: str) -> tuple[Callable[[Any], int], Callable[[Any], int], Callable[[Any], int]]:
    """The three size methods of one pair of a tree's counters, ``{pool}evictable_size_`` and
    ``{pool}protected_size_`` (``pool``: ``""``, ``"full_"``, ``"swa_"``, ``"mamba_"``): the evictable size, the
    protected size and their total."""
    evictable, protected = attrgetter(f"{pool}evictable_size_"), attrgetter(f"{pool}protected_size_")

    def evictable_size(self) -> int:
        return evictable(self)

    def protected_size(self) -> int:
        return protected(self)

    def total_size(self) -> int:
        return evictable(self) + protected(self)

    return evictable_size, protected_size, total_size


class TreeCore:
    """The mechanics a radix tree shares (a base class). A tree sets ``root_node`` (lock_ref 1, never counted) and
    calls :meth:`_reset_core` in its ``reset``; it supplies ``_update_leaf_status`` when its leaf rule is not "unlocked
    and childless" and ``_lock_guard`` when a lock may be refused (an evicted or foreign node) or switched off."""

    __slots__ = ()  # (a base: a tree may list its fields, see PageHiRadixTree.__slots__)

    root_node: Any
    leaf_index: LeafIndex
    clock: Any  # the tree's LogicalClock (base_prefix_cache)
    structure_version = 0  # bumped by every node made or deleted (splits too); see _register_node / _drop_leaf
    # sizes in the tree's unit (tokens; pages for the page tree): locked / unlocked nodes' keys
    evictable_size_ = 0
    protected_size_ = 0

    def _reset_core(self, priority: Callable[[Any], Any]) -> None:
        """An empty tree's bookkeeping (the caller then makes the root): no leaves, sizes 0, a fresh node count, and a
        new structure version (a replay recorded before the reset never matches again)."""
        self.structure_version += 1
        self._next_id = 0
        self.leaf_index = LeafIndex(priority)
        self._leaves = self.leaf_index.leaves  # (its dict, for the hot paths' membership tests)
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def _use_policy(self, eviction_policy: str, config: dict | None = None) -> Callable[[Any], Any]:
        """Set ``eviction_policy`` (the name, lower case) and ``eviction_strategy`` (``evict_policy``'s, built with
        ``config``); returns the strategy's priority function, the first part of every leaf's sort key."""
        self.eviction_policy = eviction_policy.lower()
        self.eviction_strategy = get_eviction_strategy(self.eviction_policy, config)
        return self.eviction_strategy.get_priority

    def _register_node(self) -> int:
        """A node is made: its id (creation order), and the structure changed."""
        node_id = self._next_id
        self._next_id = node_id + 1
        self.structure_version += 1
        return node_id

    def adopt(self, root_node, next_id: int) -> None:
        """Take over a tree built node by node (its root and the next node id): every node's leaf status is filed."""
        self.root_node = root_node
        self._next_id = next_id
        for node in self.nodes():
            if node is not root_node:
                self._update_leaf_status(node)

    @property
    def evictable_leaves(self):
        """The evictable leaves: a live, read-only view of the index (set operations work)."""
        return self.leaf_index.leaves.keys()

    # -- sizes ----------------------------------------------------------------------------------------------------
    evictable_size, protected_size, total_size = size_readers("")

    def nodes(self) -> Iterator:
        """Every node, the root first (pre-order)."""
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # -- what an insert or a repeated match does to a path it does not walk ---------------------------------------
    def restamp_path(self, node) -> None:
        """What repeating the match walk that ended at ``node`` does when the tree's structure has not changed since
        (``structure_version`` equal): one clock tick, the access time of ``node`` and its ancestors (root included),
        and their evictable-leaf heap entries refreshed."""
        now = self.clock.tick()
        index = self.leaf_index
        leaves = index.leaves
        while node is not None:
            node.last_access_time = now
            if node in leaves:
                index.push(node)
            node = node.parent

    def _holds_path(self, held, held_len: int) -> bool:
        """``held`` is a live node of this tree, held locked, whose path from the root spans ``held_len`` (what the
        caller says it matched): an insert may take that path as matched without comparing its keys."""
        if held is None or held.lock_ref <= 0 or held.evicted:
            return False
        root, length = self.root_node, 0
        while held is not root:
            if held is None:
                return False
            length += len(held.key)
            held = held.parent
        return length == held_len

    def _credit_path(self, node, end: int, now: int, priority: int, inserted_len: int, made: bool = False) -> None:
        """What an insert does to the path it matched (walked, held or replayed): from ``node``, whose path ends at
        ``end``, up to the root's child, each node gets ``now`` as access time, its priority raised to ``priority``
        and a hit when it ends past ``inserted_len``. ``made``: ``node`` is the upper half of the walk's split, which
        keeps the times it was made with. No leaf status changes: the caller re-files the last node if it stays a
        leaf (the others have a child on the path)."""
        made_node, made_time = node, node.last_access_time
        root = self.root_node
        while node is not root:
            node.last_access_time = now
            if priority > node.priority:
                node.priority = priority
            if end > inserted_len:
                node.hit_count += 1
            end -= len(node.key)
            node = node.parent
        if made:
            made_node.last_access_time = made_time

    def _attach_leaf(self, parent, leaf, filed_under, counted: bool) -> None:
        """An insert's new ``leaf`` below ``parent``, filed under ``filed_under``: a hit when ``counted``, its size
        joins the evictable counter, and both are re-filed (the parent is no leaf now)."""
        if counted:
            leaf.hit_count += 1
        if parent.children:
            parent.children[filed_under] = leaf
        else:  # (a childless node may share a read-only empty mapping: the token tree's)
            parent.children = {filed_under: leaf}
        self.evictable_size_ += len(leaf.key)
        self._update_leaf_status(parent)
        self._update_leaf_status(leaf)

    # -- the evictable-leaf index ---------------------------------------------------------------------------------
    def _update_leaf_status(self, node) -> None:
        """An evictable leaf: unlocked and childless."""
        leaves = self._leaves  # (a membership test is the common case, kept cheap)
        if node.lock_ref > 0 or node.children:
            if node in leaves:
                del leaves[node]
        elif node not in leaves:
            self.leaf_index.push(node)

    def _drop_leaf(self, node) -> None:
        """The core's part of deleting an evictable leaf: the structure changes, its size leaves the counters and it
        leaves the index. The tree unlinks it from its parent, then files the parent's leaf status."""
        self.structure_version += 1
        self.evictable_size_ -= len(node.key)
        self.leaf_index.leaves.pop(node, None)

    # -- locks ----------------------------------------------------------------------------------------------------
    # A tree whose locks may be refused (an evicted or foreign node) or switched off (``disable``) sets this to a
    # method ``_lock_guard(node, what) -> bool``: True skips the lock (disabled), a refused node raises
    # :class:`LockRefError`. None: every lock is taken, with no call on the hot path (the page tree).
    _lock_guard = None

    # True: the tree's leaf rule is the plain one below, which the unlock walk applies inline (no call per node)
    _plain_leaf_rule = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._plain_leaf_rule = cls._update_leaf_status is TreeCore._update_leaf_status

    def inc_lock_ref(self, node) -> int:
        """Lock ``node`` and its ancestors (not the root). Returns the evictable-size delta (<= 0). A node locked for
        the first time leaves the leaf index (a locked node is no evictable leaf)."""
        if node is self.root_node:
            return 0
        guard = self._lock_guard
        if guard is not None and guard(node, "inc_lock_ref"):
            return 0
        delta = 0
        root, leaves = self.root_node, self._leaves
        while node is not root:
            if node.lock_ref == 0:
                n = len(node.key)
                self.evictable_size_ -= n
                self.protected_size_ += n
                delta -= n
                node.lock_ref = 1
                if node in leaves:
                    del leaves[node]
            else:
                node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node) -> int:
        """Undo one ``inc_lock_ref(node)``. Returns the evictable-size delta (>= 0)."""
        if node is self.root_node:
            return 0
        guard = self._lock_guard
        if guard is not None and guard(node, "dec_lock_ref"):
            return 0
        if node.lock_ref <= 0:
            raise LockRefError(f"dec_lock_ref: {node!r} is not locked (unlocked twice, or never locked)")
        delta = 0
        root, leaves, plain = self.root_node, self._leaves, self._plain_leaf_rule
        while node is not root:
            if node.lock_ref == 1:
                n = len(node.key)
                self.evictable_size_ += n
                self.protected_size_ -= n
                delta += n
                node.lock_ref = 0
                if not plain:
                    self._update_leaf_status(node)
                elif not node.children and node not in leaves:  # (the plain rule, for a node unlocked now)
                    self.leaf_index.push(node)
            else:
                node.lock_ref -= 1
            node = node.parent
        return delta

    # -- the invariants every tree shares -------------------------------------------------------------------------
    def _check_root(self, name: str) -> None:
        root = self.root_node
        if root.lock_ref != 1 or len(root.key) or root.parent is not None:
            raise InvariantError(f"{name}: root must have lock_ref 1, an empty key and no parent",
                                 lock_ref=root.lock_ref, key_len=len(root.key), parent=root.parent)

    def _check_sizes(self, counted: list, name: str, evictable_size: int | None = None,
                     protected_size: int | None = None) -> None:
        """The size counters (``evictable_size`` / ``protected_size``, the tree's own by default) equal the keys of the
        ``counted`` nodes that are unlocked / locked."""
        evictable = protected = 0
        for node in counted:
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        evictable_size = self.evictable_size_ if evictable_size is None else evictable_size
        protected_size = self.protected_size_ if protected_size is None else protected_size
        require((evictable, protected) == (evictable_size, protected_size),
                f"{name}: counters evictable/protected match the tokens of unlocked/locked nodes",
                evictable=evictable_size, protected=protected_size, tree_evictable=evictable,
                tree_protected=protected)

    def _check_leaf_index(self, nodes: list, name: str) -> None:
        """The index holds exactly the unlocked childless nodes, each with a live heap entry (``nodes``: non-root)."""
        self.leaf_index.check({n for n in nodes if not n.lock_ref and not n.children},
                              f"{name}: the evictable-leaf index holds exactly the unlocked leaves",
                              f"{name}: every evictable leaf has a live heap entry with its current priority")
