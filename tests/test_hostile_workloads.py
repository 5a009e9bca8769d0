"""Issue 37, items 3, 4, 6 and 8: huge generated workloads and traces are refused before anything is generated or
run, naming the parameters, the size they make and the limit (one bound for both, kvlab.workloads.bounds);
``--workload-param seed=N`` points to ``--seed``; a pool or page size is refused by one check for ``kvlab simulate``
and every ``kvlab sweep`` point, naming the flag and the value the user gave (never a setting they did not)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import pytest

from kvlab.cli import main
from kvlab.workloads import load_trace, make_workload
from kvlab.workloads.bounds import MAX_OUTPUT_TOKENS, MAX_REQUESTS, WorkloadTooLarge

# the inputs: each was a MemoryError (exit 3) or ran past 60 s with no output
HUGE = [
    ("generated-shared-prefix", {"num_groups": 1_000_000, "vocab_size": 1_000_000}, "num_groups × prompts_per_group",
     "requests"),
    ("generated-shared-prefix", {"num_groups": 1000, "prompts_per_group": 1000}, "num_groups × prompts_per_group",
     "requests"),
    ("multi-turn-chat", {"turns": 1_000_000}, "num_sessions × turns", "requests"),
    ("generated-shared-prefix", {"prompts_per_group": 1_000_000}, "num_groups × prompts_per_group", "requests"),
    ("few-shot", {"num_requests": 1_000_000}, "num_requests", "requests"),
    ("generated-shared-prefix", {"output_len": 1_000_000}, "requests × output_len", "output tokens in all"),
    ("multi-turn-chat", {"turns": 20_000, "num_sessions": 1, "user_len": 1, "output_len": 0},
     "num_sessions × turns × (turns + 1) pieces", "held in memory"),
    ("few-shot", {"num_examples": 1_000_000, "example_len": 1, "num_requests": 1000}, "num_requests × num_examples",
     "held in memory"),
]


@pytest.mark.parametrize(("name", "params", "how", "what"), HUGE)
def test_a_huge_generated_workload_is_refused_at_once_naming_its_parameters(name, params, how, what, capsys):
    argv = ["simulate", "--workload", name]
    for key, value in params.items():
        argv += ["--workload-param", f"{key}={value}"]
    start = time.perf_counter()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - start < 5, "refused before generating, not after"
    assert err.startswith("kvlab: error: ") and err.count("\n") == 1, err
    assert how in err and what in err and "more than the" in err, err
    for key, value in params.items():
        assert f"{key}={value}" in err, err  # the parameters and values the user gave
    with pytest.raises(WorkloadTooLarge):  # the Python API refuses the same way
        make_workload(name, **params)


def test_a_huge_workload_takes_no_memory_before_its_refusal():
    """In a process capped at 1 GiB (the issue's MemoryError needed several), the refusal still comes."""
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from kvlab.workloads import make_workload; from kvlab.workloads.bounds import WorkloadTooLarge\n"
            "try: make_workload('generated-shared-prefix', num_groups=1_000_000, vocab_size=1_000_000)\n"
            "except WorkloadTooLarge as e: print('refused', e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("refused"), out.stderr[-500:]
    assert resource.getrlimit(resource.RLIMIT_AS)  # (the cap was the child's only)


def test_a_trace_gets_the_same_bound(tmp_path, capsys):
    """Four records of 10^7 output tokens each: every record is valid, the whole is beyond MAX_OUTPUT_TOKENS."""
    trace = tmp_path / "long-outputs.jsonl"
    records = [{"timestamp": i, "input_length": 1209, "output_length": 10 ** 7, "hash_ids": [0, 1, 2]}
               for i in range(4)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(WorkloadTooLarge, match=f"long-outputs.jsonl: the outputs of its 4 records = 40,000,000 "
                                               f"output tokens in all, more than the {MAX_OUTPUT_TOKENS:,}"):
        load_trace(trace)
    slow = tmp_path / "slow-path.jsonl"  # a blank line: read line by line, the same bound
    slow.write_text(trace.read_text() + "\n")
    with pytest.raises(WorkloadTooLarge, match="slow-path.jsonl: the outputs of its 4 records"):
        load_trace(slow)
    assert main(["simulate", "--trace", str(trace)]) == 2
    assert "long-outputs.jsonl: the outputs of its 4 records" in capsys.readouterr().err


def test_a_registered_workload_gets_the_same_bound():
    from kvlab.workloads import generators
    from kvlab.workloads.request import Request, TokenSequence

    @generators.register_workload("kvlab-test-many")
    def many(count: int = 1, seed: int = 0):
        one = TokenSequence.from_segments((range(4),))
        return [Request(rid=f"m{i}", arrival_time_s=0.0, prompt_token_ids=one, output_len=1) for i in range(count)]

    try:
        assert len(make_workload("kvlab-test-many", count=3)) == 3
        with pytest.raises(WorkloadTooLarge, match=f"workload 'kvlab-test-many' with count={MAX_REQUESTS + 1}: "
                                                   f"{MAX_REQUESTS + 1:,} requests"):
            make_workload("kvlab-test-many", count=MAX_REQUESTS + 1)
    finally:
        del generators.WORKLOADS["kvlab-test-many"]


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_workload_param_seed_points_to_the_seed_flag(command, capsys):
    assert main([command, "--workload", "few-shot", "--workload-param", "seed=5"]) == 2
    err = capsys.readouterr().err
    assert "--workload-param seed=5" in err and "--seed 5" in err, err


@pytest.mark.parametrize(("argv", "named", "not_named"), [
    (["--page-size", "10000"], "--page-size 10000: a page must fit in one prefill chunk", "chunked_prefill_size=8192"),
    (["--page-size", "67108864"], "--page-size 67108864", "--kv-tokens"),
    (["--page-size", "512", "--kv-pages", "20000000000"],
     "--kv-pages 20000000000 at --page-size 512 is 10,240,000,000,000 tokens", "kv_tokens="),
    (["--kv-tokens", "100"], "--kv-tokens 100 at the default page size 1", "kv_tokens="),
    (["--kv-tokens", "1000000", "--hicache-ratio", "1000"], "--hicache-ratio 1000", "Traceback"),
])
@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_pool_errors_name_the_flag_given(command, argv, named, not_named, capsys):
    """Issue 37 item 6: the message names what the user typed, never a setting they did not; item 8: sweep refuses
    what simulate refuses, with the same check."""
    if command == "sweep":
        named = named.replace("the default page size 1", "--page-size 1")
    assert main([command, "--workload", "few-shot", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and not_named not in err, err
