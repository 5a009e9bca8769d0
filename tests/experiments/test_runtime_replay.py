"""What-ifs on a server's own load (issue 36): the trace derived from a runtime log holds the log's token counts,
its replay prints the distance from the logged usage and hit rate, and the what-ifs run on the same trace."""

import json

import pytest

from kvlab.experiments.runtime_replay import derive_requests, replay_runtime
from kvlab.serving.runtime.report import runtime_timeline
from tests.conftest import REPO_ROOT
from tests.serving.logs import run_cli

LOG = REPO_ROOT / "data" / "examples" / "runtime_logs" / "multi-turn-chat-20k-sglang-0.5.23-rendered.log"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "runtime_logs"


def test_derived_trace_holds_the_logs_tokens():
    tl = runtime_timeline(LOG)
    requests = derive_requests(tl)
    prefill = tl.frame[tl.frame["kind"] == "prefill"]
    assert len(requests) == int(prefill["new_seq"].sum())
    assert sum(len(r.prompt_token_ids) for r in requests) == int((prefill["new_token"] + prefill["cached_token"]).sum())
    decode_tokens = (tl.frame.loc[tl.frame["kind"] == "decode", "running"] * 40).sum()
    assert {r.output_len for r in requests} == {round(decode_tokens / len(requests))}
    assert [r.arrival_time_s for r in requests] == sorted(r.arrival_time_s for r in requests)


@pytest.mark.slow
def test_replay_of_a_known_run_is_close_and_the_what_ifs_move_the_right_way():
    replay = replay_runtime(runtime_timeline(LOG))
    assert replay.pool_tokens == 20000 and replay.logged["retractions"] == 16
    assert abs(replay.distance["hit_rate"]) < 0.10 and abs(replay.distance["peak_usage"]) < 0.15
    bigger = replay.what_ifs["pool x2"]
    assert bigger["retractions"] <= replay.simulated["retractions"] and bigger["peak_usage"] < replay.simulated["peak_usage"]
    assert set(replay.what_ifs) == {"pool x2", "host tier ratio 2", "full eviction (the bug)"}


@pytest.mark.slow
def test_cli_replay_prints_the_distance(capsys, tmp_path):
    code, out, err = run_cli(capsys, LOG, "--replay")
    assert code == 0, err
    assert "distance (replayed − logged): hit rate" in out and "assumed (the log does not say):" in out
    code, out, err = run_cli(capsys, LOG, "--replay", "--json")
    replay = json.loads(out)["runtime"]["replay"]
    assert set(replay["distance"]) == {"hit_rate", "mean_usage", "peak_usage", "retractions"}
    assert "replay_text" not in json.loads(out)["runtime"]


def test_without_replay_there_is_no_replay_section(capsys):
    code, out, _ = run_cli(capsys, LOG, "--json")
    assert code == 0 and "replay" not in json.loads(out)["runtime"]


def test_replay_needs_sglang_lines_and_a_pool(capsys):
    code, out, err = run_cli(capsys, FIXTURES / "vllm_v1_loggers_2026-05.log", "--replay")
    assert code == 2 and out == "" and "a replay needs SGLang Prefill lines" in err and err.count("\n") == 1
    code, out, err = run_cli(capsys, FIXTURES / "sglang_comma_untagged_2025-11.log", "--replay")
    assert code == 2 and "--pool-tokens" in err
