"""Every real snapshot format reads: torch.cuda.memory_snapshot()'s plain segment list (no history), keys
kvlab does not know (a newer torch) warn instead of failing, and values of the wrong type are named."""

from __future__ import annotations

import copy
import pickle
import re

import pytest

from kvlab.device.snapshot import SnapshotError, SnapshotKeyWarning, read_snapshot
from kvlab.device.snapshot_keys import unknown_keys
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "data" / "snapshots" / "example.pickle"


@pytest.fixture(scope="module")
def raw() -> dict:
    with EXAMPLE.open("rb") as f:
        return pickle.load(f)


def test_the_segment_list_of_memory_snapshot_reads_without_history(tmp_path, raw):
    path = tmp_path / "segments.pickle"
    path.write_bytes(pickle.dumps(raw["segments"], protocol=4))
    snap = read_snapshot(path)
    assert snap.format == "segment_list" and not snap.has_history
    assert snap.raw["device_traces"] == []
    assert len(snap.segments_frame()) == len(raw["segments"])
    assert snap.final_reserved_bytes == sum(s["total_size"] for s in raw["segments"])
    assert snap.timeline().empty
    full = read_snapshot(raw)
    assert full.format == "dump_snapshot" and full.has_history


def test_a_list_of_something_else_is_named(tmp_path):
    path = tmp_path / "ints.pickle"
    path.write_bytes(pickle.dumps([{"address": 0}, 7], protocol=4))
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: \[1\]: expected a segment dict, got int"):
        read_snapshot(path)
    path.write_bytes(pickle.dumps([{"address": 0}], protocol=4))
    with pytest.raises(SnapshotError, match=r"segments\[0\]: missing required field 'total_size'"):
        read_snapshot(path)


def test_unknown_keys_warn_naming_each_and_where(tmp_path, raw):
    d = copy.deepcopy(raw)
    d["future_top"] = 1
    d["segments"][0]["future_segment_field"] = 2
    d["segments"][1]["blocks"][0]["future_block_field"] = 3
    d["device_traces"][0][4]["future_event_field"] = 4
    d["allocator_settings"]["future_setting"] = 5
    path = tmp_path / "newer.pickle"
    path.write_bytes(pickle.dumps(d, protocol=4))
    with pytest.warns(SnapshotKeyWarning) as caught:
        snap = read_snapshot(path)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith(f"{path}: ignoring keys kvlab does not know (")
    for where, key in (("top level", "future_top"), ("segments[]", "future_segment_field"),
                       ("segments[].blocks[]", "future_block_field"), ("device_traces[][]", "future_event_field"),
                       ("allocator_settings", "future_setting")):
        assert f"{where}: {key}" in message
    assert snap.timeline().equals(read_snapshot(raw).timeline())  # ignored: nothing else changes


def test_the_known_keys_of_every_shipped_and_generated_file_do_not_warn(raw):
    from kvlab.device.replay.gen import generate

    assert unknown_keys(raw) == {}
    assert unknown_keys(generate(300, seed=0).snapshot) == {}


@pytest.mark.parametrize(
    ("edit", "where", "value"),
    [
        (lambda d: d["device_traces"][0][2].update(size="1024"), r"device_traces\[0\]\[2\]\.size", "'1024'"),
        (lambda d: d["device_traces"][0][3].update(addr=-5), r"device_traces\[0\]\[3\]\.addr", "-5"),
        (lambda d: d["device_traces"][0][1].update(stream=1.5), r"device_traces\[0\]\[1\]\.stream", "1.5"),
        (lambda d: d["segments"][0].update(total_size=None), r"segments\[0\]\.total_size", "None"),
        (lambda d: d["segments"][1]["blocks"][0].update(size=True), r"segments\[1\]\.blocks\[0\]\.size", "True"),
    ],
)
def test_values_of_the_wrong_type_are_named(tmp_path, raw, edit, where, value):
    d = copy.deepcopy(raw)
    edit(d)
    path = tmp_path / "typed.pickle"
    path.write_bytes(pickle.dumps(d, protocol=4))
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: {where}: expected a non-negative int, "
                                            rf"got {re.escape(value)}$"):
        read_snapshot(path)
