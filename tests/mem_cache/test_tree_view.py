"""tree_frame(): a radix tree as rows, checked against the tree's own accounting."""

import torch

from kvlab.experiments.shortfall_eviction import pressure_event
from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
from kvlab.mem_cache.radix_cache import RadixCache
from kvlab.mem_cache.tree_view import tree_frame
from kvlab.viz import plots


def _tree():
    alloc = TokenToKVPoolAllocator(256)
    tree = RadixCache(None, alloc)
    for key in ([1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 8]):
        m = tree.match_prefix(key)
        tree.insert(key, torch.cat([m.device_indices, alloc.alloc(len(key) - m.device_prefix_len)]))
    return tree


def test_rows_match_the_tree():
    tree = _tree()
    node = tree.match_prefix([7, 8]).last_device_node
    tree.inc_lock_ref(node)
    frame = tree_frame(tree)
    root = frame[frame["status"] == "root"].iloc[0]
    assert root["subtree_tokens"] == tree.total_size() == 2 + 3 + 2 + 1  # [7,8], [1,2,3], [4,5], [9]
    assert root["path_tokens"] == 5 + 4 + 2  # the three cached sequences
    by_status = frame.groupby("status")["tokens"].sum().to_dict()
    assert by_status["locked"] == tree.protected_size() == 2
    assert by_status["evictable"] + by_status.get("internal", 0) == tree.evictable_size() == 6
    assert set(frame.loc[frame["status"] == "internal", "prefix_tokens"]) == {3}


def test_pressure_event_trees_show_the_extra_victim():
    fix, bug = pressure_event("shortfall"), pressure_event("full")
    leaves = lambda f: set(f.loc[f["status"] == "evictable", "label"])
    assert leaves(fix.frame_before) - leaves(fix.frame_after) == {"conv 1: 200", "conv 2: 250"}
    assert leaves(fix.frame_after) - leaves(bug.frame_after) == {"conv 3: 300"}
    fig = plots.radix_icicles_side_by_side([fix.frame_before, fix.frame_after, bug.frame_after], ["a", "b", "c"])
    assert len(fig.data) == 3 and list(fig.data[2].values)[0] == bug.frame_after["path_tokens"].iloc[0]
