"""Finding 2 end to end: one pressure event, the CLI's totals contract, and the done-when condition."""

import json

import pytest

from kvlab import cli
from kvlab.experiments import shortfall_eviction

SMALL = ["--workload-param", "num_groups=16", "--workload-param", "prompts_per_group=8",
         "--workload-param", "output_len=128", "--kv-tokens", "20000"]
TOTALS = ("requests", "prompt_tokens", "cached_prompt_tokens", "hit_rate", "hit_pages", "prompt_pages",
          "evicted_tokens", "over_evicted_tokens", "prefill_tokens_computed", "retractions", "steps")


def test_one_pressure_event_full_mode_destroys_an_extra_prefix():
    """Worked: 300 slots free, 600 needed. LRU leaves (oldest first) hold 200, 250, 300, ... tokens.
    shortfall asks 300 -> evicts 200 + 250 = 450 (overshoot 150); full asks 600 -> 200 + 250 + 300 = 750,
    of which 300 beyond the shortfall."""
    fix, bug = shortfall_eviction.pressure_event("shortfall"), shortfall_eviction.pressure_event("full")
    assert fix.available_before == bug.available_before == 300
    assert (fix.evict.requested_tokens, fix.evict.evicted_tokens, fix.evict.over_evicted_tokens) == (300, 450, 0)
    assert (bug.evict.requested_tokens, bug.evict.evicted_tokens, bug.evict.over_evicted_tokens) == (600, 750, 300)
    assert fix.evict.overshoot_tokens == bug.evict.overshoot_tokens == 150
    assert set(bug.destroyed) - set(fix.destroyed) == {"conversation 3 (300 tokens after the system prompt)"}


def _simulate(capsys, *args) -> dict:
    assert cli.main(["simulate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_totals_contract_and_modes(capsys):
    fix = _simulate(capsys, "--workload", "generated-shared-prefix", *SMALL)
    bug = _simulate(capsys, "--workload", "generated-shared-prefix", *SMALL, "--eviction", "full")
    for key in TOTALS:
        assert key in fix and key in bug
    assert fix["hit_rate"] == pytest.approx(fix["cached_prompt_tokens"] / fix["prompt_tokens"], abs=1e-6)
    assert fix["over_evicted_tokens"] == 0 < bug["over_evicted_tokens"]
    assert bug["hit_rate"] < fix["hit_rate"]


@pytest.mark.slow
def test_done_when_default_generated_shared_prefix(capsys):
    """The issue's acceptance: the default workload under pressure (32k-token pool)."""
    fix = _simulate(capsys, "--workload", "generated-shared-prefix", "--eviction", "shortfall")
    bug = _simulate(capsys, "--workload", "generated-shared-prefix", "--eviction", "full")
    assert bug["over_evicted_tokens"] > 0 and bug["hit_rate"] < fix["hit_rate"]
    assert fix["requests"] == 1024


@pytest.mark.parametrize(
    "args,message",
    [
        (["--workload", "few-shot", "--kv-tokens", "100"], "smaller than one request"),
        (["--workload", "few-shot", "--workload-param", "bogus=1"], "has no parameter 'bogus'"),
        (["--workload", "few-shot", "--page-size", "16", "--kv-tokens", "50008"], "--kv-tokens 50008 is not a whole number of pages at --page-size 16"),
        (["--trace", "/nonexistent/trace.jsonl"], "/nonexistent/trace.jsonl: trace file not found"),
        (["--trace", "/"], "--trace /: is a folder, not a file"),
    ],
)
def test_cli_bad_input(args, message, capsys):
    assert cli.main(["simulate", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_compare_totals_in_two_processes_equals_the_arms_run_here():
    from kvlab.experiments import shortfall_eviction as se
    from kvlab.workloads.generators import make_workload

    requests = make_workload("generated-shared-prefix", seed=3, num_groups=4, prompts_per_group=4, output_len=16)
    options = dict(kv_tokens=8192, page_size=16)
    here = {mode: se.run(requests, eviction=mode, progress=False, **options).totals() for mode in se.MODES}
    both = se.compare_totals(requests, processes=2, progress=False, **options)
    assert list(both) == ["shortfall", "full"]
    for mode in se.MODES:
        timing = {k: both[mode].pop(k) for k in ("wall_s", "cpu_s")}
        assert both[mode] == here[mode] and timing["wall_s"] > 0 and timing["cpu_s"] > 0
    assert both["full"]["over_evicted_tokens"] > 0 == both["shortfall"]["over_evicted_tokens"]
    with pytest.raises(ValueError, match="processes must be >= 1"):
        se.compare_totals(requests, processes=0)


def test_cli_compare_prints_both_modes_and_their_difference(capsys):
    """--compare equals the two single-mode runs: the bug's column, the fix's, then fix − bug (shortfall − full)."""
    fix = _simulate(capsys, "--workload", "generated-shared-prefix", *SMALL)
    bug = _simulate(capsys, "--workload", "generated-shared-prefix", *SMALL, "--eviction", "full")
    both = _simulate(capsys, "--workload", "generated-shared-prefix", *SMALL, "--compare")
    assert both["shortfall"] == fix and both["full"] == bug
    assert "duration_s" not in fix and fix["simulated_s"] > 0  # the modelled server's clock, named as such
    diff = both["difference"]
    assert diff["of"] == "shortfall - full"
    assert diff["over_evicted_tokens"] == -bug["over_evicted_tokens"] < 0
    assert diff["hit_rate"] == pytest.approx(fix["hit_rate"] - bug["hit_rate"], abs=1e-6) and diff["hit_rate"] > 0
    assert "eviction" not in diff and "policy" not in diff

    assert cli.main(["simulate", "--workload", "generated-shared-prefix", *SMALL, "--compare"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].index("full (the bug)") < lines[1].index("shortfall (the fix)") < lines[1].index("(fix − bug)")
    hit = next(line for line in lines if line.split()[0] == "hit_rate").split()
    assert hit[1:3] == [f"{bug['hit_rate']:.2%}", f"{fix['hit_rate']:.2%}"]
    assert hit[3:] == [f"+{(fix['hit_rate'] - bug['hit_rate']) * 100:.2f}", "points"]
    assert list(both)[:2] == ["full", "shortfall"]


def test_cli_compare_refuses_a_single_mode(capsys):
    assert cli.main(["simulate", "--workload", "few-shot", "--compare", "--eviction", "full"]) == 2
    assert "--compare runs both eviction modes: drop --eviction full" in capsys.readouterr().err
