"""tree_frame(): a radix tree as rows, checked against the tree's own accounting."""


from kvlab.experiments.shortfall_eviction import pressure_event
from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
from kvlab.mem_cache.common import match_alloc_insert
from kvlab.mem_cache.radix_cache import RadixCache
from kvlab.mem_cache.tree_view import tree_frame
from kvlab.viz import plots


def _tree():
    alloc = TokenToKVPoolAllocator(256)
    tree = RadixCache(None, alloc)
    for key in ([1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 8]):
        match_alloc_insert(tree, key)
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
    def leaves(f):
        return set(f.loc[f["status"] == "evictable", "label"])
    assert leaves(fix.frame_before) - leaves(fix.frame_after) == {"conv 1: 200", "conv 2: 250"}
    assert leaves(fix.frame_after) - leaves(bug.frame_after) == {"conv 3: 300"}
    fig = plots.radix_icicles_side_by_side([fix.frame_before, fix.frame_after, bug.frame_after], ["a", "b", "c"])
    assert len(fig.data) == 3 and list(fig.data[2].values)[0] == bug.frame_after["path_tokens"].iloc[0]


def test_plain_tree_has_empty_hybrid_columns_and_a_key_preview():
    frame = tree_frame(_tree())
    assert (frame["state"] == "").all() and not frame["has_state"].any() and not frame["swa_tombstone"].any()
    assert frame["mamba_slot"].isna().all() and str(frame["mamba_slot"].dtype) == "Int64"
    row = frame[frame["tokens"] == 3].iloc[0]
    assert row["key_preview"] == "[1, 2, 3]" == row["label"]


def test_span_labels_and_named_labels():
    tree = _tree()
    spans = tree_frame(tree, names="spans").set_index("key_preview")
    assert spans.loc["[1, 2, 3]", "label"] == "tokens 1–3" and spans.loc["[4, 5]", "label"] == "tokens 4–5"
    named = tree_frame(tree, names=lambda node: "system" if node.key[0] == 1 else None).set_index("key_preview")
    assert named.loc["[1, 2, 3]", "label"] == "system" and named.loc["[9]", "label"] == "[9]"
    import pytest

    with pytest.raises(ValueError, match="names must be a dict, a function or 'spans'"):
        tree_frame(tree, names="span")


def test_mamba_states_and_swa_tombstones_are_columns():
    from kvlab.experiments import hybrid_caches

    cache, _ = hybrid_caches.resume_scenario()
    frame = tree_frame(cache, names="spans").set_index("id")
    for node in cache.nodes():
        if node is cache.root_node:
            continue
        row = frame.loc[node.id]
        assert bool(row["has_state"]) == (node.mamba_value is not None)
        assert (row["mamba_slot"] if row["has_state"] else None) == node.mamba_value
        assert row["state"] == ("recurrent state" if node.mamba_value is not None else "no state (Mamba tombstone)")
        assert row["label"].endswith("· state" if node.mamba_value is not None else "· no state")
    _, event = hybrid_caches.swa_walkthrough()
    swa_cache, _ = hybrid_caches.swa_walkthrough()
    swa = tree_frame(swa_cache, names="spans")
    tombstones = {n.id for n in swa_cache.nodes() if n.swa_tombstone}
    assert set(swa.loc[swa["swa_tombstone"], "id"]) == tombstones and len(tombstones) == event.tombstones
    assert (swa.loc[swa["swa_tombstone"], "state"] == "SWA tombstone").all()
    assert not swa["has_state"].any()


def test_the_view_reads_the_tree_kind_not_its_attributes():
    """A plain radix tree that happens to carry an attribute of a hybrid tree is still read as plain (the view
    once guessed the kind from ``mamba_pool`` / ``sliding_window_size``, and then read node fields it lacks)."""
    cache = RadixCache(token_to_kv_pool_allocator=TokenToKVPoolAllocator(32))
    cache.insert([1, 2, 3], cache.token_to_kv_pool_allocator.alloc(3))
    cache.sliding_window_size = 4  # e.g. a notebook noting the window it means to compare with
    frame = tree_frame(cache)
    assert cache.kind == "radix"
    assert list(frame["state"]) == ["", ""] and not frame["swa_tombstone"].any()
