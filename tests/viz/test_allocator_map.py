"""The allocator tour's state-history figure: one group of bar traces per segment, blocks at their
offsets with their sizes on hover, a slider over the states and the memory timeline below."""

from __future__ import annotations

import pytest

from kvlab.experiments import allocator_tour as tour
from kvlab.units import MiB, fmt_bytes
from kvlab.viz import allocator_map
from kvlab.viz.snapshot_plots import STATE_STYLE


@pytest.fixture(scope="module")
def runs() -> dict[str, tour.StepRun]:
    return {key: getattr(tour, f"run_{key}")("sim:h200") for key in ("pools", "splitting", "fragmentation", "expandable")}


def _groups(traces) -> dict[str, list]:
    groups: dict[str, list] = {}
    for trace in traces:
        groups.setdefault(trace.meta, []).append(trace)
    return groups


def test_one_trace_group_per_segment_with_its_blocks(runs):
    state = runs["pools"].states[-1]
    segments = state.snapshot["segments"]
    traces = allocator_map.block_traces(state.snapshot)
    groups = _groups(traces)
    labels = [allocator_map.segment_label(s["segment_type"], s["address"], s["is_expandable"]) for s in segments]
    assert list(groups) == labels  # one group per segment, in snapshot order
    for seg, label in zip(segments, labels):
        group = groups[label]
        assert all(set(t.y) == {label} for t in group)
        assert len({t.name for t in group}) == len(group)  # at most one trace per block state
        # the group's bars tile the segment: offsets and widths are the blocks'
        bars = sorted((b, x) for t in group for b, x in zip(t.base, t.x))
        expected = [((blk["address"] - seg["address"]) / MiB, blk["size"] / MiB) for blk in seg["blocks"]]
        # pytest.approx compares flat sequences only (pytest >= 9 rejects nested tuples): one pair at a time
        assert len(bars) == len(expected)
        for got, want in zip(bars, sorted(expected)):
            assert got == pytest.approx(want)
        assert sum(x for _, x in bars) == pytest.approx(seg["total_size"] / MiB)


def test_blocks_are_coloured_by_state_and_the_legend_names_each_state_once(runs):
    state = runs["splitting"].states[runs["splitting"].focus_index]  # [8 MiB free | 2 MiB live | 10 MiB free]
    traces = allocator_map.block_traces(state.snapshot)
    by_name = {t.name: t for t in traces}
    live, free = by_name["live"], by_name["free"]
    assert live.marker.color == STATE_STYLE["active_allocated"][1] and free.marker.color == STATE_STYLE["inactive"][1]
    assert list(live.x) == [2.0] and sorted(free.x) == [8.0, 10.0]
    assert [t.name for t in traces if t.showlegend] == ["live", "free"]


def test_hover_shows_block_sizes_in_human_units_and_bytes(runs):
    state = runs["splitting"].states[1]  # big 8 MiB and pin 2 MiB live
    live = next(t for t in allocator_map.block_traces(state.snapshot) if t.name == "live")
    sizes = [row[2] for row in live.customdata]
    assert sizes == [f"{fmt_bytes(8 * MiB)} ({8 * MiB:,} B)", f"{fmt_bytes(2 * MiB)} ({2 * MiB:,} B)"]
    requested = [row[3] for row in live.customdata]
    assert requested == sizes  # requests were whole MiB
    assert "%{customdata[2]}" in live.hovertemplate and "%{customdata[0]}" in live.hovertemplate
    assert all("20.00 MiB" in row[0] for row in live.customdata)  # the segment's size


def test_expandable_segment_is_labelled(runs):
    state = runs["expandable"].states[-1]
    (trace_group,) = _groups(allocator_map.block_traces(state.snapshot)).values()
    assert trace_group[0].meta.endswith("· expandable")


def test_state_history_slider_shows_one_state_at_a_time(runs):
    run = runs["splitting"]
    fig = allocator_map.state_history(run)
    groups = fig.layout.meta["states"]
    assert len(groups) == len(run.states) == len(fig.layout.sliders[0].steps)
    n_bars = sum(len(g) for g in groups)
    assert len(fig.data) == n_bars + 3  # + allocated, reserved, free-in-cache
    for i, (step, group) in enumerate(zip(fig.layout.sliders[0].steps, groups)):
        visible = step.args[0]["visible"]
        assert [j for j in range(n_bars) if visible[j]] == group
        assert all(visible[n_bars:])
        assert run.states[i].label in step.args[1]["title.text"]
        marker = step.args[1]["shapes"][-1]
        assert marker["x0"] == run.states[i].timeline_index
    # opens at the focus state; the last state has no segments and says so
    assert fig.layout.sliders[0].active == run.focus_index
    assert [fig.data[j].visible for j in groups[run.focus_index]] == [True] * len(groups[run.focus_index])
    assert "no segments" in fig.layout.sliders[0].steps[-1].args[1]["annotations"][-1]["text"]
    assert fig.layout.xaxis.range == pytest.approx((0, 20 * 1.02))


def test_timeline_traces_follow_the_run(runs):
    run = runs["fragmentation"]
    fig = allocator_map.state_history(run)
    allocated, reserved, cached = fig.data[-3:]
    assert list(allocated.y) == pytest.approx((run.timeline["allocated_bytes"] / MiB).tolist())
    assert list(reserved.y) == pytest.approx((run.timeline["reserved_bytes"] / MiB).tolist())
    assert list(cached.y) == pytest.approx(
        ((run.timeline["reserved_bytes"] - run.timeline["allocated_bytes"]) / MiB).tolist())
    # two arms: a separator and each arm's name on the timeline
    annotations = [a["text"] for a in fig.layout.sliders[0].steps[0].args[1]["annotations"]]
    assert annotations == ["ascending (fresh allocator)", "descending (fresh allocator)"]


def test_state_history_active_argument(runs):
    fig = allocator_map.state_history(runs["pools"], active=0)
    assert fig.layout.sliders[0].active == 0
    last = allocator_map.state_history(runs["pools"], active=-1)
    assert last.layout.sliders[0].active == len(runs["pools"].states) - 1
    with pytest.raises(ValueError, match="active=99.*4 states"):
        allocator_map.state_history(runs["pools"], active=99)


def test_block_map_single_snapshot(runs):
    fig = allocator_map.block_map(runs["pools"].states[-1].snapshot, title="pools")
    assert fig.layout.title.text == "pools"
    assert len(_groups(fig.data)) == 3


def test_timeline_ticks_mark_the_states(runs):
    run = runs["pools"]
    fig = allocator_map.state_history(run)
    assert list(fig.layout.xaxis2.tickvals) == [s.timeline_index for s in run.states]
    assert list(fig.layout.xaxis2.ticktext) == [str(i + 1) for i in range(len(run.states))]
