"""Notebook 04 pointed at a user's own files: a snapshot in the docs' block-state spelling and a different trace."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from kvlab.device.snapshot import read_snapshot

from .nbrun import error_outputs, execute_notebook, find_output

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "04_bring_your_own.ipynb"


def _respell(raw: dict) -> int:
    """Rename every ``active_pending_free`` to the docs' ``active_awaiting_free``; returns how many."""
    n = 0
    for seg in raw["segments"]:
        for block in seg["blocks"]:
            if block["state"] == "active_pending_free":
                block["state"] = "active_awaiting_free"
                n += 1
    for device_trace in raw.get("device_traces", []):
        for event in device_trace:
            if event.get("state") == "active_pending_free":
                event["state"] = "active_awaiting_free"
    return n


@pytest.mark.slow
@pytest.mark.skipif(not NOTEBOOK.exists(), reason="notebook 04 not written yet")
def test_notebook_04_reads_the_users_files(tmp_path: Path):
    raw = pickle.loads((ROOT / "data" / "snapshots" / "example.pickle").read_bytes())
    _respell(raw)
    raw["segments"][0]["blocks"][0]["state"] = "active_awaiting_free"  # at least one in that spelling
    mine = tmp_path / "my_snapshot.pickle"
    mine.write_bytes(pickle.dumps(raw))
    expected_events = len(read_snapshot(mine).events_frame())
    trace = ROOT / "data" / "traces" / "mooncake_tiny.jsonl"
    n_requests = sum(1 for line in trace.read_text().splitlines() if line.strip())

    nb = execute_notebook(NOTEBOOK, timeout=300, parameters={
        "SNAPSHOT_PATH": str(mine), "TRACE_PATH": str(trace), "POOL_PAGES": [7, 12, 30], "RECORD_ON_GPU": False})
    assert not error_outputs(nb)
    assert str(mine) in find_output(nb, "my_snapshot.pickle")
    assert "pending free blocks" in find_output(nb, "pending free blocks")  # the docs' spelling, read as the C++'s
    line = find_output(nb, "ideal hit rate")
    assert f"{trace}: {n_requests} requests" in line and "pool sizes [7, 12, 30] pages" in line
    cut = find_output(nb, "trace events") if expected_events < 2 else find_output(nb, "history cut to events")
    assert re.search(r"\d", cut)
    # the replay of the user's snapshot: the verdict, the table, the segment map at the peak. The first block was
    # made pending above, but its trace never requested its free: the replay says so, naming the bytes.
    pending = raw["segments"][0]["blocks"][0]["size"]
    banner = find_output(nb, "**Diverges** from ")
    found = re.search(r"at event (\d+): final_allocated: recorded ([\d,]+), modelled ([\d,]+); 1 of 8 checks fail",
                      banner)
    assert found and int(found[1]) == expected_events, banner
    assert int(found[3].replace(",", "")) - int(found[2].replace(",", "")) == pending
    table = find_output(nb, "what-if ")
    assert "as recorded (modelled)" in table and "expandable_segments=True" in table
    peak = find_output(nb, "my_snapshot.pickle after event")
    assert re.search(r"after event \d+: \d+ segments, [\d.]+ MiB reserved", peak)
