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
    """Independent oracle: replay from zero, block sizes = request rounded up to 512 B (the shipped
    trace starts with an empty allocator, so a forward walk sees every block). Returns the totals
    (allocated, requested, reserved) after each event."""
    allocated = requested = reserved = 0
    sizes, after = {}, []
    for e in trace:
        if e["action"] == "alloc":
            sizes[e["addr"]] = (align_up(max(e["size"], 512), 512), e["size"])
            allocated += sizes[e["addr"]][0]
            requested += e["size"]
        elif e["action"] == "free_completed":
            block, request = sizes.pop(e["addr"])
            allocated -= block
            requested -= request
        elif e["action"] in ("segment_alloc", "segment_map"):
            reserved += e["size"]
        elif e["action"] in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
        after.append((allocated, requested, reserved))
    return after


def raw_blocks(raw):
    return [b for s in raw["segments"] for b in s["blocks"]]


def test_shipped_file_counts_and_peaks(raw):
    """Counts and peaks walked from the raw pickle (dict keys, list lengths, a forward replay), then
    compared with the reader's frames, its backward replay and the allocator model's own maxima."""
    snap = read_snapshot(EXAMPLE)
    trace = raw["device_traces"][0]
    blocks = raw_blocks(raw)
    assert len(snap.segments_frame()) == len(raw["segments"]) == 3
    assert len(snap.blocks_frame()) == len(blocks) == 8
    assert len(snap.events_frame()) == len(trace) == 22
    by_state = snap.blocks_frame()["state"].value_counts().to_dict()
    assert by_state == {"active_allocated": sum(b["state"] == "active_allocated" for b in blocks),
                        "inactive": sum(b["state"] == "inactive" for b in blocks)} == {"active_allocated": 5, "inactive": 3}
    assert sorted(s["segment_type"] for s in raw["segments"]) == ["large", "large", "small"]
    after = forward_walk(trace)
    allocated, _, reserved = after[-1]
    live_bytes = sum(b["size"] for b in blocks if b["state"] != "inactive")
    assert allocated == live_bytes == sum(s["allocated_size"] for s in raw["segments"]) == snap.final_allocated_bytes
    assert reserved == sum(s["total_size"] for s in raw["segments"]) == snap.final_reserved_bytes
    peak_a, peak_r = max(a for a, _, _ in after), max(r for _, _, r in after)
    assert (snap.peak_allocated_bytes, snap.peak_reserved_bytes) == (peak_a, peak_r)
    # and the allocator model itself agrees
    device, _alive = run_example_script()
    assert device.allocator.max_memory_allocated() == peak_a
    assert device.allocator.max_memory_reserved() == peak_r


def test_backward_replay_matches_the_forward_walk_at_every_event(raw):
    frame = read_snapshot(EXAMPLE).timeline()
    got = list(zip(frame["allocated_bytes"], frame["requested_bytes"], frame["reserved_bytes"]))
    assert got == forward_walk(raw["device_traces"][0])
    assert frame["action"].tolist() == [e["action"] for e in raw["device_traces"][0]]
    assert {"segment_free", "free_completed", "alloc", "segment_alloc"} <= set(frame["action"])


def test_data_readme_states_the_walked_figures(raw):
    """data/README.md's line for the snapshot quotes the figures a forward walk of the file gives."""
    line = next(row for row in (REPO_ROOT / "data" / "README.md").read_text().splitlines() if "snapshots/example.pickle" in row)
    after = forward_walk(raw["device_traces"][0])
    for figure in (max(a for a, _, _ in after), max(r for _, _, r in after), after[-1][0], after[-1][2]):
        assert f"{figure:,}" in line, figure
    assert f"{len(raw['device_traces'][0])} trace events" in line and f"{len(raw_blocks(raw))} blocks" in line


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
    # the peak seen by a history that starts at ``cut``: the state before its first event, or after any
    # kept event (taken from the forward walk of the whole trace, not from the reader)
    after = forward_walk(raw["device_traces"][0])
    assert snap.replay().initial_allocated_bytes == after[cut - 1][0]
    assert snap.peak_allocated_bytes == max(a for a, _, _ in after[cut - 1:])
    assert snap.peak_reserved_bytes == max(r for _, _, r in after[cut - 1:])


def test_peaks_are_per_device(raw):
    """A second GPU whose segments are in the snapshot but whose history is empty: totals now add up
    over devices, a peak is the largest on one device (the second GPU holds one big live block)."""
    after = forward_walk(raw["device_traces"][0])
    big = max(r for _, _, r in after) + 2 * 1024 * 1024  # above device 0's peak reserved
    d = copy.deepcopy(raw)
    d["segments"].append({"device": 1, "address": 1 << 44, "total_size": big, "allocated_size": big,
                          "active_size": big, "requested_size": big, "stream": 0, "segment_type": "large",
                          "is_expandable": False,
                          "blocks": [{"address": 1 << 44, "size": big, "requested_size": big, "state": "active_allocated"}]})
    d["device_traces"].append([])
    snap = read_snapshot(d)
    assert snap.final_allocated_bytes == after[-1][0] + big
    assert snap.final_reserved_bytes == after[-1][2] + big
    assert (snap.peak_allocated_bytes, snap.peak_reserved_bytes) == (big, big)
    d["segments"][-1]["blocks"][0]["state"] = "inactive"  # now device 0 has the allocated peak
    assert read_snapshot(d).peak_allocated_bytes == max(a for a, _, _ in after)


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
    # a top-level list is torch.cuda.memory_snapshot()'s segment list: these items are not segments
    with pytest.raises(SnapshotError, match=r"list.pickle: \[0\]: expected a segment dict, got int \(a top-level list"):
        read_snapshot(listy)


def test_write_refuses_overwrite(tmp_path):
    from kvlab.device import get_device

    path = tmp_path / "s.pickle"
    write_snapshot(get_device("sim:h100-80g"), path)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_snapshot(get_device("sim:h100-80g"), path)
    write_snapshot(get_device("sim:h100-80g"), path, overwrite=True)
    assert read_snapshot(path).segments_frame().empty


def test_plots(raw):
    import plotly.graph_objects as go

    from kvlab.viz.snapshot_plots import active_memory_timeline, segment_map

    snap = read_snapshot(EXAMPLE)
    timeline = active_memory_timeline(snap)
    assert isinstance(timeline, go.Figure) and len(timeline.data) == 2
    assert len(timeline.data[0].x) == 22
    smap = segment_map(snap)
    assert isinstance(smap, go.Figure) and len(smap.data) == 3
    states = [b["state"] for b in raw_blocks(raw)]
    assert [len(t.x) for t in smap.data] == [states.count(s) for s in ("active_allocated", "active_pending_free", "inactive")]
    assert sum(smap.data[0].x) * (1 << 20) == sum(b["size"] for b in raw_blocks(raw) if b["state"] == "active_allocated")


def test_summary_names_block_states_in_the_shared_words():
    from kvlab.device.snapshot import STATE_NAMES

    snapshot = read_snapshot(EXAMPLE)
    summary = snapshot.summary()
    blocks = snapshot.blocks_frame()
    for state, word in STATE_NAMES.items():
        count = int((blocks["state"] == state).sum())
        assert summary.get(f"{word} blocks", 0) == count
    assert not any("active_" in key or "inactive" in key for key in summary.index)
    assert summary["blocks"] == len(blocks) and summary["file"] == snapshot.source
