"""Notebook 07's figures and the two-tier tree widget draw what the tree holds: residency colours, destroyed nodes
hatched, numbers on the bars equal to the runs."""

from __future__ import annotations

import pytest

from kvlab.experiments import host_tier as ht
from kvlab.mem_cache.tree_view import tree_frame
from kvlab.viz import host_tier_plots as hp
from kvlab.viz.plots import LOCKED_OUTLINE, RESIDENCY_COLOURS
from kvlab.viz.tree_widget import HostTierPanel, RadixTreeWidget


def _colour(trace, node_id):
    return trace.marker.colors[list(trace.ids).index(str(node_id))]


def test_icicles_colour_by_residency_and_hatch_the_destroyed():
    fix, bug = (ht.pressure_event(m, "write_through") for m in ("shortfall", "full"))
    fig = hp.host_tier_icicles([("write_through", fix.frame_before, [fix.frame_after, bug.frame_after])],
                               ["before", "fix", "bug"])
    before, after_fix, after_bug = fig.data[:3]
    ids = bug.fates.set_index("name")["id"]
    assert _colour(before, ids["conversation 1"]) == RESIDENCY_COLOURS["both"]
    assert _colour(after_fix, ids["conversation 1"]) == RESIDENCY_COLOURS["host"]  # demoted
    assert _colour(before, ids["conversation 4"]) == RESIDENCY_COLOURS["device"]
    i = list(after_bug.ids).index(str(ids["conversation 4"]))
    assert after_bug.marker.pattern.shape[i] == "/" and "destroyed" in after_bug.customdata[i][1]
    j = list(after_fix.ids).index(str(ids["conversation 4"]))
    assert after_fix.marker.pattern.shape[j] == "" and _colour(after_fix, ids["conversation 4"]) == \
        RESIDENCY_COLOURS["device"]
    legend = {t.name for t in fig.data if t.type == "scatter"}
    assert any("destroyed" in n for n in legend) and any("host only" in n for n in legend)
    with pytest.raises(ValueError, match="2 panels but 3 columns"):
        hp.host_tier_icicles([("x", fix.frame_before, [fix.frame_after])], ["a", "b", "c"])


def test_policy_bars_carry_the_runs_numbers():
    runs = ht.policy_runs(num_requests=20)
    fig = hp.policy_bars(ht.policy_numbers(runs))
    written = [t for t in fig.data if t.xaxis == "x" and t.name.startswith("full")][0]
    assert list(written.y) == [runs[(p, "full")].written_to_host_tokens for p in ht.POLICIES]
    with pytest.raises(ValueError, match="lacks columns"):
        hp.policy_bars(ht.policy_numbers(runs).drop(columns=["hit_rate"]))


def test_the_tree_widget_colours_a_two_tier_tree_by_residency_and_outlines_locks():
    demo = ht.HostTierDemo(seed=0)
    for _ in range(30):
        demo.next_request()
    demo.pressure_event()
    w = RadixTreeWidget(demo.cache, names=demo.names)
    trace = w.figure.data[0]  # what the synced state draws
    frame = tree_frame(demo.cache, names=demo.names)
    assert set(frame["residency"]) == {"", "both", "host"} and "locked" in set(frame["status"])
    for node_id, residency, status in zip(frame["id"], frame["residency"], frame["status"]):
        if residency:
            assert _colour(trace, node_id) == RESIDENCY_COLOURS[residency]
        i = list(trace.ids).index(str(node_id))
        assert (trace.marker.line.color[i] == LOCKED_OUTLINE["color"]) == (status == "locked")
    host_only = sum(int(t) for t, r in zip(frame["tokens"], frame["residency"]) if r == "host")
    assert f"data-host-only='{host_only}'" in w.summary.value and "host only (L2)" in w.legend.value


def test_host_tier_panel_switches_the_write_policy_and_starts_over():
    panel = HostTierPanel(start_requests=5, seed=0)
    assert panel.demo.requests_run == 5
    panel.write_policy.value = "write_back"
    assert panel.demo.cache.write_policy == "write_back" and panel.demo.requests_run == 0
    panel.next_request()
    assert "kvlab-host-tier-panel" in panel.widget._dom_classes
    assert set(tree_frame(panel.demo.cache)["residency"]) == {"", "device"}  # write_back: nothing on host yet
