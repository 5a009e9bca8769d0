"""Snapshot reader, replay and plots, checked against counts walked from the raw pickle."""

from __future__ import annotations

import copy
import pickle

import pytest

from kvlab.device.snapshot import (
    SnapshotError,
    make_example_snapshot,
    read_snapshot,
    run_example_script,
    write_snapshot,
)
from kvlab.units import align_up

from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "data" / "snapshots" / "example.pickle"


@pytest.fixture(scope="module")
def raw() -> dict:
    with EXAMPLE.open("rb") as f:
        return pickle.load(f)


def forward_walk(trace):
    """Independent oracle: replay from zero, block sizes = request rounded up to 512 B."""
    allocated = reserved = peak_a = peak_r = 0
    sizes = {}
    for e in trace:
        if e["action"] == "alloc":
            sizes[e["addr"]] = align_up(max(e["size"], 512), 512)
            allocated += sizes[e["addr"]]
        elif e["action"] == "free_completed":
            allocated -= sizes.pop(e["addr"])
        elif e["action"] in ("segment_alloc", "segment_map"):
            reserved += e["size"]
        elif e["action"] in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
        peak_a, peak_r = max(peak_a, allocated), max(peak_r, reserved)
    return allocated, reserved, peak_a, peak_r


def test_shipped_file_counts_and_peaks(raw):
    snap = read_snapshot(EXAMPLE)
    trace = raw["device_traces"][0]
    assert len(snap.segments_frame()) == len(raw["segments"]) == 3
    assert len(snap.blocks_frame()) == sum(len(s["blocks"]) for s in raw["segments"]) == 8
    assert len(snap.events_frame()) == len(trace) == 22
    allocated, reserved, peak_a, peak_r = forward_walk(trace)
    assert allocated == sum(s["allocated_size"] for s in raw["segments"]) == snap.final_allocated_bytes
    assert reserved == sum(s["total_size"] for s in raw["segments"])
    assert (snap.peak_allocated_bytes, snap.peak_reserved_bytes) == (peak_a, peak_r)
    # and the allocator model itself agrees
    device, _alive = run_example_script()
    assert device.allocator.max_memory_allocated() == peak_a
    assert device.allocator.max_memory_reserved() == peak_r


def test_regeneration_is_byte_identical(tmp_path):
    out = make_example_snapshot(tmp_path / "example.pickle")
    assert out.read_bytes() == EXAMPLE.read_bytes()


def test_both_pending_state_spellings(raw):
    for spelling in ("active_pending_free", "active_awaiting_free"):
        d = copy.deepcopy(raw)
        d["segments"][0]["blocks"][0]["state"] = spelling
        states = read_snapshot(d).blocks_frame()["state"].tolist()
        assert states[0] == "active_pending_free"


@pytest.mark.parametrize("cut", [1, 5, 11, 16, 21])
def test_history_starting_mid_run(raw, cut):
    d = copy.deepcopy(raw)
    d["device_traces"][0] = d["device_traces"][0][cut:]
    snap = read_snapshot(d)
    frame = snap.timeline()
    assert len(frame) == 22 - cut
    assert frame["allocated_bytes"].iloc[-1] == sum(s["allocated_size"] for s in raw["segments"])
    assert frame["reserved_bytes"].iloc[-1] == sum(s["total_size"] for s in raw["segments"])
    assert (frame[["allocated_bytes", "requested_bytes", "reserved_bytes"]] >= 0).all().all()
    full = read_snapshot(raw).timeline()
    assert frame["allocated_bytes"].tolist() == full["allocated_bytes"].tolist()[cut:]


def _bad(raw, edit):
    d = copy.deepcopy(raw)
    edit(d)
    return d


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("segments"), "missing top key 'segments'"),
        (lambda d: d["segments"][1].pop("total_size"), r"segments\[1\]: missing required field 'total_size'"),
        (lambda d: d["segments"][0]["blocks"][2].pop("size"), r"segments\[0\]\.blocks\[2\]: missing required field 'size'"),
        (lambda d: d["segments"][0]["blocks"][0].update(state="weird"), r"blocks\[0\]\.state: unknown block state 'weird'"),
        (lambda d: d["device_traces"][0][3].update(action="teleport"), r"device_traces\[0\]\[3\]\.action: unknown action 'teleport'"),
    ],
)
def test_bad_dict(raw, edit, message):
    with pytest.raises(SnapshotError, match=message):
        read_snapshot(_bad(raw, edit))


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pickle: snapshot file not found"):
        read_snapshot(tmp_path / "nope.pickle")
    junk = tmp_path / "junk.pickle"
    junk.write_text("not a pickle")
    with pytest.raises(SnapshotError, match="junk.pickle: not a pickle file"):
        read_snapshot(junk)
    listy = tmp_path / "list.pickle"
    listy.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(SnapshotError, match="list.pickle: expected a dict at the top level, got list"):
        read_snapshot(listy)


def test_write_refuses_overwrite(tmp_path):
    from kvlab.device import get_device

    path = tmp_path / "s.pickle"
    write_snapshot(get_device("sim:h100-80g"), path)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_snapshot(get_device("sim:h100-80g"), path)
    write_snapshot(get_device("sim:h100-80g"), path, overwrite=True)
    assert read_snapshot(path).segments_frame().empty


def test_plots():
    import plotly.graph_objects as go

    from kvlab.viz.snapshot_plots import active_memory_timeline, segment_map

    snap = read_snapshot(EXAMPLE)
    timeline = active_memory_timeline(snap)
    assert isinstance(timeline, go.Figure) and len(timeline.data) == 2
    assert len(timeline.data[0].x) == 22
    smap = segment_map(snap)
    assert isinstance(smap, go.Figure) and len(smap.data) == 3
    assert [len(t.x) for t in smap.data] == [5, 0, 3]  # 5 live, 3 cached free blocks
