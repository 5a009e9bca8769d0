"""``kvlab replay``: the JSON the issue names, the human verdict and table, what-ifs and capacity, and bad
input as ``kvlab: error: ...`` with exit 2 and no traceback."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from kvlab.cli import main
from kvlab.device.caching_allocator import AllocatorConfig
from kvlab.device.replay.fidelity import replay_snapshot
from kvlab.device.replay.gen import generate
from kvlab.device.replay.settings import parse_size, parse_what_if
from kvlab.device.replay.whatif import run_what_if
from kvlab.units import GB, GiB, MiB
from tests.shared_data import SKIP_REASON, real_snapshots

REAL = real_snapshots()


@pytest.fixture(scope="module")
def made():
    return generate(2000, seed=11, empty_cache_every=400)


@pytest.fixture
def snapshot_file(tmp_path, made):
    path = tmp_path / "run.pickle"
    path.write_bytes(pickle.dumps(made.snapshot, protocol=4))
    return path


def _run(capsys, *argv):
    code = main(["replay", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_fields_the_issue_names(capsys, snapshot_file, made):
    code, out, err = _run(capsys, snapshot_file, "--json", "--what-if", "expandable_segments=True",
                          "--what-if", "max_split_size_mb=64,roundup_power2_divisions=4", "--capacity", "24GiB")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["events_replayed"] == len(made.snapshot["device_traces"][0])
    assert {"segment_allocs_equal", "final_reserved_equal", "final_allocated_equal", "first_divergence"} <= set(
        data["fidelity"])
    assert data["fidelity"]["exact"] is True and data["fidelity"]["first_divergence"] is None
    assert data["recorded"]["peak_reserved_bytes"] == max(made.reserved)
    assert data["recorded"]["final_reserved_bytes"] == made.reserved[-1]
    labels = [w["label"] for w in data["what_if"]]
    assert labels == ["as recorded (modelled)", "expandable_segments=True",
                      "max_split_size_mb=64,roundup_power2_divisions=4"]
    for w in data["what_if"]:
        assert {"settings", "peak_reserved_bytes", "final_reserved_bytes", "cuda_malloc_calls",
                "oom_at_capacity"} <= set(w)
        if w["peak_reserved_bytes"] <= 24 * GiB:
            assert w["oom_at_capacity"] is False and w["oom_event"] is None
    assert data["what_if"][0]["peak_reserved_bytes"] == max(made.reserved)  # baseline = the recording
    assert data["what_if"][1]["settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert data["what_if"][2]["settings"] == {"expandable_segments": False, "max_split_size_mb": 64,
                                              "roundup_power2_divisions": 4,
                                              "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,roundup_power2_divisions:4"}


def test_human_output_is_a_verdict_and_a_table(capsys, snapshot_file):
    code, out, _ = _run(capsys, snapshot_file)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"replay · {snapshot_file} · device 0 · ")
    assert lines[1].startswith("  EXACT: ")
    assert any(line.split() == ["what-if", "peak", "reserved", "final", "reserved", "peak", "cached", "cudaMallocs",
                                "OOM", "at", "capacity", "answer"] for line in lines)
    # reserved − allocated is cached memory, not all of it fragmentation
    assert "(cached: reserved but unallocated " in out and "(fragmentation" not in out
    assert any(line.strip().startswith("peak cached = reserved − allocated") for line in lines)
    assert any(line.strip().startswith("expandable_segments=True") for line in lines)  # the default what-if


def test_capacity_says_where_it_runs_out(made):
    result = replay_snapshot(made.snapshot)
    baseline = run_what_if(result.ops, result.settings, label="b")
    peak, top_allocated = baseline.peak_reserved_bytes, max(baseline.allocated)
    assert run_what_if(result.ops, result.settings, label="b", capacity=peak).oom_at_capacity is False
    tight = run_what_if(result.ops, result.settings, label="b", capacity=top_allocated - MiB)
    assert tight.oom_at_capacity is True
    # it runs out at an allocation, no later than the first moment the live bytes alone exceed the device
    first_over = next(s for s, a in zip(baseline.steps, baseline.allocated) if a > top_allocated - MiB)
    assert result.trace[tight.oom_event]["action"] == "alloc" and tight.oom_event <= first_over
    assert "CUDA out of memory" in tight.oom_message


def test_no_oom_beside_a_peak_above_the_capacity_says_the_allocator_retries(capsys, snapshot_file, made):
    result = replay_snapshot(made.snapshot)
    baseline = run_what_if(result.ops, result.settings, label="b")
    peak, top = baseline.peak_reserved_bytes, max(baseline.allocated)
    capacity = next(c for c in range(peak - 2 * MiB, top, -2 * MiB)
                    if run_what_if(result.ops, result.settings, label="b", capacity=c).oom_at_capacity is False)
    code, out, _ = _run(capsys, snapshot_file, "--capacity", f"{capacity}")
    row = next(line for line in out.splitlines() if line.strip().startswith("as recorded"))
    assert code == 0 and " no [1] " in row
    assert "free its cached blocks and retry" in out and "no OOM" in out


@pytest.mark.skipif(not REAL, reason=SKIP_REASON)
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name.split("__")[0])
def test_real_recordings_through_the_cli(capsys, path):
    code, out, _ = _run(capsys, path, "--json", "--capacity", "24GiB")
    data = json.loads(out)
    assert code == 0 and data["fidelity"]["exact"] is True
    assert all(data["fidelity"][k] for k in ("segment_allocs_equal", "final_reserved_equal", "final_allocated_equal"))
    assert [w["label"] for w in data["what_if"]] == ["as recorded (modelled)", "expandable_segments=True"]


def test_segment_list_has_no_fidelity_and_no_what_ifs(capsys, tmp_path, made):
    path = tmp_path / "segments.pickle"
    path.write_bytes(pickle.dumps(made.snapshot["segments"], protocol=4))
    code, out, _ = _run(capsys, path, "--json")
    data = json.loads(out)
    assert code == 0 and data["events_replayed"] == 0 and data["what_if"] == []
    assert data["fidelity"]["exact"] is None and data["history"].startswith("none")
    assert "what-ifs need a trace: none run" in data["notes"]
    code, out, _ = _run(capsys, path)
    assert "no history in this snapshot: segment map and fragmentation only" in out


def test_unknown_keys_are_a_warning_not_an_error(capsys, tmp_path, made):
    raw = dict(made.snapshot, torch_2_20_field=1)
    path = tmp_path / "newer.pickle"
    path.write_bytes(pickle.dumps(raw, protocol=4))
    code, out, err = _run(capsys, path)
    assert code == 0 and "EXACT" in out
    assert err.startswith(f"kvlab: warning: {path}: ignoring keys kvlab does not know (top level: torch_2_20_field)")


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


@pytest.mark.parametrize("case", ["not-a-pickle", "wrong-schema", "carries-code", "missing", "bad-what-if",
                                  "unmodelled-what-if", "bad-capacity", "no-such-device"])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, snapshot_file, case):
    path, extra = tmp_path / f"{case}.pickle", []
    if case == "not-a-pickle":
        path.write_text("segments,blocks\n1,2\n")
        expected = f"{path}: not a pickle file"
    elif case == "wrong-schema":
        path.write_bytes(pickle.dumps({"device_traces": []}, protocol=4))
        expected = f"{path}: missing top key 'segments'"
    elif case == "carries-code":
        marker = tmp_path / "ran"
        path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Payload(marker)]]}, protocol=4))
        expected = f"{path}: refused global posix.system"
    elif case == "missing":
        expected = f"{path}: snapshot file not found"
    else:
        path = snapshot_file
        extra, expected = {
            "bad-what-if": (["--what-if", "expandable_segments=maybe"], "--what-if 'expandable_segments=maybe': "
                                                                       "expandable_segments takes True or False, not "
                                                                       "'maybe'"),
            "unmodelled-what-if": (["--what-if", "garbage_collection_threshold=0.6"], "unknown or unmodelled key "
                                                                                     "'garbage_collection_threshold'"),
            "bad-capacity": (["--capacity", "lots"], "size 'lots': expected a number with an optional unit"),
            "no-such-device": (["--device", "3"], "no device 3 in this snapshot (devices with data: [0])"),
        }[case]
    code, out, err = _run(capsys, path, *extra)
    assert code == 2 and out == ""
    assert err.startswith("kvlab: error: ") and expected in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    if case == "carries-code":
        assert not (tmp_path / "ran").exists()


def test_parse_size_and_what_if():
    assert parse_size("24GiB") == 24 * GiB == parse_size("24 gib") == parse_size(str(24 * GiB))
    assert parse_size("80GB") == 80 * GB and parse_size("1.5MiB") == 3 * MiB // 2
    for bad in ("", "0", "-1GiB", "24 parsecs"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)
    base = AllocatorConfig(max_split_size_bytes=128 * MiB)
    assert parse_what_if("expandable_segments:True", base) == AllocatorConfig(128 * MiB, True)
    assert parse_what_if("max_split_size_mb=unlimited", base) == AllocatorConfig()
    with pytest.raises(ValueError, match="must be a whole number of MiB >= 20 MiB"):
        parse_what_if("max_split_size_mb=4", base)
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_what_if("expandable_segments", base)


def _near_the_limit(seed: int):
    """Expandable segments on a 3 GiB device wanting twice that live, the first events dropped (as
    benchmarks/count_replay_expandable.py makes them)."""
    return generate(1500, seed=seed, config=AllocatorConfig(expandable_segments=True), total_bytes=3 * GiB,
                    live_bytes=6 * GiB, large_share=0.3, drop_first=1000 + seed * 37 % 7000, streams=(0,))


def test_device_memory_sets_the_expandable_address_space(capsys, tmp_path):
    made = _near_the_limit(44)  # its kept trace has no oom: only --device-memory says how big the device is
    assert not any(e["action"] == "oom" for e in made.snapshot["device_traces"][0])
    path = tmp_path / "limit.pickle"
    path.write_bytes(pickle.dumps(made.snapshot, protocol=4))
    code, out, _ = _run(capsys, path, "--json")
    guessed = json.loads(out)
    assert code == 0 and guessed["fidelity"]["exact"] is False
    assert any("--device-memory" in note for note in guessed["notes"])
    code, out, _ = _run(capsys, path, "--json", "--device-memory", "3GiB")
    assert code == 0 and json.loads(out)["fidelity"]["exact"] is True
    code, _, err = _run(capsys, path, "--device-memory", "lots")
    assert code == 2 and err.startswith("kvlab: error: --device-memory: size 'lots'")
    code, _, err = _run(capsys, path, "--device-memory", "1MiB")
    assert code == 2 and "--device-memory 1,048,576 B is less than the" in err and str(path) in err


def test_a_recorded_oom_tells_the_device_size():
    made = _near_the_limit(0)
    assert any(e["action"] == "oom" for e in made.snapshot["device_traces"][0])
    result = replay_snapshot(made.snapshot)
    assert result.exact and any(note.startswith("the device's memory is taken from the recorded oom (free + "
                                                "reserved: 3,221,225,472 B)") for note in result.notes)
