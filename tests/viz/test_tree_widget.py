"""The radix tree widget headless: change the cache (or click a button), refresh, assert on the icicle's arrays."""

import pytest

from kvlab.experiments.tree_demo import TreeDemo
from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
from kvlab.mem_cache.common import match_alloc_insert
from kvlab.mem_cache.radix_cache import RadixCache
from kvlab.mem_cache.tree_view import tree_frame
from kvlab.viz.plots import TREE_COLOURS
from kvlab.viz.tree_widget import RadixTreeWidget, TreeDemoPanel


def _cache():
    alloc = TokenToKVPoolAllocator(1024)
    cache = RadixCache(None, alloc, page_size=1)
    for key in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [20, 21, 22]):
        match_alloc_insert(cache, key)
    return cache


def _colour_of(widget, node_id):
    trace = widget.figure.data[0]
    return trace.marker.colors[list(trace.ids).index(str(node_id))]


def test_icicle_arrays_are_the_tree_frame():
    cache = _cache()
    w = RadixTreeWidget(cache, title="t")
    frame = tree_frame(cache)
    trace = w.figure.data[0]
    assert list(trace.ids) == [str(i) for i in frame["id"]]
    assert list(trace.values) == list(frame["path_tokens"])
    assert trace.values[0] == 8 + 6 + 3  # root: the cached sequences' tokens
    parents = dict(zip(trace.ids, trace.parents))
    assert parents["0"] == "" and all(p in parents for p in parents.values() if p)
    assert w.node_count == 5  # root, [1..4], [5..8], [9 9], [20..22]
    assert "kvlab-tree-fig" in w.figure._dom_classes and "kvlab-tree-widget" in w.widget._dom_classes
    assert "data-nodes='5'" in w.summary.value and "data-evictable='13'" in w.summary.value


def test_refresh_redraws_the_synced_figure_after_lock_insert_and_evict():
    cache = _cache()
    w = RadixTreeWidget(cache)
    leaf = cache.match_prefix([20, 21, 22]).last_device_node
    assert _colour_of(w, leaf.id) == TREE_COLOURS["evictable"]
    cache.inc_lock_ref(leaf)
    w.refresh()
    synced = w.figure.get_state()["_widget_data"][0]  # what a view attaching now is sent
    assert synced["marker"]["colors"][synced["ids"].index(str(leaf.id))] == TREE_COLOURS["locked"]
    assert _colour_of(w, leaf.id) == TREE_COLOURS["locked"]
    assert "data-protected='3'" in w.summary.value
    assert match_alloc_insert(cache, [1, 2, 3, 4, 5, 6, 40, 41, 42]).prefix_len == 6
    w.refresh()
    assert w.node_count == 7  # [5..8] split into [5, 6] + [7, 8], and the new [40..42]
    assert w.figure.data[0].values[0] == 17 + 9
    cache.evict(100)  # everything unlocked goes
    w.refresh()
    assert set(w.figure.data[0].ids) == {"0", str(leaf.id)}
    cache.check_invariants()


def test_hover_carries_key_preview_last_access_and_hits():
    cache = _cache()
    cache.match_prefix([1, 2, 3, 4, 9, 9])
    w = RadixTreeWidget(cache, names={1: "shared prefix"})
    trace = w.figure.data[0]
    i = list(trace.labels).index("shared prefix")
    tokens, status, lock_ref, last_access, hits, prefix, preview, state = trace.customdata[i]
    assert state == ""  # a plain radix tree's nodes have no second component
    node = cache.root_node.children[1]
    assert (tokens, status, lock_ref, last_access, hits) == (4, "internal", 0, node.last_access_time, node.hit_count)
    assert preview == "[1, 2, 3, 4]" and hits >= 2  # hit by the second and third inserts
    assert "%{customdata[6]}" in trace.hovertemplate and "hits %{customdata[4]}" in trace.hovertemplate


def test_max_nodes_draws_a_tree_and_says_what_it_left_out():
    alloc = TokenToKVPoolAllocator(1024)
    cache = RadixCache(None, alloc, page_size=1)
    for i in range(10):
        match_alloc_insert(cache, [1, 2, 100 + i])
    w = RadixTreeWidget(cache, max_nodes=5)
    trace = w.figure.data[0]
    assert len(trace.ids) == 5 and set(p for p in trace.parents if p) <= set(trace.ids)
    assert "first 5 of 12 nodes" in w.figure.figure.layout.title.text


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="max_nodes must be an int >= 2.*got 1"):
        RadixTreeWidget(_cache(), max_nodes=1)
    with pytest.raises(TypeError, match="cache must be a radix tree.*got dict"):
        RadixTreeWidget({})


# ---- the demo driver and its panel ----------------------------------------------------------

def test_demo_is_seeded_and_keeps_the_running_request_locked():
    a, b = TreeDemo(seed=3), TreeDemo(seed=3)
    for demo in (a, b):
        for _ in range(12):
            demo.next_request()
        demo.pressure_event()
    assert a.history_frame().equals(b.history_frame())
    assert a.requests != TreeDemo(seed=4).requests
    locked = tree_frame(a.cache).query("status == 'locked'")
    assert len(locked) >= 1 and a.cache.protected_size() == len(a.requests[11][1])


def test_demo_pressure_event_evicts_the_shortfall_or_the_whole_need():
    fix, bug = TreeDemo(mode="shortfall"), TreeDemo(mode="full")
    for demo in (fix, bug):
        for _ in range(8):
            demo.next_request()
    s, f = fix.pressure_event(256), bug.pressure_event(256)
    assert s.evict.shortfall_tokens == f.evict.shortfall_tokens == 256
    assert s.evict.requested_tokens == 256 and s.evict.over_evicted_tokens == 0
    assert f.evict.requested_tokens == f.num_tokens and f.evict.over_evicted_tokens > 0
    assert bug.cache.total_size() < fix.cache.total_size()


def test_demo_bad_input_is_named():
    with pytest.raises(ValueError, match="mode must be one of.*got 'half'"):
        TreeDemo(mode="half")
    with pytest.raises(ValueError, match="capacity_tokens=100 is too small"):
        TreeDemo(capacity_tokens=100)
    with pytest.raises(ValueError, match="shortfall_tokens must be >= 1, got 0"):
        TreeDemo().pressure_event(0)


def test_panel_buttons_step_the_demo_and_redraw():
    panel = TreeDemoPanel(start_requests=3)
    trace = lambda: panel.tree.figure.data[0]  # noqa: E731
    before = list(trace().values)
    panel.next_button.click()
    assert panel.demo.requests_run == 4
    assert list(trace().values) != before and "data-steps='4'" in panel.log.value
    assert list(trace().values) == [int(v) for v in tree_frame(panel.demo.cache)["path_tokens"]]
    ids_before = set(trace().ids)
    panel.mode.value = "full"
    panel.pressure_button.click()
    step = panel.demo.history[-1]
    assert step.kind == "pressure" and step.evict.over_evicted_tokens > 0 and panel.demo.mode == "full"
    assert set(trace().ids) - {"__gone__"} < ids_before  # leaves evicted (the pale block stands for them)
    assert "pressure event" in panel.log.value
    panel.reset_button.click()
    assert list(trace().ids) == ["0"] and panel.demo.requests_run == 0
    assert panel.errors.outputs == ()


def test_panel_disables_next_when_done_and_shows_errors_in_the_panel():
    panel = TreeDemoPanel(num_requests=2)
    panel.next_button.click()
    panel.next_button.click()
    assert panel.next_button.disabled
    panel.next_button.click()  # a click that slips through lands in the panel's errors, not the log
    assert "all 2 requests have run" in panel.errors.outputs[0]["text"]


def test_a_mamba_tree_outlines_nodes_with_a_state_and_hatches_tombstones():
    """On a hybrid tree the drawing says which nodes a hit can resume from (outlined, hover names the slot)
    and which are tombstones (hatched), with a legend for both; labels are positions, not token ids."""
    from kvlab.experiments import hybrid_caches
    from kvlab.mem_cache.tree_view import STATE_MAMBA, STATE_MAMBA_TOMBSTONE, tree_frame

    cache, _freed = hybrid_caches.state_eviction()
    w = RadixTreeWidget(cache)
    frame = tree_frame(cache, names="spans")
    trace = w.figure.data[0]
    assert list(trace.labels) == frame["label"].astype(str).tolist() and trace.labels[1].startswith("tokens ")
    widths, shapes = list(trace.marker.line.width), list(trace.marker.pattern.shape)
    for i, row in frame.iterrows():
        assert (widths[i] == 3) == bool(row["has_state"])
        assert (shapes[i] == "/") == ("tombstone" in row["state"])
        if row["state"] == STATE_MAMBA:
            assert f"{STATE_MAMBA} in slot {int(row['mamba_slot'])}" in trace.customdata[i][7]
    assert (frame["state"] == STATE_MAMBA_TOMBSTONE).any() and frame["has_state"].any()
    assert "outlined" in w.legend.value and "hatched" in w.legend.value


def test_a_pressure_event_is_drawn_at_the_pre_event_width():
    """After an eviction the icicle keeps the width of the tree before it: a pale block is what went, so the
    drawing does not stretch the survivors over the whole width."""
    panel = TreeDemoPanel(start_requests=6, seed=0)
    before = panel.tree.cached_tokens
    panel.mode.value = "full"
    panel.pressure_event()
    trace = panel.tree.figure.data[0]
    after = panel.tree.cached_tokens
    assert after < before and trace.values[0] == before  # the root spans the pre-event total
    assert trace.ids[-1] == "__gone__" and trace.values[-1] == before - after
    # labelled with the KV tokens evicted (what the log says), not its width, which counts a shared prefix once
    # per sequence through it (2,679 drawn for 1,271 evicted on this seed)
    evicted = panel.demo.history[-1].evict.evicted_tokens
    assert trace.labels[-1] == f"evicted by the pressure event: {evicted:,} tokens" and evicted < before - after
    assert f"evicted {evicted:,}" in panel.log.value and trace.customdata[-1][0] == evicted
    assert panel.tree.figure.figure.layout.uniformtext.minsize >= 10  # no 6 px labels
    panel.next_request()  # the next drawing is the tree as it is
    assert "__gone__" not in panel.tree.figure.data[0].ids
