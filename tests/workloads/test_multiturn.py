"""The multi-turn benchmark's workload (bench_multiturn.py): exact prompt lengths, whole-history resends, no prefix
shared between clients, the script's defaults; its per-round table in ``kvlab simulate``'s text and JSON."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from kvlab.workloads import make_workload
from kvlab.workloads.multiturn import multiturn

SMALL = dict(num_clients=3, num_rounds=4, request_length=100, sub_question_input_length=30, output_length=7)


@pytest.mark.parametrize("random_sample", [False, True])
def test_prompts_resend_the_whole_history_with_exact_lengths(random_sample):
    reqs = make_workload("multiturn", seed=5, disable_random_sample=not random_sample, **SMALL)
    assert len(reqs) == 12
    # hand-computed: prompt(r) = 100 + r * (7 + 30)
    assert [len(r.prompt_token_ids) for r in reqs[:4]] == [100, 137, 174, 211]
    for prev, nxt in zip(reqs, reqs[1:]):
        if prev.session_id != nxt.session_id:
            continue
        history = list(prev.prompt_token_ids) + list(prev.output_token_ids)
        assert list(nxt.prompt_token_ids[:len(history)]) == history
        assert nxt.turn == prev.turn + 1
    firsts = {r.prompt_token_ids[0] for r in reqs if r.turn == 0}
    assert len(firsts) == 3  # clients share no prefix at all


def test_sub_question_zero_means_the_request_length():
    reqs = make_workload("multiturn", num_clients=1, num_rounds=3, request_length=64, output_length=1)
    assert [len(r.prompt_token_ids) for r in reqs] == [64, 64 + 65, 64 + 2 * 65]


def test_defaults_are_the_scripts():
    defaults = {k: p.default for k, p in inspect.signature(multiturn).parameters.items()}
    assert defaults == dict(num_clients=256, num_rounds=5, request_length=512, sub_question_input_length=0,
                            output_length=64, max_parallel=128, request_rate=1.0, ready_queue_policy="random",
                            enable_round_barrier=False, disable_random_sample=False, seed=0)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "kvlab.cli", "simulate", *args], capture_output=True, text=True,
                          timeout=120)


ROUNDS_ARGS = ["--workload", "multiturn", "--page-size", "16", "--kv-tokens", "65536",
               *[a for k, v in dict(num_clients=4, num_rounds=3, request_length=256, output_length=1,
                                    enable_round_barrier="true").items() for a in ("--workload-param", f"{k}={v}")]]


def _ideal(round_, length=256, out=1, page=16):
    """No eviction: round r reuses floor((prompt(r-1) + O - 1) / page) pages of its prompt."""
    if round_ == 0:
        return 0.0
    prev = length + (round_ - 1) * (out + length)
    return (prev + out - 1) // page * page / (length + round_ * (out + length))


def test_rounds_in_json_and_text():
    done = _cli(*ROUNDS_ARGS, "--json")
    assert done.returncode == 0, done.stderr
    rounds = json.loads(done.stdout)["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert [r["cache_hit_rate"] for r in rounds] == [round(_ideal(r), 6) for r in range(3)]
    assert all(r["requests"] == 4 and r["clients"] == 4 and r["avg_ttft_s"] > 0 for r in rounds)
    text = _cli(*ROUNDS_ARGS).stdout
    for r in rounds:
        assert (f"Round {r['round']}: Average TTFT = {r['avg_ttft_s']:.2f}s, Cache Hit Rate = "
                f"{r['cache_hit_rate']:.6f} (4 requests, 4 clients)") in text


def test_other_workloads_print_no_rounds():
    done = _cli("--workload", "few-shot", "--workload-param", "num_requests=8", "--json")
    assert "rounds" not in json.loads(done.stdout)


@pytest.mark.parametrize("param, value", [("num_clients", "0"), ("max_parallel", "0"), ("request_rate", "-1"),
                                          ("ready_queue_policy", "lifo"), ("output_length", "0"),
                                          ("enable_round_barrier", "2")])
def test_bad_params_exit_2_naming_the_parameter(param, value):
    done = _cli("--workload", "multiturn", "--workload-param", f"{param}={value}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("kvlab: error:") and param in done.stderr and len(done.stderr.splitlines()) == 1
