"""The two-tier tree's leaf indexes: the device leaves and the host leaves, each a set and a long-lived heap.

Upstream: ``sglang/srt/mem_cache/hiradix_cache.py`` (0.5.16): ``RadixCache._update_leaf_status`` /
``HiRadixCache._update_host_leaf_status`` (the sets) and ``_make_eviction_heap`` / ``_promote_parent`` /
``evict_host``'s heapify (a heap built on each call). kvlab keeps one heap per tier across calls; the victims and
their order are the same. A mixin of :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from kvlab.mem_cache.hicache.tree_node import HiTreeNode


class HiLeafIndex:
    """The leaf-index methods of :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` (a mixin). They
    read and write the tree's ``evictable_leaves`` / ``evictable_host_leaves`` sets, its ``_dheap`` / ``_hheap``
    heaps and the ``_evicting`` / ``_host_evicting`` flags (no rebuild during an eviction)."""

    evictable_leaves: set[HiTreeNode]
    evictable_host_leaves: set[HiTreeNode]
    _dheap: list
    _hheap: list
    _evicting: bool
    _host_evicting: bool
    _priority_of: Callable[[HiTreeNode], int]

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
        node.dev_heap_ver += 1
        heap = self._dheap
        heapq.heappush(heap, (self._priority_of(node), node.last_access_time, node.id, node.dev_heap_ver, node))
        if len(heap) > 2 * len(self.evictable_leaves) + 64 and not self._evicting:
            self._dheap = self._rebuild(self.evictable_leaves, "dev_heap_ver")

    def _push_host(self, node: HiTreeNode) -> None:
        node.host_heap_ver += 1
        heap = self._hheap
        heapq.heappush(heap, (self._priority_of(node), node.last_access_time, node.id, node.host_heap_ver, node))
        if len(heap) > 2 * len(self.evictable_host_leaves) + 64 and not self._host_evicting:
            self._hheap = self._rebuild(self.evictable_host_leaves, "host_heap_ver")

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
