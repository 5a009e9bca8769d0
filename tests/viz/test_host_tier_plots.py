"""Notebook 07's figures and the two-tier tree widget draw what the tree holds: residency colours, destroyed nodes
hatched, numbers on the bars equal to the runs."""

from __future__ import annotations

import pytest

from kvlab.experiments import host_tier as ht
from kvlab.mem_cache.tree_view import tree_frame
from kvlab.viz import host_tier_plots as hp
from kvlab.viz.plots import LOCKED_OUTLINE, RESIDENCY_COLOURS
from kvlab.viz.tree_widget import HostTierPanel, RadixTreeWidget


@pytest.fixture(scope="module")
def policy_numbers():
    from kvlab.experiments import host_tier_sweep as hts

    sweep = hts.host_sweep(kv_pages=[hts.CURVE_POOL_PAGES], host_ratios=hts.POLICY_HOST_RATIOS,
                           policies=hts.POLICIES, processes=1)
    return hts.policy_numbers(sweep)


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


def test_policy_bars_carry_the_runs_numbers(policy_numbers):
    fig = hp.policy_bars(policy_numbers)
    bars = [t for t in fig.data if t.xaxis == "x2" and t.name == "host ratio 1"]  # written to host, ratio 1
    at = policy_numbers[policy_numbers["host_ratio"] == 1.0]
    assert list(bars[0].x) == at["written_gib"].tolist() and list(bars[0].y) == list(ht.POLICIES)
    with pytest.raises(ValueError, match="lacks columns"):
        hp.policy_bars(policy_numbers.drop(columns=["hit_rate"]))


def test_policy_bars_are_laid_out_to_stay_legible_at_laptop_width(policy_numbers):
    """Issue 35: four panels in a row ran the x labels together ("write_throughwrite_through…") and merged 7 px
    value labels. Now a 2 × 2 grid of horizontal bars: policy names on the y axis, values of 12 px beside the bars,
    and room on the axis for them."""
    fig = hp.policy_bars(policy_numbers)
    bars = [t for t in fig.data if t.type == "bar"]
    assert {t.orientation for t in bars} == {"h"} and min(t.textfont.size for t in bars) >= 12
    axes = [fig.layout[f"xaxis{i or ''}"] for i in ("", 2, 3, 4)]
    assert len({tuple(a.domain) for a in axes}) == 2 and all(a.domain[1] - a.domain[0] > 0.3 for a in axes)
    for k, axis in enumerate(axes):  # every panel leaves room right of its longest bar for the bar's label
        longest = max(max(t.x) for t in bars if t.xaxis == f"x{k + 1 if k else ''}")
        assert axis.range[1] >= 1.2 * longest


def test_icicle_titles_are_written_once_and_labels_are_readable():
    """Issue 35: each panel's title repeated the scenario ("write_through_selective, host pool … before the event")
    and ran into its neighbours; leaf labels shrank to ~5 px. Column titles now stand once over the top row, each
    row's scenario once across its row, and a label under 11 px is hidden, not shrunk."""
    events = ht.pressure_events()
    rows = [(ht.scenario_label(p, r, events[(p, r, "full")].host_tokens), events[(p, r, "full")].frame_before,
             [events[(p, r, m)].frame_after for m in ("full", "shortfall")]) for p, r in ht.EVENT_SCENARIOS]
    fig = hp.host_tier_icicles(rows, ["before", "bug", "fix"])
    texts = [a.text for a in fig.layout.annotations]
    assert texts.count("before") == texts.count("bug") == texts.count("fix") == 1
    assert sum(1 for t in texts if "host pool" in t) == len(rows)
    assert fig.layout.uniformtext.minsize >= 11 and fig.layout.uniformtext.mode == "hide"


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


def test_host_tier_panel_switching_the_write_policy_replays_the_same_steps():
    """Issue 35: switching the policy emptied the tree (30 requests gone). It now runs the same steps again, in the
    same modes, under the new policy: the tree is the one a fresh demo under that policy would have."""
    panel = HostTierPanel(start_requests=30, seed=0)
    panel.pressure_event()
    panel.write_policy.value = "write_back"
    assert panel.demo.cache.write_policy == "write_back" and panel.demo.requests_run == 30
    assert [s.kind for s in panel.demo.history] == ["request"] * 30 + ["pressure"]
    oracle = ht.HostTierDemo(seed=0, write_policy="write_back")
    for _ in range(30):
        oracle.next_request()
    oracle.pressure_event()
    mine, theirs = tree_frame(panel.demo.cache), tree_frame(oracle.cache)
    assert mine[["path_tokens", "residency"]].equals(theirs[["path_tokens", "residency"]])
    assert list(panel.tree.figure.data[0].values) == mine["path_tokens"].tolist()  # what is drawn
    assert "host" in set(mine["residency"])  # write_back: what the pressure event evicted was written first


def test_host_tier_panel_shows_the_tree_first_and_outlines_what_a_step_changed():
    """Issue 35: at 720 px the tree started below the fold, and an event did not show what it changed. The tree
    now comes right under the controls (the log under it), and the nodes a step moved are outlined gold."""
    from kvlab.viz.tree_widget import CHANGED_OUTLINE

    panel = HostTierPanel(start_requests=30, seed=0)
    assert panel.shell.results.children[0] is panel.tree.widget and panel.shell.results.children[1] is panel.log
    step = panel.pressure_event()
    before = ht.HostTierDemo(seed=0)
    for _ in range(30):
        before.next_request()
    was = before.residencies()
    now = panel.demo.residencies()
    assert step.changed and set(step.changed) == {i for i, r in now.items() if was.get(i) != r}
    trace = panel.tree.figure.data[0]
    frame = tree_frame(panel.demo.cache)
    gold = {int(i) for i, c in zip(trace.ids, trace.marker.line.color) if c == CHANGED_OUTLINE["color"]}
    assert gold == {i for i in step.changed if frame.set_index("id").loc[i, "status"] != "locked"} and gold
    assert "changed by the last step" in panel.tree.legend.value


def test_under_write_back_the_log_says_the_pages_were_written_first():
    panel = HostTierPanel(start_requests=30, seed=0, write_policy="write_back")
    step = panel.pressure_event()
    assert step.evict.written_back_tokens > 0
    assert f"{step.evict.written_back_tokens:,} of them written to host first" in panel.log.value
    through = HostTierPanel(start_requests=30, seed=0).pressure_event()
    assert "written to host first" not in through.text()  # write_through: already backed up, nothing to write
