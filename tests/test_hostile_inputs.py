"""Hostile and extreme inputs the mutation fuzz (tests/test_cli_fuzz.py) found or issue 26 lists: each is one
``kvlab: error:`` line naming the input and the field (exit 2), within seconds and bounded memory; never a
traceback (exit 3 fails any test: tests/conftest.py)."""

from __future__ import annotations

import json
import pickle
import re
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
    ('{"a":' * 50_000 + "1" + "}" * 50_000, "field 'a' is nested more than 32 levels deep"),
    (json.dumps({**json.loads(CONFIG.read_text()), "num_attention_heads": 2 ** 200}),
     "field 'num_attention_heads' must be at most 4,096 (beyond any model: kvlab stops there), got 16069380442589902755"),
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


BEGIN, END = "Load weight begin. avail mem=78.69 GB", "type=LlamaForCausalLM, avail mem=63.65 GB"


@pytest.mark.parametrize("zeroed, needle", [
    ((BEGIN,), ":2: 'Load weight begin' on rank0 reads avail mem=0.00 GB, yet the weights were loaded "
               "('Load weight end', line 3)"),
    ((BEGIN, END), ":2: 'Load weight begin' on rank0 reads avail mem=0.00 GB"),  # was a ZeroDivisionError
    ((END,), ":3: 'Load weight end' on rank0 reads avail mem=0.00 GB, yet a KV pool of 415,056 tokens was "
             "allocated after it ("),
])
def test_a_zero_reading_of_a_server_that_started_is_refused_naming_its_line(zeroed, needle, tmp_path, capsys):
    """0.00 GB free before loading (the weights were then loaded), or after loading on a log that shows the pool
    allocated, cannot be: it was a ZeroDivisionError (both zero), or exit 0 with a waterfall of negative weights,
    a negative pool budget and a computed pool of 0 tokens."""
    text = SGLANG_LOG.read_text()
    for old in zeroed:
        assert old in text
        text = text.replace(old, old.replace("78.69", "0.00").replace("63.65", "0.00"))
    path = tmp_path / SGLANG_LOG.name
    path.write_text(text)
    err = _refused(capsys, ["explain-log", str(path)], f"{path}{needle}", "every number computed from it would be "
                                                                         "meaningless")
    assert f"{path}:6)" in err or zeroed != (END,)  # the pool's line (max_total_num_tokens)


def test_a_zero_reading_after_load_of_a_failed_start_is_explained_without_nonsense(tmp_path, capsys):
    """A start that stopped for want of memory (no pool lines): 0.00 GB after loading is possible; the explanation
    is SGLang's own error, and nothing printed is inf or nan."""
    lines = SGLANG_LOG.read_text().replace(END, END.replace("63.65", "0.00")).splitlines(keepends=True)
    path = tmp_path / "failed.log"
    path.write_text("".join(line for line in lines if "KV Cache" not in line and "Memory pool" not in line
                            and "max_total_num_tokens" not in line))
    config = REPO / "data" / "tiny-llama" / "config.json"
    for extra in ([], ["--json"]):
        assert main(["explain-log", str(path), "--model-config", str(config), *extra]) == 0
        out = capsys.readouterr().out
        assert "no_room_for_pool" in out and not re.search(r"\b(nan|inf|infinity)\b", out, re.I), out


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
    ("--max-running", "99999999999999999999"), ("--kv-tokens", "3000000000000"), ("--kv-tokens", "3e9"),
])
def test_a_huge_simulate_number_is_refused_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--workload", "few-shot", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and value[:20] in err and "Traceback" not in err, err


def test_pages_times_the_page_size_beyond_the_bound_is_refused(capsys):
    _refused(capsys, ["simulate", "--workload", "few-shot", "--kv-pages", "68719476736", "--page-size", "64"],
             "--kv-pages 68719476736", "at most")


@pytest.mark.parametrize("params, needles", [
    (["num_groups=1000000000"], ["--workload-param num_groups=1000000000", "at most"]),
    (["num_groups=4", "num_groups=8"], ["--workload-param 'num_groups' given twice", "4", "8"]),
])
def test_a_workload_param_huge_or_given_twice_is_refused(params, needles, capsys):
    argv = ["simulate", "--workload", "generated-shared-prefix"]
    for item in params:
        argv += ["--workload-param", item]
    _refused(capsys, argv, *needles)


# ---- duplicate keys and repeated lines (issue 26: last or first won silently) -------------------------------

def test_a_replay_what_if_key_given_twice_is_refused(capsys):
    _refused(capsys, ["replay", str(SNAPSHOT), "--what-if", "expandable_segments=True,expandable_segments:False"],
             "'expandable_segments' given twice", "'expandable_segments=True'", "'expandable_segments:False'")


def test_a_trace_key_given_twice_is_refused_naming_the_line(tmp_path, capsys):
    path = _trace(tmp_path, '{"timestamp": 0, "input_length": 1209, "output_length": 182, "hash_ids": [0, 1, 2], '
                            '"output_length": 5}')
    _refused(capsys, ["simulate", "--trace", str(path)], f"{path}:1:", "key \"output_length\" given twice (182, then 5)")


def test_a_trace_line_with_colons_in_an_extra_value_still_loads(tmp_path, capsys):
    """The duplicate check looks closer only where a line has more colons than keys: such a line is read the
    same as before."""
    path = _trace(tmp_path, '{"timestamp": 0, "input_length": 1209, "output_length": 182, "hash_ids": [0, 1, 2], '
                            '"note": "a:b", "meta": {"x": 1}}')
    assert main(["simulate", "--trace", str(path), "--json"]) == 0, capsys.readouterr().err


def _explained(capsys, path: Path) -> dict:
    assert main(["explain-log", str(path), "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_restarted_server_in_one_log_is_read_from_its_last_start(tmp_path, capsys):
    """Two starts appended to one file: the second server_args line begins a new start; the earlier start's
    readings (here another fraction and less free memory) are set aside, and a finding says so."""
    lines = SGLANG_LOG.read_text().splitlines()
    first = [line.replace("avail mem=78.69", "avail mem=70.00").replace("mem_fraction_static=0.835",
                                                                          "mem_fraction_static=0.5")
             for line in lines[:4]]
    path = tmp_path / "restarted.log"
    path.write_text("\n".join(first + lines) + "\n")
    data = _explained(capsys, path)
    alone = _explained(capsys, SGLANG_LOG)
    assert data["mem_fraction_static"] == 0.835 and data["avail_before_load_gib"] == 78.69
    assert data["max_total_num_tokens_computed"] == alone["max_total_num_tokens_computed"]
    found = {f["id"]: f for f in data["findings"]}
    assert found["restarted"]["start_line"] == 5 and found["restarted"]["earlier_starts"] == [[1, 4]]
    assert "from line 5; lines 1–4 are set aside" in found["restarted"]["message"]


def test_a_reading_printed_twice_by_one_rank_keeps_the_first_and_names_both_lines(tmp_path, capsys):
    """A second 'Load weight begin/end' on one rank with no new server_args line (a draft model loaded in the same
    process): the first (the target model's) is used, and both lines are named; an identical copy is no note."""
    lines = SGLANG_LOG.read_text().splitlines()
    path = tmp_path / "twice.log"
    path.write_text("\n".join([lines[0], *lines[:3], lines[1].replace("78.69", "60.00"), lines[2], *lines[3:]])
                    + "\n")
    data = _explained(capsys, path)
    assert data["avail_before_load_gib"] == 78.69 and data["avail_after_load_gib"] == 63.65
    repeats = [f for f in data["findings"] if f["id"] == "repeated_reading"]
    assert [(f["line_used"], f["line_set_aside"]) for f in repeats] == [(3, 5)], repeats
    assert "'Load weight begin.' again at line 5" in repeats[0]["message"]
    assert not [f for f in data["findings"] if f["id"] == "restarted"]  # the server_args line copied: no new start


# ---- settings read from a log, and the serving what-if (issue 26) ----------------------------------------------

@pytest.mark.parametrize("old, new, needle", [
    ("mem_fraction_static=0.835", "mem_fraction_static=1.5", ":1: server_args mem_fraction_static=1.5: "
                                                             "mem_fraction_static must be in (0, 1)"),
    ("mem_fraction_static=0.835", "mem_fraction_static=0", "mem_fraction_static must be in (0, 1)"),
    ("mem_fraction_static=0.835", "mem_fraction_static=inf", "mem_fraction_static=inf: mem_fraction_static must"),
    ("mem_fraction_static=0.835", "mem_fraction_static=nan", "mem_fraction_static=nan: mem_fraction_static must"),
    ("tp_size=1", "tp_size=0", ":1: server_args tp_size=0: tp_size must be from 1 to 4,096"),
    ("tp_size=1", "tp_size=-2", ":1: server_args tp_size=-2: tp_size must be from 1 to 4,096"),
    ("tp_size=1", "tp_size=" + "1" + "0" * 30, "tp_size must be from 1 to 4,096"),
    ("dp_size=1", "dp_size=0", ":1: server_args dp_size=0: dp_size must be from 1"),
    ("page_size=1", "page_size=0", ":1: server_args page_size=0: page_size must be from 1"),
])
def test_a_setting_read_from_a_log_outside_its_range_is_named(old, new, needle, tmp_path, capsys):
    path = tmp_path / "server.log"
    text = SGLANG_LOG.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    _refused(capsys, ["explain-log", str(path)], f"{path}{needle}" if needle.startswith(":") else str(path), needle)


@pytest.mark.parametrize("value", ["100000000000000000000", "4097", "0" * 30 + "5000"])
def test_a_tp_what_if_beyond_any_server_is_refused(value, capsys):
    _refused(capsys, ["explain-log", str(SGLANG_LOG), "--model-config", "llama-3.1-8b", "--what-if", f"tp={value}"],
             f"--what-if 'tp={value}", "tp must be from 1 to 4,096")


# ---- report and app flags (issue 26) ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["report", "--notebooks", ""], "argument --notebooks: expected comma-separated names"),
    (["report", "--notebooks", "01,,02"], "argument --notebooks: an empty item in '01,,02'"),
    (["report", "--device", "\U0001f4a5"], "argument --device: expected auto, cuda, cuda:N or sim:<preset>"),
    (["report", "--device", "sim:h9000"], "argument --device: expected auto"),
    (["app", "--port", "70000"], "argument --port: expected a port number from 1 to 65535, got 70000"),
    (["app", "--port", "0"], "argument --port: expected a port number from 1 to 65535, got 0"),
    (["app", "--device", "gpu"], "argument --device: expected auto, cpu, cuda"),
])
def test_a_report_or_app_flag_out_of_range_is_refused_before_anything_runs(argv, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--notebook-dir", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


# ---- the remaining listed items (issue 26) -------------------------------------------------------------------

def _overlapping(raw):
    twin = pickle.loads(pickle.dumps(raw["segments"][0]))
    twin["address"] += 512
    for block in twin["blocks"]:
        block["address"] += 512
    raw["segments"].append(twin)


def test_overlapping_segments_are_refused_naming_both(tmp_path, capsys):
    """Two segments over the same addresses were replayed, diverging from event 0, without a note."""
    path = _snapshot(tmp_path, _overlapping)
    _refused(capsys, ["replay", str(path)], f"{path}: segments[3]: 0x7f0000000200 + 2,097,152 B overlaps "
                                            f"segments[0] (0x7f0000000000 + 2,097,152 B) on device 0")


@pytest.mark.slow
def test_a_notebook_json_without_cells_is_named_not_a_crash(tmp_path, capsys):
    """``kvlab report`` on a notebook file with no ``cells`` was exit 3 (nbformat's ValidationError)."""
    notebooks = tmp_path / "nbs"
    notebooks.mkdir()
    (notebooks / "01_broken.ipynb").write_text(json.dumps({"nbformat": 4, "metadata": {}}))
    _refused(capsys, ["report", "--notebook-dir", str(notebooks), "--no-png", "--out", str(tmp_path / "out")],
             "01_broken.ipynb: not a notebook kvlab can run", seconds=60)


@pytest.mark.parametrize("value, needle", [
    ("", "--kv-pages: expected a comma-separated list, got ''"),
    (",,", "--kv-pages: expected a comma-separated list, got ',,'"),
    ("30,,40", "--kv-pages: an empty item in '30,,40'"),
    ("9" * 30, "--kv-pages: expected at most 1,099,511,627,776, got 999"),
])
def test_sweep_pool_lists_empty_or_huge_are_refused_alike(value, needle, tmp_path, capsys):
    """``--kv-pages ""`` ran the default pools while ``,,`` was an error, and 10^30 pages was exit 3."""
    _refused(capsys, ["sweep", "--trace", str(TRACE), "--kv-pages", value, "--out", str(tmp_path / "s.csv")], needle)
    assert not (tmp_path / "s.csv").exists()


def _unusable_outs(tmp_path: Path) -> list[tuple[Path | str, str]]:
    plain = tmp_path / "notes.txt"
    plain.write_text("mine")
    (tmp_path / "rows.csv").mkdir()
    return [
        ("", "--out '': an empty path"),
        (tmp_path / "new" / ("a" * 300) / "rows.csv", f"the name '{'a' * 37}...' is 300 bytes, longer than the"),
        (tmp_path / "new" / ("b" * 300 + ".csv"), "is 304 bytes, longer than the"),
        (plain / "rows.csv", f"{plain} is not a folder"),
        (tmp_path / "rows.csv", "is a folder"),
    ]


def test_an_unusable_sweep_out_is_refused_before_any_point_runs(tmp_path, capsys):
    """A name too long for a folder kvlab creates was found by ``mkdir`` (a raw ``[Errno 36]`` naming no flag,
    after creating the folders above it); ``--out ''`` was called a folder. Each is refused naming --out, before
    a point runs (no table printed, nothing created)."""
    for out, needle in _unusable_outs(tmp_path):
        err = _refused(capsys, ["sweep", "--trace", str(TRACE), "--kv-pages", "30,40,50", "--workers", "1",
                                "--out", str(out)], f"--out {out}" if out else "--out ''", needle, seconds=10)
        assert not capsys.readouterr().out, (out, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "rows.csv"]
    assert (tmp_path / "notes.txt").read_text() == "mine" and not any((tmp_path / "rows.csv").iterdir())


def test_a_sweep_file_whose_folder_cannot_be_made_is_named(tmp_path):
    """The library path (``run_sweep(out=...)``) has no command-line check in front: the ``mkdir`` error names
    the file."""
    from kvlab.sweep.grid import SweepError
    from kvlab.sweep.store import open_row_file

    out = tmp_path / ("a" * 300) / "rows.csv"
    with pytest.raises(SweepError, match=r"^--out .*/rows\.csv: its folder cannot be created \(File name too long\)"):
        open_row_file(out, write=True)


@pytest.mark.parametrize("flag", ["--capacity", "--device-memory"])
def test_a_replay_size_beyond_any_device_is_refused(flag, capsys):
    """10^20 bytes overflowed deep in the replay (exit 3)."""
    _refused(capsys, ["replay", str(SNAPSHOT), flag, "99999999999999999999"], f"{flag}: size '9999", "at most 1,024 TiB")


@pytest.mark.parametrize("value", ["1e30", "0.00", "415056x"])
def test_a_logged_pool_size_that_is_no_whole_number_is_named(value, tmp_path, capsys):
    """``max_total_num_tokens=1e30`` was read as 1, ``0.00`` as 0."""
    path = tmp_path / "server.log"
    path.write_text(SGLANG_LOG.read_text().replace("max_total_num_tokens=415056", f"max_total_num_tokens={value}"))
    _refused(capsys, ["explain-log", str(path)], f"{path}:6: 'max_total_num_token' line without a readable number")


def test_a_request_table_beyond_the_machine_is_refused_within_seconds(tmp_path, capsys):
    """Requests of 10^7 output tokens at 100,000 running rows: a 4 TB request-to-token table was torch's raw
    allocator message (or the machine swapping). The token-level memory has that table (it runs page size 1; the
    page engine, the default at page size 512 with or without HiCache, has none: next test)."""
    path = tmp_path / "long.jsonl"
    path.write_text("".join(_trace_line_json(i) + "\n" for i in range(2)))
    _refused(capsys, ["simulate", "--trace", str(path), "--max-running", "100000", "--page-size", "1",
                      "--hicache-ratio", "2"],
             "req_to_token table would take 100,002 × 10,001,210 torch.int32", "lower --max-running")


def test_outputs_beyond_the_step_cap_end_naming_the_longest_request(tmp_path, capsys):
    """The same requests on the page engine (no table): the run goes to the simulator's step cap in seconds (its
    quiet decode rounds run in bulk) and ends with one line naming the trace line of the longest request."""
    path = tmp_path / "long.jsonl"
    path.write_text("".join(_trace_line_json(i) + "\n" for i in range(2)))
    _refused(capsys, ["simulate", "--trace", str(path), "--max-running", "100000"],
             f"--trace {path}:1: request long-0, the trace's longest (prompt 1,209 + output_length 10,000,000 "
             "tokens): the simulation did not finish in 10,000,000 steps", "every output token is a decode step")


def _trace_line_json(timestamp: int, output_length: int = 10 ** 7) -> str:
    return json.dumps({"timestamp": timestamp, "input_length": 1209, "output_length": output_length,
                       "hash_ids": [0, 1, 2]})


def test_a_request_table_beyond_the_machine_names_the_trace_line_that_sets_it(tmp_path, capsys):
    """The refusal named the table, not the input that sized it: it names the trace file, the longest request's
    line (blank lines counted) and its lengths."""
    path = tmp_path / "long.jsonl"
    path.write_text(_trace_line_json(0, 182) + "\n\n" + _trace_line_json(1) + "\n" + _trace_line_json(2, 5) + "\n")
    _refused(capsys, ["simulate", "--trace", str(path), "--max-running", "100000", "--page-size", "1",
                      "--hicache-ratio", "2"],
             f"--trace {path}:3: request long-1, the trace's longest (prompt 1,209 + output_length 10,000,000 tokens)",
             "req_to_token table would take 100,002 × 10,001,210 torch.int32")


def test_a_workload_param_error_names_the_params_given(capsys):
    _refused(capsys, ["simulate", "--workload", "generated-shared-prefix", "--workload-param", "num_groups=-1"],
             "workload 'generated-shared-prefix' with num_groups=-1: num_groups must be an int >= 1, got -1")
