"""The two-tier tree's leaf rules: which node is an evictable leaf of the device tier and of the host tier.

Upstream: ``sglang/srt/mem_cache/hiradix_cache.py`` (0.5.16): ``RadixCache._update_leaf_status`` /
``HiRadixCache._update_host_leaf_status`` (the sets) and ``_make_eviction_heap`` / ``_promote_parent`` /
``evict_host``'s heapify (a heap built on each call). The index and heap of each tier are the tree core's
(:class:`~kvlab.mem_cache.tree_core.LeafIndex`, as the token and page trees use it: one heap per tier kept across
calls; the victims and their order are the same). A mixin of
:class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache`.
"""

from __future__ import annotations

from collections.abc import Callable

from kvlab.mem_cache.hicache.tree_node import HiTreeNode
from kvlab.mem_cache.tree_core import LeafIndex


class HiLeafIndex:
    """The leaf-rule methods of :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` (a mixin): they file
    nodes in the tree's ``leaf_index`` (device leaves) and ``host_leaf_index`` (host leaves)."""

    __slots__ = ()  # (a mixin: the tree that uses it lists its fields, see PageHiRadixTree.__slots__)

    leaf_index: LeafIndex
    host_leaf_index: LeafIndex
    _priority_of: Callable[[HiTreeNode], int]

    @property
    def evictable_host_leaves(self):
        """The host tier's evictable leaves: a live, read-only view of its index."""
        return self.host_leaf_index.leaves.keys()

    def adopt(self, root_node, next_id: int) -> None:
        """``TreeCore.adopt`` (a tree built node by node), each node's host-leaf status filed too."""
        super().adopt(root_node, next_id)
        for node in self.nodes():
            if node is not root_node:
                self._update_host_leaf_status(node)

    def _prio(self, node: HiTreeNode) -> tuple:
        return (self._priority_of(node), node.last_access_time, node.id)

    def _touch(self, node: HiTreeNode) -> None:
        """``node``'s sort key changed (access time, hit count, priority): a leaf gets a fresh heap entry (a node is
        a leaf of one tier at most: a device leaf is on the device, a host leaf is not)."""
        dev = self.leaf_index
        if node in dev.leaves:
            dev.push(node)
            return
        host = self.host_leaf_index
        if node in host.leaves:
            host.push(node)

    def _update_leaf_status(self, node: HiTreeNode) -> None:
        """A device leaf: on the device, unlocked, and no child on the device (``LeafIndex.file``, inlined: the lock
        walk's unlocks and every demotion file a node; the children read in a loop, no generator made)."""
        index = self.leaf_index
        if node.value is None or node.lock_ref > 0:
            index.leaves.pop(node, None)
            return
        for child in node.children.values():
            if child.value is not None:
                index.leaves.pop(node, None)
                return
        if node not in index.leaves:
            index.push(node)

    def _update_host_leaf_status(self, node: HiTreeNode) -> None:
        """A host leaf: host-only, unlocked, and no child with a host copy (``LeafIndex.file``, inlined)."""
        index = self.host_leaf_index
        if node.value is not None or node.lock_ref > 0:
            index.leaves.pop(node, None)
            return
        for child in node.children.values():
            if child.host_value is not None:
                index.leaves.pop(node, None)
                return
        if node not in index.leaves:
            index.push(node)
