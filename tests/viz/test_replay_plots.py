"""The replay figures draw the replay's own numbers: recorded vs modelled reserved side by side, what-if bars."""

from __future__ import annotations

import copy

from device.test_replay import move_block

from kvlab.device.replay.fidelity import replay_snapshot, state_at
from kvlab.device.replay.gen import generate
from kvlab.device.replay.whatif import replay_with_what_ifs
from kvlab.units import GiB, byte_unit
from kvlab.viz import replay_plots
from kvlab.viz.replay_plots import recorded_vs_modelled, what_if_bars
from kvlab.viz.snapshot_plots import segment_map


def test_side_by_side_draws_every_event_and_marks_a_divergence():
    made = generate(800, seed=12, empty_cache_every=200)
    result = replay_snapshot(made.snapshot)
    fig = recorded_vs_modelled(result)
    recorded, modelled, allocated = fig.data
    unit, size = byte_unit(max(result.recorded_reserved))
    assert fig.layout.yaxis.title.text == unit
    compared = [i for i, e in enumerate(result.trace) if not e["action"].startswith("segment_")]
    assert list(recorded.x) == compared  # the recording's own segment events are not drawn
    assert [round(y * size) for y in recorded.y] == [result.recorded_reserved[i] for i in compared]
    assert [round(y * size) for y in modelled.y] == [result.modelled_reserved[i] for i in compared]
    assert [round(y * size) for y in allocated.y] == [result.modelled_allocated[i] for i in compared]
    # exact: the two curves are the same line, not a step apart
    assert list(recorded.y) == list(modelled.y)
    assert not fig.layout.shapes  # exact: no divergence line
    raw = copy.deepcopy(made.snapshot)
    k = next(i for i, e in enumerate(raw["device_traces"][0]) if i > 300 and e["action"] == "alloc")
    move_block(raw["device_traces"][0], k, 512)
    shapes = recorded_vs_modelled(replay_snapshot(raw)).layout.shapes
    assert len(shapes) == 2 and {s.x0 for s in shapes} == {k}


def test_long_traces_are_thinned_but_keep_the_peak(monkeypatch):
    monkeypatch.setattr(replay_plots, "MAX_POINTS", 50)
    result = replay_snapshot(generate(1000, seed=13).snapshot)
    xs = list(recorded_vs_modelled(result).data[1].x)
    compared = [i for i, e in enumerate(result.trace) if not e["action"].startswith("segment_")]
    peak = next(i for i in compared if i >= result.peak_event)
    assert len(xs) <= 52 and peak in xs and xs[-1] == compared[-1]


def test_what_if_bars_and_the_segment_map_at_the_peak():
    made = generate(800, seed=14)
    result, what_ifs = replay_with_what_ifs(made.snapshot, what_ifs=["expandable_segments=True"], capacity="8GiB")
    fig = what_if_bars(result, what_ifs)
    peak, final, frag = fig.data
    assert list(peak.x) == ["recorded", "as recorded (modelled)", "expandable_segments=True"]
    assert fig.layout.yaxis.title.text == "GiB"  # 8 GiB capacity: the largest value sets the unit
    assert [round(v * GiB, -6) for v in peak.y] == [round(v, -6) for v in (
        result.recorded_peak_reserved_bytes, *(w.peak_reserved_bytes for w in what_ifs))]
    assert frag.y[0] is None and fig.layout.shapes[0].y0 == 8.0
    state = state_at(made.snapshot, result.peak_event)
    assert state.final_reserved_bytes == result.modelled_reserved[result.peak_event] == max(result.modelled_reserved)
    assert len(segment_map(state).data) == 3


def test_the_shipped_74_mib_snapshot_is_drawn_in_mib_and_the_curves_coincide():
    """Notebook 04's example (74 MiB at its peak) reads in MiB, not as 0.07 GiB, and its EXACT replay draws the
    recorded and modelled reserved bytes on the same steps."""
    from kvlab.device.snapshot import EXAMPLE_SNAPSHOT, read_snapshot
    from kvlab.viz.snapshot_plots import active_memory_timeline

    result, what_ifs = replay_with_what_ifs(EXAMPLE_SNAPSHOT)
    fig = recorded_vs_modelled(result)
    assert fig.layout.yaxis.title.text == "MiB" and max(fig.data[0].y) == 74.0
    assert list(fig.data[0].y) == list(fig.data[1].y)
    assert what_if_bars(result, what_ifs).layout.yaxis.title.text == "MiB"
    timeline = active_memory_timeline(read_snapshot(EXAMPLE_SNAPSHOT))
    assert timeline.layout.yaxis.title.text == "MiB" and max(timeline.data[1].y) == 74.0
