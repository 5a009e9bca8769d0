"""The tree core (kvlab/mem_cache/tree_core.py): one leaf index and heap, one lock walk, one ``nodes()``, used by the
token tree, the page tree and both tiers of the two-tier tree (issue 33 item 3)."""

from __future__ import annotations

import random

import pytest

from kvlab.errors import InvariantError
from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
from kvlab.mem_cache.page_tree import PageRadixTree
from kvlab.mem_cache.radix_cache import RadixCache
from kvlab.mem_cache.tree_core import LeafIndex, TreeCore

SHARED = ("inc_lock_ref", "dec_lock_ref", "nodes", "_drop_leaf", "_register_node", "evictable_size", "total_size")


@pytest.mark.parametrize("tree", [RadixCache, PageRadixTree, HiRadixCache])
def test_each_tree_runs_the_core_not_a_copy(tree):
    """The lock walk, ``nodes()``, the version bumps and the size counters are the core's, not the tree's own."""
    assert issubclass(tree, TreeCore)
    for name in SHARED:
        assert getattr(tree, name) is getattr(TreeCore, name), f"{tree.__name__}.{name} is not TreeCore's"
    for name in ("_push", "_pop_victim", "_push_dev", "_push_host", "_pop", "_rebuild"):
        assert not hasattr(tree, name), f"{tree.__name__} keeps a heap of its own ({name})"


def test_every_tier_indexes_its_leaves_with_the_core():
    from kvlab.mem_cache import PagedTokenToKVPoolAllocator
    from kvlab.mem_cache.hicache import HostKVCache

    alloc = PagedTokenToKVPoolAllocator(64, 4)
    hi = HiRadixCache(None, alloc, HostKVCache(64, 1000, 4), page_size=4)
    trees = [RadixCache(None, alloc, page_size=4), PageRadixTree(), hi]
    indexes = [t.leaf_index for t in trees] + [hi.host_leaf_index]
    assert all(type(i) is LeafIndex for i in indexes) and len({id(i) for i in indexes}) == 4


class _Node:
    def __init__(self, node_id: int, last_access_time: int) -> None:
        self.id, self.last_access_time = node_id, last_access_time


def _node(i: int, prio: int) -> _Node:
    return _Node(i, prio)


def test_leaf_index_pops_what_a_fresh_heapify_would():
    """Random pushes, touches (sort key changed), discards and re-files: each pop is the smallest sort key among the
    leaves, across rebuilds (stale entries outnumbering live ones)."""
    rng = random.Random(0)
    nodes = [_node(i, rng.randrange(50)) for i in range(200)]
    index = LeafIndex(lambda n: 0)
    for _ in range(3000):
        node = rng.choice(nodes)
        op = rng.random()
        if op < 0.4:
            index.file(node, True)
        elif op < 0.6:
            node.last_access_time = rng.randrange(50)
            index.touch(node)
        elif op < 0.8:
            index.discard(node)
        elif index.leaves:
            want = min(index.leaves, key=lambda n: (n.last_access_time, n.id))
            assert index.pop() is want
            index.discard(want)
    index.check(set(index.leaves), "index", "entry")
    assert len(index.heap) <= 2 * len(index.leaves) + 65


def test_leaf_index_check_names_a_stale_entry():
    index = LeafIndex(lambda n: 0)
    node = _node(1, 5)
    index.push(node)
    node.last_access_time = 9  # its sort key changed without a fresh entry
    with pytest.raises(InvariantError, match="entry rule"):
        index.check({node}, "index rule", "entry rule")
    with pytest.raises(InvariantError, match="index rule"):
        index.check(set(), "index rule", "entry rule")
