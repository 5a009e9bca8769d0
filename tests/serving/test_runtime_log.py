"""Runtime logs (issue 36): every number kvlab reads from a real SGLang or vLLM runtime line equals the line it came
from (checked with separate, simple regexes here), the overall hit rate is Σ cached / Σ (new + cached) computed
by hand from the text, bad and cut logs give a partial reading that names what was skipped, and explain-log's
``runtime`` section appears only where runtime lines are."""

from __future__ import annotations

import json
import math
import re

import pytest

from kvlab.serving.runtime.report import format_runtime, runtime_json, runtime_timeline
from tests.conftest import REPO_ROOT
from tests.serving.logs import run_cli, write_log

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "runtime_logs"
LOGS = sorted(FIXTURES.glob("*.log"))
STARTUP = REPO_ROOT / "data" / "examples" / "server_logs" / "llama-3.1-8b-a100-sglang-0.2.9.log"
CONFIG = "llama-3.1-8b"  # the preset of that log's model

# printed name -> frame column, read here with one plain regex each (not kvlab's item splitter)
CHECKS = {
    "prefill": {"new_token": r"#new-token: (\d+)", "cached_token": r"#cached-token: (\d+)",
                "new_seq": r"#new-seq: (\d+)", "running": r"#running-req: (\d+)", "queue": r"#queue-req: (\d+)",
                "usage": r"(?<!swa )token usage: ([\d.]+)", "prefill_tput": r"input throughput \(token/s\): ([\d.]+)"},
    "decode": {"running": r"#running-req: (\d+)", "used_tokens": r"#(?:full )?token: (\d+)",
               "usage": r"(?<!swa )token usage: ([\d.]+)", "gen_tput": r"gen throughput \(token/s\): ([\d.]+)",
               "queue": r"#queue-req: (\d+)"},
    "vllm": {"running": r"Running: (\d+) reqs", "queue": r"(?:Waiting|Pending): (\d+) reqs",
             "usage%": r"GPU KV cache usage: ([\d.]+)%", "prefill_tput": r"Avg prompt throughput: ([\d.]+)",
             "gen_tput": r"Avg generation throughput: ([\d.]+)"},
}


def _text_lines(path):
    return path.read_text().splitlines()


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_every_number_equals_its_line(path):
    tl = runtime_timeline(path)
    lines = _text_lines(path)
    assert tl.log.n_lines == len(lines)
    checked = 0
    for row in tl.frame.itertuples():
        text = lines[row.line - 1]
        for column, pattern in CHECKS[row.kind].items():
            m = re.search(pattern, text)
            name = column.rstrip("%")
            value = getattr(row, name)
            if m is None:
                assert math.isnan(value), (path.name, row.line, name)
                continue
            expected = float(m.group(1)) / (100 if column.endswith("%") else 1)
            assert value == pytest.approx(expected, abs=1e-12), (path.name, row.line, name)
            checked += 1
    for event in tl.log.events:
        text = lines[event.line - 1]
        m = re.search(r"#retracted_reqs: (\d+)", text)
        assert event.count == (int(m.group(1)) if m else 1)
    assert checked or tl.log.events or tl.log.n_skipped


def _hand_hit_rate(path) -> float | None:
    cached = new = 0
    for line in _text_lines(path):
        if "Prefill batch" in line and re.search(r"TP(?!0\b)\d+", line) is None:
            c, n = re.search(r"#cached-token: (\d+)", line), re.search(r"#new-token: (\d+)", line)
            if c and n:
                cached, new = cached + int(c.group(1)), new + int(n.group(1))
    return cached / (cached + new) if cached + new else None


@pytest.mark.parametrize("path", [p for p in LOGS if p.name.startswith("sglang")], ids=lambda p: p.name)
def test_overall_hit_rate_is_sum_cached_over_sum_seen(path):
    data = runtime_json(runtime_timeline(path))
    expected = _hand_hit_rate(path)
    if expected is None:
        assert data["hit_rate"]["overall"] is None
    else:
        assert data["hit_rate"]["overall"] == pytest.approx(expected, rel=1e-12)


def test_the_fixtures_cover_three_sglang_formats_and_vllm():
    formats = set()
    for path in LOGS:
        tl = runtime_timeline(path)
        text = path.read_text()
        if tl.log.n_steps:
            formats.add((tl.log.engine, "Prefill batch." in text or "Decode batch." in text,
                         "cache hit rate" in text, "Engine 000" in text))
    assert len({f for f in formats if f[0] == "sglang"}) >= 3
    assert len({f for f in formats if f[0] == "vllm"}) >= 2  # V0 metrics.py and V1 loggers.py


def test_sglang_0_4_cumulative_hit_rate_column_is_read_as_printed():
    """0.3.x/0.4.0 print their own cumulative ``cache hit rate`` (0.00% in this issue's log, its radix cache
    counting only since the last flush); kvlab keeps it as printed and computes its own from the token counts."""
    tl = runtime_timeline(FIXTURES / "sglang_tp0_cache_hit_rate_2024-11.log")
    assert (tl.frame["logged_hit_rate"] == 0.0).all()
    assert tl.overall_hit_rate() > 0.3


def test_retractions_of_many_ranks_count_once_per_group():
    path = FIXTURES / "sglang_retract_multirank_2025-03.log"
    data = runtime_json(runtime_timeline(path))
    lowest = [line for line in _text_lines(path) if "TP8]" in line]
    assert data["events"]["retraction_lines"] == len(lowest) == 1
    assert data["findings"][0]["name"] == "pool_full_retracted"
    assert data["findings"][0]["lines"] == [6]
    assert "0.0980 -> 0.1919" in data["findings"][0]["text"]


def test_vllm_v0_and_v1_and_preemption():
    v1 = runtime_json(runtime_timeline(FIXTURES / "vllm_v1_loggers_2026-05.log"))
    assert v1["engine"] == "vllm" and v1["ranks"] == ["Engine 0"] and v1["usage"]["max"] == pytest.approx(0.984)
    v0 = runtime_timeline(FIXTURES / "vllm_v0_metrics_syslog_2024-09.log")
    assert v0.log.vllm_hit == {3: 0.2668}
    assert runtime_json(v0)["hit_rate"]["last_printed"] == 0.2668  # the stats line of line 2 takes it
    pre = runtime_json(runtime_timeline(FIXTURES / "vllm_preemption_warning_docs.log"))
    assert pre["events"]["preemptions"] == 1 and pre["events"]["first"][0]["cumulative"] == 1


def test_garbled_tqdm_lines_are_skipped_by_line_and_the_rest_read():
    path = FIXTURES / "sglang_garbled_tqdm_2026-05.log"
    data = runtime_json(runtime_timeline(path))
    assert data["skipped"]["count"] == 3
    assert [s["line"] for s in data["skipped"]["first"]] == [2, 3, 4]
    assert "#cached-tounning-req" in data["unknown_fields"]


def test_a_file_cut_mid_line_reads_what_is_there(tmp_path):
    text = (FIXTURES / "sglang_dot_tp0_cuda_graph_2025-09.log").read_text()
    path = write_log(tmp_path, text[: text.rindex("#cached-token") + 5])
    data = runtime_json(runtime_timeline(path))
    assert data["skipped"]["first"] == [{"line": 9, "why": "prefill line without cached_token (garbled or cut)"}]
    assert data["steps"] == {"prefill": 2, "decode": 4}


def test_a_value_that_is_no_number_is_skipped_with_its_name(tmp_path):
    path = write_log(tmp_path, "[2025-01-01 00:00:00 TP0] Decode batch. #running-req: 3, token usage: 0.x1, "
                               "gen throughput (token/s): 5.0, #queue-req: 0\n")
    data = runtime_json(runtime_timeline(path))
    assert data["skipped"]["first"][0]["line"] == 1 and "token usage" in data["skipped"]["first"][0]["why"]


def test_dp_ranks_each_count(tmp_path):
    lines = []
    for i in range(4):
        for dp in (0, 1):
            lines.append(f"[2026-01-01 00:00:0{i} DP{dp} TP{dp * 4}] Prefill batch, #new-seq: 1, #new-token: "
                         f"{100 * (dp + 1)}, #cached-token: {10 * i}, token usage: 0.{i}{dp}, #running-req: {i}, "
                         f"#queue-req: 0, ")
            lines.append(f"[2026-01-01 00:00:0{i} DP{dp} TP{dp * 4 + 1}] Prefill batch, #new-seq: 1, #new-token: "
                         f"{100 * (dp + 1)}, #cached-token: {10 * i}, token usage: 0.{i}{dp}, #running-req: {i}, "
                         f"#queue-req: 0, ")
    data = runtime_json(runtime_timeline(write_log(tmp_path, "\n".join(lines))))
    assert data["primary_ranks"] == ["DP0 TP0", "DP1 TP4"]
    assert data["hit_rate"]["cached_tokens"] == 2 * sum(10 * i for i in range(4))
    assert data["hit_rate"]["new_tokens"] == 4 * 100 + 4 * 200
    text = format_runtime(data)
    assert f"per rank: DP0 TP0 {60 / 460:.1%} (4 prefill lines), DP1 TP4 {60 / 860:.1%} (4 prefill lines)" in text


def test_pool_size_from_the_start_up_lines_gives_tokens(tmp_path, capsys):
    runtime = (FIXTURES / "sglang_dot_tp0_cuda_graph_2025-09.log").read_text()
    path = write_log(tmp_path, STARTUP.read_text() + runtime)
    code, out, err = run_cli(capsys, path, "--json", "--model-config", CONFIG)
    assert code == 0, err
    data = json.loads(out)
    assert data["runtime"]["pool_tokens"] == 443777 == data["max_total_num_tokens_logged"]
    assert data["runtime"]["pool_source"] == "the start-up lines' max_total_num_tokens"
    assert data["runtime"]["used_tokens"]["max"] == 274  # Decode's own #token, exact


def test_explain_log_without_runtime_lines_is_unchanged(capsys):
    code, out, err = run_cli(capsys, STARTUP, "--json", "--model-config", CONFIG)
    assert code == 0 and "runtime" not in json.loads(out), err
    code, out, _ = run_cli(capsys, STARTUP, "--model-config", CONFIG)
    assert code == 0 and "Runtime (" not in out


def test_a_start_up_error_other_than_no_readings_is_still_an_error(tmp_path, capsys):
    """Without --model-config the 0.2.9 log cannot be explained (no cell size): runtime lines after it do not
    hide that error."""
    runtime = (FIXTURES / "sglang_dot_tp0_cuda_graph_2025-09.log").read_text()
    code, _, err = run_cli(capsys, write_log(tmp_path, STARTUP.read_text() + runtime))
    assert code == 2 and "no cell size" in err


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_explain_log_on_runtime_lines_alone_exits_0(capsys, path):
    if not runtime_timeline(path).log.n_steps + len(runtime_timeline(path).log.events):
        code, out, err = run_cli(capsys, path)  # every runtime line garbled: an error naming the first
        assert code == 2 and out == "" and f"{path}:2: no runtime line could be read (3 skipped" in err
        return
    code, out, err = run_cli(capsys, path)
    assert code == 0, err
    assert out.startswith("Start-up: not explained (") and "\n\nRuntime (" in out
    code, out, err = run_cli(capsys, path, "--json")
    assert code == 0 and set(json.loads(out)) == {"runtime"}


@pytest.mark.parametrize("content", [b"", b"hello\n", b"\x00\xff\xfe" * 100, b"Decode batch. \n",
                                     b"[TP0] Prefill batch, #new-seq: 1, #new-tok"])
def test_a_log_with_neither_start_up_nor_runtime_lines_is_exit_2(tmp_path, capsys, content):
    path = tmp_path / "bad.log"
    path.write_bytes(content)
    code, out, err = run_cli(capsys, path)
    assert code == 2 and out == ""
    assert err.startswith("kvlab: error: ") and err.count("\n") == 1 and str(path) in err


def test_a_missing_log_is_exit_2(tmp_path, capsys):
    code, _, err = run_cli(capsys, tmp_path / "none.log")
    assert code == 2 and "none.log" in err


def test_vllm_v1_preemptions_field_is_an_event(tmp_path):
    """vLLM V1's loggers.py appends ``Preemptions: %d`` (since the last stats line) when it is > 0."""
    line = ("(APIServer pid=1) INFO 05-19 10:13:11 [loggers.py:271] Engine 001: Avg prompt throughput: 10.0 tokens/s, "
            "Avg generation throughput: 5.0 tokens/s, Running: 3 reqs, Waiting: 9 reqs, Preemptions: 4, "
            "GPU KV cache usage: 99.0%, Prefix cache hit rate: 12.5%")
    data = runtime_json(runtime_timeline(write_log(tmp_path, line + "\n")))
    assert data["events"]["preemptions"] == 4 and data["ranks"] == ["Engine 1"]
    assert data["findings"][0]["name"] == "pool_full_retracted" and data["findings"][0]["count"] == 4


# Lines in each version's format as its wheel writes them (pip download --no-deps sglang==V; docs/semantics.md,
# "Runtime logs"), with the numbers the test expects back.
WHEEL_FORMATS = {
    "0.2.0": ("[gpu_id=0] Prefill batch. #new-seq: 2, #new-token: 300, #cached-token: 100, cache hit rate: 25.00%, "
              "#running-req: 1, #queue-req: 4\n"
              "[gpu_id=0] Decode batch. #running-req: 3, #token: 512, token usage: 0.05, gen throughput (token/s): "
              "120.50, #queue-req: 4\n"
              "decode out of memory happened, #retracted_reqs: 2, #new_token_ratio: 0.4000 -> 0.6000\n"),
    "0.3.0": ("[10:00:01 TP0] Prefill batch(mixed #running-req: 3). #new-seq: 2, #new-token: 300, #cached-token: 100, "
              "cache hit rate: 25.00%, #queue-req: 4\n"
              "[10:00:02 TP0] Decode batch. #running-req: 3, #token: 512, token usage: 0.05, gen throughput "
              "(token/s): 120.50, #queue-req: 4\n"
              "[10:00:03 TP0] Decode out of memory happened. #retracted_reqs: 2, #new_token_ratio: 0.4000 -> 0.6000\n"),
    "0.5.23": ("[2026-01-01 10:00:01 DP1 TP2] Prefill batch, #new-seq: 2, #new-token: 300, #cached-token: 100, "
               "token usage: 0.04, #running-req: 1, #queue-req: 4, #pending-token: 0, cuda graph: False, input "
               "throughput (token/s): 900.00\n"
               "[2026-01-01 10:00:02 DP1 TP2] Decode batch, #running-req: 3, #token: 512, token usage: 0.05, cuda "
               "graph: True, gen throughput (token/s): 120.50, #queue-req: 4\n"
               "[2026-01-01 10:00:03 DP1 TP2] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
               "#new_tokens_gained: 640, #new_token_ratio: 0.4000 -> 0.6000\n"),
}


@pytest.mark.parametrize("version", WHEEL_FORMATS)
def test_each_wheels_format_reads_back(version):
    data = runtime_json(runtime_timeline(text=WHEEL_FORMATS[version], name=version))
    assert data["steps"] == {"prefill": 1, "decode": 1} and data["skipped"]["count"] == 0
    assert data["hit_rate"]["cached_tokens"] == 100 and data["hit_rate"]["new_tokens"] == 300
    assert data["used_tokens"]["max"] == 512 and data["queue"]["max"] == 4
    event = data["events"]["first"][0]
    assert event["count"] == 2 and event["new_token_ratio"] == [0.4, 0.6]
    assert data["time_axis"] == ("line" if version == "0.2.0" else "t_s")
    assert data["unknown_fields"] == {}


def test_hostile_values_and_names_are_bounded(tmp_path):
    lines = ["[TP0] Decode batch, #running-req: 1" + "9" * 400 + ", token usage: 0.10, #queue-req: 0",
             "[TP0] Decode batch, #running-req: nan, token usage: 0.10, #queue-req: 0",
             "[TP0] Decode batch, #running-req: 1e30, token usage: 0.10, #queue-req: 0"]
    lines += [f"[TP0] Decode batch, #running-req: 1, token usage: 0.10, field{i}: 1, #queue-req: 0" for i in range(200)]
    lines.append("[TP0] Decode batch, #running-req: 2, " + "x" * 5000 + ": 1, token usage: 0.10")
    data = runtime_json(runtime_timeline(write_log(tmp_path, "\n".join(lines))))
    assert data["skipped"]["count"] == 3 and [s["line"] for s in data["skipped"]["first"]] == [1, 2, 3]
    assert data["steps"] == {"decode": 201} and data["running"]["max"] == 2
    assert len(data["unknown_fields"]) == 51 and data["unknown_fields"]["(other names)"]["count"] == 151
    assert all(len(name) <= 60 for name in data["unknown_fields"])


def test_real_start_up_logs_have_no_runtime_reading():
    """The real start-up logs of ../shared (tests/serving/test_real_logs.py) hold no per-step line: nothing in
    them is read as one, or skipped as an unreadable one (no false anchor in server_args and the like)."""
    from tests.shared_data import real_data

    logs = real_data("sglang_logs_examples.jsonl")
    if logs is None:
        pytest.skip("../shared/real-data/sglang_logs_examples.jsonl is absent")
    for record in map(json.loads, logs.read_text().splitlines()):
        log = runtime_timeline(text="\n".join(record["lines"]), name=record["id"]).log
        assert (log.n_steps, len(log.events), log.n_skipped) == (0, 0, 0), record["id"]
        assert log.other_lines + (log.pool_line is not None) == len(record["lines"])


def test_docker_prefix_and_midnight_roll():
    text = ("sglang-1  | [23:59:58 TP0] Decode batch. #running-req: 3, #token: 10, token usage: 0.01, gen throughput "
            "(token/s): 1.00, #queue-req: 0\n"
            "sglang-1  | [00:00:01 TP0] Decode batch. #running-req: 4, #token: 11, token usage: 0.01, gen throughput "
            "(token/s): 1.00, #queue-req: 0\n")
    tl = runtime_timeline(text=text)
    assert list(tl.frame["t_s"]) == [0.0, 3.0] and list(tl.frame["running"]) == [3, 4] and tl.log.ranks == ["TP0"]
