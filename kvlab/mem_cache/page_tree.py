"""The radix cache at page granularity, for the simulator's fast engine (``kvlab.sched.page_kv``): SGLang's paged
``RadixCache`` (:class:`~kvlab.mem_cache.radix_cache.RadixCache` at ``page_size > 1``) with each page's tokens
replaced by one integer, and no KV slots at all.

Why this is the same tree. A paged radix cache only ever compares whole pages: children are filed by their first
page, a key is truncated to whole pages, a split falls on a page boundary, a node's size is a whole number of pages.
So if every distinct page content gets one id (:class:`PageKeys`, an interning table: equal tokens, equal id), the
tree over page ids has the same nodes, the same splits and the same sizes (in pages, times the page size). Its
operations are :class:`RadixCache`'s op for op (the walk and the insert's credit to its path are the very code
both run, :class:`~kvlab.mem_cache.tree_walk.PrefixWalk`'s and
:class:`~kvlab.mem_cache.tree_core.TreeCore`'s): one clock tick where it ticks (two per node made),
the same access times, hit counts and priorities, node ids in creation order, the same ``structure_version`` bumps
and the evictable-leaf heap keyed by ``(policy priority, last_access_time, id)``, so the victim order is the same.
The simulator's KV slots never reach a result (only counts do), so a node holds its length, not slot ids; the
allocator is a count of free pages (``kvlab.sched.page_kv.PageCounter``).

The differential tests run the token-level reference (``SchedulerConfig(fast_decode=False)``: ``RadixCache`` over
token ids with real slot tensors) against the engine built on this tree and compare every row, every total and
the final tree (:meth:`PageRadixTree.to_radix_cache` rebuilds it as a token-level ``RadixCache`` for that, and for
anything that reads a simulation's tree).

No torch here: the simulator's fast engine imports none (``to_radix_cache`` imports it when called).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence

from kvlab.errors import InvariantError, require
from kvlab.mem_cache.base_prefix_cache import LogicalClock
from kvlab.mem_cache.tree_core import NodeCore
from kvlab.mem_cache.tree_walk import ChainlessNode, PrefixWalk


class PageNode(NodeCore, ChainlessNode):
    """One edge: ``key`` (page ids), :class:`~kvlab.mem_cache.tree_core.NodeCore`'s fields, and ``evicted``."""

    __slots__ = ("evicted",)

    def __init__(self, key: array, parent: PageNode | None, last_access_time: int, creation_time: int, node_id: int,
                 priority: int) -> None:
        NodeCore.__init__(self, key, parent, last_access_time, creation_time, node_id, priority)
        self.evicted = False

    def __repr__(self) -> str:
        return f"PageNode(id={self.id}, pages={len(self.key)}, lock_ref={self.lock_ref})"


class PageRadixTree(PrefixWalk):
    """The paged radix cache over page ids. Sizes (``evictable_size_``, ``protected_size_``) are in pages.
    ``eviction_policy``: a name from ``evict_policy.EVICTION_POLICIES``. The leaf index and heap, the lock walk with
    its counters, ``nodes()`` and the structure version are :class:`~kvlab.mem_cache.tree_core.TreeCore`'s, as
    ``RadixCache``'s are; the walks are this tree's."""

    def __init__(self, eviction_policy: str = "lru") -> None:
        self._prio = self._use_policy(eviction_policy)
        self._reset_core(self._prio)
        self.clock = LogicalClock()
        self.root_node = self._new_node(array("q"), None, -(2**63))
        self.root_node.lock_ref = 1

    def _new_node(self, key: array, parent: PageNode | None, priority: int) -> PageNode:
        clock = self.clock
        now = clock.now = clock.now + 2  # RadixCache._new_node: two ticks
        return PageNode(key, parent, now - 1, now, self._register_node(), priority)

    # -- match / insert -------------------------------------------------------------------------
    def match_prefix(self, key: array, n: int) -> tuple[PageNode, int]:
        """``RadixCache.match_prefix`` of the first ``n`` pages of ``key``: (the node the match ends at, pages
        matched). Splits the node the match ends inside and stamps the path's access times (the shared walk,
        ``PrefixWalk._descend``)."""
        if n == 0:
            return self.root_node, 0
        now = self.clock.tick()
        root = self.root_node
        root.last_access_time = now
        node, off, _ = self._descend(key, n, root, 0, now)
        self.leaf_index.touch(node)
        return node, off

    # restamp_path (a repeated match's side effects): tree_core's

    def _split_node(self, child: PageNode, m: int) -> PageNode:
        parent = child.parent
        upper = self._new_node(child.key[:m], parent, child.priority)
        upper.hit_count = child.hit_count
        upper.lock_ref = child.lock_ref
        child.key = child.key[m:]
        child.parent = upper
        upper.children = {child.key[0]: child}
        parent.children[upper.key[0]] = upper
        return upper

    def insert(self, key: array, n: int, priority: int = 0, inserted_len: int = 0, held: PageNode | None = None,
               held_len: int = 0) -> tuple[int, PageNode]:
        """``RadixCache._insert`` of the first ``n`` pages of ``key``: (pages already cached, the node ending at
        ``n``). ``inserted_len`` (pages): nodes ending within it are not hit-counted. ``held``: a node the caller
        holds locked whose path spells ``key[:held_len]``; the walk over that path has the same effects node by
        node without comparing its pages (``RadixCache._insert``'s ``held``)."""
        now = self.clock.tick()
        node = self.root_node
        node.last_access_time = now
        if priority > node.priority:
            node.priority = priority
        off = 0
        if 0 < held_len <= n and self._holds_path(held, held_len):  # taken as matched, not compared again
            node, off = held, held_len
        node, off, split = self._descend(key, n, node, off, now)
        self._credit_path(node, off, now, priority, inserted_len, split)
        if off == n:
            self.leaf_index.touch(node)
            return off, node
        leaf = self._new_node(key[off:n], node, priority)
        self._attach_leaf(node, leaf, leaf.key[0], n > inserted_len)
        return off, leaf

    # -- locks: tree_core's inc_lock_ref / dec_lock_ref ----------------------------------------------------------

    # -- eviction -------------------------------------------------------------------------------
    def evict(self, pages: int) -> int:
        """Delete whole unlocked leaves in the policy's order until ``pages`` are freed or none is left (the last
        may overshoot). Returns the pages freed."""
        if not self.evictable_size_:  # (no unlocked node, so no evictable leaf: most calls on a full pool)
            return 0
        evicted = 0
        pop = self.leaf_index.pop
        while evicted < pages:
            x = pop()
            if x is None:
                break
            evicted += len(x.key)
            self._delete_leaf(x)
        return evicted

    def _delete_leaf(self, node: PageNode) -> None:
        self._drop_leaf(node)
        parent = node.parent
        del parent.children[node.key[0]]
        node.evicted = True
        self._update_leaf_status(parent)

    # -- invariants and the token-level view -----------------------------------------------------
    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` unless the bookkeeping is consistent: the root; children filed under their
        first page and pointing back; non-empty keys; lock counts covering the path to the root; the size counters
        equal to the pages of unlocked / locked nodes; the evictable-leaf index and heap equal to a recomputation."""
        root = self.root_node
        self._check_root("PageRadixTree")
        nodes = []
        for node in self.nodes():
            locks = 0
            for first, child in node.children.items():
                if child.parent is not node or first != child.key[0] or child.evicted:
                    raise InvariantError("PageRadixTree: each live child is filed under its first page and points back",
                                         child=child, parent=node)
                locks += child.lock_ref
            if node is root:
                continue
            if not len(node.key) or node.lock_ref < max(0, locks):
                raise InvariantError("PageRadixTree: non-empty keys, lock_ref >= the children's", node=node,
                                     children_lock_ref=locks)
            nodes.append(node)
        self._check_sizes(nodes, "PageRadixTree")
        self._check_leaf_index(nodes, "PageRadixTree")

    def to_radix_cache(self, page_keys: PageKeys, kv_tokens: int):
        """This tree as the token-level :class:`~kvlab.mem_cache.radix_cache.RadixCache` the reference run ends
        with: the same nodes (ids, keys as tokens, access and creation times, hit counts, priorities, locks), the
        same clock and sizes, over a fresh paged allocator of ``kv_tokens`` whose pages the nodes hold (slot ids
        are the simulator's own and never compared)."""
        import torch

        from kvlab.mem_cache.allocator import PagedTokenToKVPoolAllocator
        from kvlab.mem_cache.radix_cache import NO_CHILDREN, RadixCache, TreeNode

        ps = page_keys.page_size
        allocator = PagedTokenToKVPoolAllocator(kv_tokens, ps)
        cache = RadixCache(None, allocator, page_size=ps, eviction_policy=self.eviction_policy)
        made: dict[PageNode, TreeNode] = {}
        for node in self.nodes():  # (pre-order: a parent before its children)
            tokens = page_keys.tokens(node.key)
            if node is self.root_node:
                value = torch.empty(0, dtype=torch.int64)
            else:
                pages = allocator.alloc_decode_page_ids(len(node.key), len(node.key))
                require(pages is not None, "to_radix_cache: the pool holds the tree", pages=len(node.key))
                value = torch.tensor([p * ps + i for p in pages for i in range(ps)], dtype=torch.int64)
            parent = made.get(node.parent)
            twin = TreeNode(tokens, value, parent, node.last_access_time, node.creation_time, node.id, node.priority)
            twin.hit_count, twin.lock_ref = node.hit_count, node.lock_ref
            made[node] = twin
            if parent is not None:
                if parent.children is NO_CHILDREN:
                    parent.children = {}
                parent.children[cache.child_key(tokens)] = twin
        cache.adopt(made[self.root_node], self._next_id)  # (files each node's leaf status)
        cache.clock.now = self.clock.now
        cache.structure_version = self.structure_version
        cache.evictable_size_ = self.evictable_size_ * ps
        cache.protected_size_ = self.protected_size_ * ps
        return cache


class PageKeys:
    """Page contents to ids and back, for one run: equal tokens, equal id.

    A page whose tokens are consecutive integers (``range(s, s + page_size)``: every whole page of a Mooncake
    trace's hashed blocks) has id ``s``, its first token (token ids are >= 0), read from a sequence's ``range``
    segments without reading a token; any other page gets a negative id, interned by the tuple of its tokens."""

    def __init__(self, page_size: int) -> None:
        require(page_size > 1, "PageKeys: pages of more than one token", page_size=page_size)
        self.page_size = page_size
        self._ids: dict[tuple, int] = {}
        self._contents: list[tuple] = []  # -1 - id -> the tokens of a page that is not consecutive

    def of_tokens(self, tokens: Sequence[int]) -> int:
        """The id of one page of tokens."""
        t = tuple(tokens)
        ps = self.page_size
        first = t[0]
        if t[-1] - first == ps - 1 and t == tuple(range(first, first + ps)):
            return first
        i = self._ids.get(t)
        if i is None:
            self._contents.append(t)
            i = self._ids[t] = -len(self._contents)
        return i

    def of_sequence(self, tokens: Sequence[int], pages: int) -> array:
        """The ids of the first ``pages`` whole pages of ``tokens`` (a ``TokenSequence`` is read by segment)."""
        ps = self.page_size
        out = array("q")
        segments = getattr(tokens, "segments", None)
        if segments is None:
            flat = tokens if isinstance(tokens, (list, tuple, array)) else list(tokens)
            for p in range(pages):
                out.append(self.of_tokens(flat[p * ps : (p + 1) * ps]))
            return out
        head = segments[:pages]
        starts = [seg.start for seg in head if type(seg) is range and seg.step == 1 and len(seg) == ps]
        if len(starts) == pages:  # one range per page (a trace whose block size is the page size): their starts
            return array("q", starts)
        n = 0  # pages so far
        for seg, end in zip(segments, tokens.ends):
            if n >= pages:
                break
            pos = n * ps  # the first token no page id covers yet
            if pos < end:
                if pos == end - len(seg) and type(seg) is range and seg.step == 1 and end - pos >= ps:
                    # a range segment starting at a page start: its whole pages' ids are their first tokens
                    whole = min((end - pos) // ps, pages - n)
                    if whole == 1:
                        out.append(seg.start)
                    else:
                        out.extend(range(seg.start, seg.start + whole * ps, ps))
                    n += whole
                    pos += whole * ps
                while pos < end and n < pages:  # a page across segments, or of sampled tokens
                    out.append(self.of_tokens(tokens[pos : pos + ps]))
                    n += 1
                    pos += ps
        return out

    @staticmethod
    def span(tokens: Sequence[int], a: int, b: int) -> list[int]:
        """``list(tokens[a:b])`` (a ``TokenSequence`` is read from the segments it spans, not sliced)."""
        segments = getattr(tokens, "segments", None)
        if segments is None:
            return list(tokens[a:b])
        ends = tokens.ends
        k = bisect_right(ends, a)
        out: list[int] = []
        while a < b and k < len(segments):
            start = ends[k - 1] if k else 0
            seg = segments[k]
            out.extend(seg[a - start : min(b, ends[k]) - start])
            a = ends[k]
            k += 1
        return out

    def page(self, pid: int) -> range | tuple:
        """The tokens of the page ``pid``."""
        return range(pid, pid + self.page_size) if pid >= 0 else self._contents[-1 - pid]

    def tokens(self, key: Sequence[int]) -> array:
        """The tokens of the pages ``key`` (ids), as an ``array('q')``."""
        out = array("q")
        ps = self.page_size
        for i in key:
            out.extend(range(i, i + ps) if i >= 0 else self._contents[-1 - i])
        return out
