"""Bad snapshot *files* a user may hand notebook 04: each error names the file and the field.

(test_snapshot.py covers the same rules on in-memory dicts; here every case goes through a file on
disk, as ``read_snapshot(SNAPSHOT_PATH)`` does in the notebook.)"""

from __future__ import annotations

import copy
import gzip
import json
import pickle
import re

import pytest

from kvlab.device.snapshot import SnapshotError, read_snapshot
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "data" / "snapshots" / "example.pickle"


@pytest.fixture(scope="module")
def raw() -> dict:
    with EXAMPLE.open("rb") as f:
        return pickle.load(f)


def _write(tmp_path, name, obj) -> str:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=4))
    return str(path)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("trace.json", json.dumps({"segments": []}).encode()),  # memory_viz's JSON export, not the pickle
        ("empty.pickle", b""),
        ("snapshot.pickle.gz", gzip.compress(b"\x80\x04K\x01.", mtime=0)),  # (mtime 0: the same id every run)
        ("truncated.pickle", pickle.dumps({"segments": [1, 2, 3]}, protocol=4)[:-5]),
    ],
)
def test_not_a_pickle(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: not a pickle file \("):
        read_snapshot(path)


def test_pickle_without_segments(tmp_path, raw):
    d = copy.deepcopy(raw)
    d.pop("segments")
    path = _write(tmp_path, "nosegs.pickle", d)
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: missing top key 'segments' \(not a torch\.cuda\.memory\._dump_snapshot"):
        read_snapshot(path)


def test_segments_not_a_list(tmp_path, raw):
    d = copy.deepcopy(raw)
    d["segments"] = {"0": d["segments"][0]}
    path = _write(tmp_path, "segdict.pickle", d)
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: segments: expected a list, got dict"):
        read_snapshot(path)


@pytest.mark.parametrize("state", ["allocated", "ACTIVE_ALLOCATED", "", 3])
def test_wrong_block_state(tmp_path, raw, state):
    d = copy.deepcopy(raw)
    d["segments"][2]["blocks"][1]["state"] = state
    path = _write(tmp_path, "state.pickle", d)
    with pytest.raises(SnapshotError) as info:
        read_snapshot(path)
    message = str(info.value)
    assert message.startswith(f"{path}: segments[2].blocks[1].state: unknown block state {state!r}")
    assert "active_allocated" in message and "active_awaiting_free" in message  # what would be accepted


def test_block_not_a_dict_and_trace_entry_missing_addr(tmp_path, raw):
    d = copy.deepcopy(raw)
    d["segments"][0]["blocks"][0] = [0, 512, "active_allocated"]
    path = _write(tmp_path, "blocklist.pickle", d)
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: segments\[0\]\.blocks\[0\]: expected a dict, got list"):
        read_snapshot(path)
    d = copy.deepcopy(raw)
    k = next(i for i, e in enumerate(d["device_traces"][0]) if e["action"] == "alloc")
    d["device_traces"][0][k].pop("addr")
    path = _write(tmp_path, "noaddr.pickle", d)
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: device_traces\[0\]\[{k}\]: missing required field 'addr'"):
        read_snapshot(path)


def test_good_file_still_reads_after_a_round_trip(tmp_path, raw):
    """The control: the same writer with nothing broken reads back (so the failures above are the edits)."""
    path = _write(tmp_path, "ok.pickle", copy.deepcopy(raw))
    assert len(read_snapshot(path).timeline()) == len(raw["device_traces"][0])
