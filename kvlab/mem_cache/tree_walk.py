"""The one prefix walk the token tree (``radix_cache.RadixCache``) and the page tree (``page_tree.PageRadixTree``)
share, their match and their insert alike: the two trees walked op for op the same way (the page tree is a
page-size-1 tree over page ids, with no split chain), so the walk is written once here, apart from the tree core
(``tree_core``), which reads only key lengths, locks, access times, ids and priorities. What each tree does around
the walk (the token tree's slot runs and replayed match, the page tree's page ids), its split (what its nodes hold)
and its leaf rule stay with the tree; the two-tier trees (``hicache.two_tier_core``) and the SWA / Mamba trees walk
their own way (tiers, tombstones). No torch here.
"""

from __future__ import annotations

from typing import Any

from kvlab.mem_cache.base_prefix_cache import common_prefix_len
from kvlab.mem_cache.tree_core import TreeCore


class ChainlessNode:
    """A node of a tree the walk follows with no split chain (the page tree's): ``_next``, the child continuing this
    node's run that :meth:`PrefixWalk._descend` tries before the children, is always None (the token tree's
    ``TreeNode`` keeps a real one)."""

    __slots__ = ()
    _next = None


class PrefixWalk(TreeCore):
    """A tree core whose match and insert walk down by :meth:`_descend`; the tree gives :meth:`_split_node`."""

    def _descend(self, key, n: int, node, off: int, now: int, ps: int = 1) -> tuple[Any, int, bool]:
        """The walk down the tree that the token tree (``RadixCache``) and the page tree (``PageRadixTree``) share,
        their match and their insert alike (SGLang's ``_match_prefix_helper`` / ``_insert_helper`` loop): from
        ``node``, whose path spells ``key[:off]``, along ``key[:n]`` edge by edge (children filed by their first
        token, or by the bytes of their first page of ``ps`` tokens). Each child read gets ``now`` as access time.
        An edge the key diverges inside is split there (:meth:`_split_node`, on a page boundary): the upper half is
        the last node matched, the lower half keeps its leaf status with a fresh entry for its new access time, and
        the walk ends. Returns (the last node matched, where its path ends in ``key``, whether it is a split's upper
        half). An insert then credits the path (:meth:`_credit_path`).

        A node's ``_next`` (the token tree's split chain: the child continuing its slot tensor; None on the page tree)
        is tried before its children, with no lookup."""
        while off < n:
            child = node._next
            while child is not None:
                ckey = child.key
                end = off + len(ckey)
                if end > n or ckey != key[off:end]:
                    break
                child.last_access_time = now
                node = child
                off = end
                child = child._next
            if off == n:
                break
            child = node.children.get(key[off] if ps == 1 else key[off : off + ps].tobytes())
            if child is None:
                break
            child.last_access_time = now
            ckey = child.key
            end = off + len(ckey)
            if end <= n and ckey == key[off:end]:
                node = child
                off = end
                continue
            m = common_prefix_len(ckey, key, off, n)  # the key diverges inside this edge: split it, and stop there
            node = self._split_node(child, m if ps == 1 else m - m % ps)
            self.leaf_index.touch(child)
            return node, off + len(node.key), True
        return node, off, False

    def _split_node(self, child, split_len: int):
        """``child`` -> ``upper[:split_len]`` -> ``child[split_len:]`` (each tree's own: what its nodes hold); returns
        the upper half."""
        raise NotImplementedError
