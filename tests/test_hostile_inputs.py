"""Hostile and extreme inputs the mutation fuzz (tests/test_cli_fuzz.py) found or issue 26 lists: each is one
``kvlab: error:`` line naming the input and the field (exit 2), within seconds and bounded memory; never a
traceback (exit 3 fails any test: tests/conftest.py)."""

from __future__ import annotations

import json
import pickle
import struct
import time
from pathlib import Path

import pytest

from kvlab.cli import main

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "data" / "snapshots" / "example.pickle"
TRACE = REPO / "data" / "traces" / "mooncake_tiny.jsonl"
LOGS = REPO / "data" / "examples" / "server_logs"
SGLANG_LOG = LOGS / "llama-3.1-8b-h100-sglang-0.5.23.log"
VLLM_LOG = LOGS / "llama-3.1-70b-4xh100-vllm-0.34.0.log"
CONFIG = REPO / "data" / "examples" / "models" / "qwen3-235b-a22b-fp8" / "config.json"


def _refused(capsys, argv: list[str], *needles: str, seconds: float = 20) -> str:
    start = time.perf_counter()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("kvlab: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert time.perf_counter() - start < seconds
    return err


def _snapshot(tmp_path, change) -> Path:
    raw = pickle.loads(SNAPSHOT.read_bytes())
    change(raw)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(raw, protocol=4))
    return path


# ---- snapshots ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, data", [
    ("frame", b"\x80\x04\x95" + struct.pack("<Q", 1 << 60) + b"}."),
    ("binbytes8", b"\x80\x04\x8e" + struct.pack("<Q", 1 << 60) + b"abc."),
])
def test_a_pickle_length_beyond_the_file_is_refused_without_allocating_it(name, data, tmp_path, capsys):
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(data)
    _refused(capsys, ["replay", str(path)], f"{path}: not a pickle file")


def test_a_shared_reference_bomb_is_refused_at_once(tmp_path, capsys):
    """202 KB of pickle standing for 10^8 blocks ran for minutes: a repeated object is refused at its first repeat."""
    block = {"address": 1 << 20, "size": 512, "requested_size": 512, "state": "active_allocated"}
    segment = {"device": 0, "address": 1 << 20, "total_size": 512, "allocated_size": 512, "active_size": 512,
               "stream": 0, "segment_type": "small", "blocks": [block] * 10_000}
    path = tmp_path / "bomb.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment] * 10_000, "device_traces": [[]]}, protocol=4))
    assert path.stat().st_size < 100_000
    _refused(capsys, ["replay", str(path)], f"{path}: segments[0].blocks[1]: the same object as an earlier entry",
             seconds=5)


@pytest.mark.parametrize("change, where", [
    (lambda raw: raw["segments"][0].update(device="0"), "segments[0].device: expected a non-negative int, got '0'"),
    (lambda raw: raw["segments"][0]["blocks"][0].update(address=1.5),
     "segments[0].blocks[0].address: expected a non-negative int, got 1.5"),
    (lambda raw: raw["segments"][0]["blocks"][0].update(state=["active_allocated"]),
     "segments[0].blocks[0].state: unknown block state list ['active_allocated']"),
    (lambda raw: raw["device_traces"][0][0].update(action={"alloc": 1}), "device_traces[0][0].action: unknown action"),
    (lambda raw: raw["device_traces"][0][1].update(time_us=10 ** 400),
     "device_traces[0][1].time_us: expected microseconds, a non-negative int under 2**63, got 1000"),
    (lambda raw: raw["allocator_settings"].update(max_split_size="20MB"),
     "allocator_settings.max_split_size: expected an int (-1: unlimited), got '20MB'"),
    (lambda raw: raw["allocator_settings"].update(max_split_size=float("inf")),
     "allocator_settings.max_split_size: expected an int (-1: unlimited), got inf"),
    (lambda raw: raw["allocator_settings"].update(roundup_power2_divisions=1.5),
     "allocator_settings.roundup_power2_divisions: expected an int or a list"),
    (lambda raw: raw["allocator_settings"].update(garbage_collection_threshold="0.6"),
     "allocator_settings.garbage_collection_threshold: expected a number in [0, 1], got '0.6'"),
    (lambda raw: raw["allocator_settings"].update(expandable_segments="False"),
     "allocator_settings.expandable_segments: expected a bool, got 'False'"),
])
def test_a_snapshot_field_of_the_wrong_type_is_named(change, where, tmp_path, capsys):
    path = _snapshot(tmp_path, change)
    _refused(capsys, ["replay", str(path)], f"{path}: {where}")


# ---- traces ------------------------------------------------------------------------------------------------

def _trace(tmp_path, first_line: str) -> Path:
    lines = TRACE.read_text().splitlines()
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([first_line, *lines[1:]]) + "\n")
    return path


@pytest.mark.parametrize("line, needle", [
    ('{"timestamp": ' + "9" * 400 + ', "input_length": 1209, "output_length": 182, "hash_ids": [0, 1, 2]}',
     "field 'timestamp' must be at most 10,000,000,000,000 (milliseconds)"),
    ('{"timestamp": 0, "input_length": 1209, "output_length": 100000000, "hash_ids": [0, 1, 2]}',
     "field 'output_length' must be at most 10,000,000"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
])
def test_a_trace_number_beyond_reason_is_named(line, needle, tmp_path, capsys):
    path = _trace(tmp_path, line)
    _refused(capsys, ["simulate", "--trace", str(path)], f"{path}:1", needle)


# ---- configs and start-up logs -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, needle", [
    ('{"a":' * 50_000 + "1" + "}" * 50_000, "JSON nested too deeply"),
    (json.dumps({**json.loads(CONFIG.read_text()), "num_attention_heads": 2 ** 200}),
     "field 'num_attention_heads' must be at most 1,000,000,000,000, got 16069380442589902755"),
    (json.dumps({**json.loads(CONFIG.read_text()), "architectures": [1.5]}), "architectures[0] / model_type must be "
                                                                               "a string, got 1.5"),
])
def test_a_config_nested_too_deep_or_mistyped_is_named(text, needle, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(text)
    _refused(capsys, ["explain-log", str(SGLANG_LOG), "--model-config", str(path)], f"{path}", needle)


@pytest.mark.parametrize("log, old, new, needle", [
    (SGLANG_LOG, "avail mem=78.69 GB", "avail mem=" + "9" * 400 + " GB", ":2: reading '999"),
    (VLLM_LOG, "GPU KV cache size: 518,992 tokens", "GPU KV cache size: " + "9" * 400 + " tokens",
     ":11: KV cache tokens '999"),
    (VLLM_LOG, "Available KV cache memory: 39.6 GiB", "Available KV cache memory: 0.00 GiB",
     "'Available KV cache memory: 0.0 GiB' is not a pool kvlab can recompute"),
])
def test_a_log_reading_beyond_reason_is_named(log, old, new, needle, tmp_path, capsys):
    path = tmp_path / log.name
    text = log.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    _refused(capsys, ["explain-log", str(path)], str(path), needle)


def test_a_very_long_log_line_is_read_in_linear_time(tmp_path, capsys):
    """A 200,000-character run of word characters on a max_total_num_tokens line took minutes (a quadratic
    regex); now it is read in well under a second."""
    lines = SGLANG_LOG.read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if "max_total_num_tokens=" in line)
    lines[k] += " " + "a" * 200_000
    path = tmp_path / "long.log"
    path.write_text("\n".join(lines) + "\n")
    main(["explain-log", str(path), "--json"])  # imports, once
    capsys.readouterr()
    start = time.perf_counter()
    assert main(["explain-log", str(path), "--json"]) == 0
    assert time.perf_counter() - start < 3


def test_a_huge_value_in_an_error_is_shown_cut(tmp_path, capsys):
    """A 100,000-character value made a 100,000-character error line: the value is cut to 60 characters."""
    path = tmp_path / "cut.log"
    path.write_text(SGLANG_LOG.read_text().replace("context_len=131072", "context_len=131072" + "a" * 100_000))
    err = _refused(capsys, ["explain-log", str(path)], f"{path}:6: context_len=131072aaa", "... is not an integer")
    assert len(err) < 300


# ---- huge numbers and repeated keys on the command line (issue 26) -------------------------------------------

@pytest.mark.parametrize("flag, value", [
    ("--kv-tokens", "99999999999999999999"), ("--kv-pages", "99999999999999999999"),
    ("--max-running", "99999999999999999999"), ("--kv-tokens", "3000000000"), ("--kv-tokens", "3e9"),
])
def test_a_huge_simulate_number_is_refused_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--workload", "few-shot", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and value[:20] in err and "Traceback" not in err, err


def test_pages_times_the_page_size_beyond_the_bound_is_refused(capsys):
    _refused(capsys, ["simulate", "--workload", "few-shot", "--kv-pages", "67108864", "--page-size", "64"],
             "--kv-pages 67108864", "at most")


@pytest.mark.parametrize("params, needles", [
    (["num_groups=1000000000"], ["--workload-param num_groups=1000000000", "at most"]),
    (["num_groups=4", "num_groups=8"], ["--workload-param 'num_groups' given twice", "4", "8"]),
])
def test_a_workload_param_huge_or_given_twice_is_refused(params, needles, capsys):
    argv = ["simulate", "--workload", "generated-shared-prefix"]
    for item in params:
        argv += ["--workload-param", item]
    _refused(capsys, argv, *needles)
