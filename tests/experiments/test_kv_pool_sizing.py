"""Finding 1 end to end: the PR scenario, and regression tests that keep gc.collect() on the measurement path."""

import json
from pathlib import Path

import pytest

from kvlab import cli
from kvlab.device import get_device
from kvlab.device.measure import automatic_gc_paused, get_available_gpu_memory
from kvlab.experiments import kv_pool_sizing

PR_REFUSAL = "Input length (3034 tokens) exceeds the maximum allowed length ({} tokens). " \
             "Use a shorter input or enable --allow-auto-truncate."


@pytest.fixture(scope="module")
def pr_arms():
    return kv_pool_sizing.compare("sglang-pr-4xh200")


def test_pr_scenario_without_gc_refuses_the_prompt(pr_arms):
    no_gc, _ = pr_arms
    assert not no_gc.accepted
    assert 1000 <= no_gc.max_total_num_tokens <= 3000  # the PR's order: 1,741
    assert no_gc.error == PR_REFUSAL.format(no_gc.budget.max_req_input_len)
    assert no_gc.budget.max_req_input_len == no_gc.max_total_num_tokens - 6


def test_pr_scenario_with_gc_accepts_with_a_100x_pool(pr_arms):
    no_gc, with_gc = pr_arms
    assert with_gc.accepted and with_gc.error is None
    assert with_gc.max_total_num_tokens >= 100 * no_gc.max_total_num_tokens
    assert abs(with_gc.max_total_num_tokens / 349_377 - 1) < 0.10  # the PR's pool with the fix
    # the memory the no-gc server leaves idle is what its pool is missing
    assert no_gc.idle_bytes - with_gc.idle_bytes == pytest.approx(with_gc.budget.kv_pool_bytes - no_gc.budget.kv_pool_bytes, rel=0.01)


def test_arms_differ_only_in_the_reading(pr_arms):
    no_gc, with_gc = pr_arms
    assert no_gc.pre_load == with_gc.pre_load
    assert no_gc.reading.free_bytes < with_gc.reading.free_bytes
    held = sum(w.kept_staging_bytes for w in no_gc.weights)
    # what gc gives back is the staging the loader's cycle kept (to within segment rounding)
    assert with_gc.reading.free_bytes - no_gc.reading.free_bytes == pytest.approx(held, rel=0.01)


def test_default_measurement_path_collects_first():
    """Fails if gc.collect() is taken off the default measurement path: a cycle-held tensor must not be read as used."""
    device = get_device("sim:h100-80g")
    baseline = device.mem_get_info()[0]
    with automatic_gc_paused():
        class Holder:
            pass

        holder = Holder()
        holder.self = holder
        holder.tensor = device.empty((512, 1024, 1024), label="cycle-held")  # 1 GiB, meta storage
        del holder
        reading = get_available_gpu_memory(device)  # defaults: the fixed behaviour
    assert reading.free_bytes == baseline


def test_scenario_default_is_the_fixed_behaviour():
    result = kv_pool_sizing.run("tiny-h100")
    assert result.gc_before_measure
    # with the fix, the post-load reading equals an oracle: free before load minus the weights' segments
    oracle_free = result.pre_load.free_bytes - result.reading.reserved_bytes[0]
    assert result.reading.free_bytes == oracle_free
    assert result.reading.allocated_bytes[0] == pytest.approx(sum(w.weight_bytes for w in result.weights), rel=0.01)


@pytest.mark.slow
def test_empty_cache_off_under_reads_even_with_gc():
    with_both = kv_pool_sizing.run("llama-8b-l4")
    gc_only = kv_pool_sizing.run("llama-8b-l4", empty_cache=False)
    assert gc_only.reading.free_bytes < with_both.reading.free_bytes
    # freed but cached: reserved exceeds allocated by at least the kept staging
    assert gc_only.reading.reserved_bytes[0] - gc_only.reading.allocated_bytes[0] >= 2 * 10**9


def test_runs_are_deterministic():
    a = kv_pool_sizing.run("llama-8b-l4", gc_before_measure=False)
    b = kv_pool_sizing.run("llama-8b-l4", gc_before_measure=False)
    assert a.to_json() == b.to_json()
    assert a.timeline.equals(b.timeline)


def test_low_fraction_gives_sglangs_no_memory_error():
    result = kv_pool_sizing.run("sglang-pr-4xh200", gc_before_measure=False, mem_fraction_static=0.6)
    assert result.budget is None and not result.accepted
    assert result.error.startswith("Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.6")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(scenario="nope"), "unknown preset 'nope'"),
        (dict(mem_fraction_static=1.2), "mem_fraction_static must be in \\(0, 1\\), got 1.2"),
        (dict(prompt_tokens=0), "positive number of tokens, got 0"),
        (dict(device="sim:h300"), "unknown device preset 'h300'"),
    ],
)
def test_bad_input(kwargs, match):
    scenario = kwargs.pop("scenario", "tiny-h100")
    with pytest.raises(ValueError, match=match):
        kv_pool_sizing.run(scenario, **kwargs)


def test_cli_json_contract(capsys):
    assert cli.main(["repro", "kv-pool-sizing", "--preset", "sglang-pr-4xh200", "--no-gc-before-measure", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for field in ("max_total_num_tokens", "max_req_input_len", "available_bytes", "rest_bytes", "cell_size_bytes",
                  "prompt_tokens", "accepted", "error"):
        assert field in data
    assert data["accepted"] is False and data["prompt_tokens"] == 3034
    assert data["error"] == PR_REFUSAL.format(data["max_req_input_len"])


def test_cli_human_output(capsys):
    assert cli.main(["repro", "kv-pool-sizing", "--preset", "llama-8b-l4", "--no-gc-before-measure"]) == 0
    out = capsys.readouterr().out
    assert "WITHOUT gc.collect()" in out and "max_total_num_tokens" in out and "ACCEPTED" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--preset", "nope"], "invalid choice: 'nope'"),
        (["--mem-fraction-static", "1.5"], "must be in (0, 1), got 1.5"),
        (["--prompt-tokens", "-4"], "expected a positive integer, got -4"),
    ],
)
def test_cli_bad_input(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["repro", "kv-pool-sizing", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_bad_device_is_a_clear_error(capsys):
    assert cli.main(["repro", "kv-pool-sizing", "--preset", "tiny-h100", "--device", "sim:h300"]) == 2
    assert "unknown device preset 'h300'" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_compare_prints_both_arms_and_their_difference(capsys):
    from kvlab.units import fmt_bytes

    def run(*args):
        assert cli.main(["repro", "kv-pool-sizing", "--preset", "llama-8b-l4", *args, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    no_gc, with_gc = run("--no-gc-before-measure"), run("--gc-before-measure")
    both = run("--compare")
    assert both["without_gc"] == no_gc and both["with_gc"] == with_gc
    diff = both["difference"]
    assert diff["of"] == "with_gc - without_gc"
    assert diff["max_total_num_tokens"] == with_gc["max_total_num_tokens"] - no_gc["max_total_num_tokens"] > 0
    assert diff["available_bytes"] == with_gc["available_bytes"] - no_gc["available_bytes"]
    assert "accepted" not in diff and "preset" not in diff

    assert cli.main(["repro", "kv-pool-sizing", "--preset", "llama-8b-l4", "--compare"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[0] == "max_total_num_tokens").split()
    assert row[1:] == [f"{no_gc['max_total_num_tokens']:,}", f"{with_gc['max_total_num_tokens']:,}",
                       f"+{diff['max_total_num_tokens']:,}"]  # the bug, the fix, fix − bug
    assert list(both)[:2] == ["without_gc", "with_gc"]
    assert fmt_bytes(with_gc["available_bytes"]).split()[0] in out

    assert cli.main(["repro", "kv-pool-sizing", "--compare", "--gc-before-measure"]) == 2
    assert "drop --gc-before-measure" in capsys.readouterr().err


@pytest.mark.slow
def test_the_prs_numbers_and_kvlabs_are_explained_in_one_text_everywhere(capsys):
    """README, the CLI and notebook 01 give the same sentence, computed from this run's pool sizes."""
    from kvlab.experiments.kv_pool_sizing import PR_TOKENS, compare, pr_numbers_note

    no_gc, with_gc = compare("sglang-pr-4xh200")
    note = pr_numbers_note(no_gc.max_total_num_tokens, with_gc.max_total_num_tokens)
    assert f"{PR_TOKENS[0]:,} → {PR_TOKENS[1]:,}" in note
    assert f"{no_gc.max_total_num_tokens:,} → {with_gc.max_total_num_tokens:,}" in note
    assert cli.main(["repro", "kv-pool-sizing", "--compare"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == note
    root = Path(__file__).resolve().parents[2]
    assert note in (root / "README.md").read_text(), "README's note is stale: paste `kvlab repro kv-pool-sizing --compare`'s last line"
    notebook = (root / "notebooks" / "01_kv_pool_sizing.py").read_text()
    assert "pr_numbers_note(" in notebook, "notebook 01 must show the same note"
