"""Finding 2's token account closes (issue 25 item 4): for every run, in both eviction modes,

    prompt tokens served from the cache + prompt tokens prefilled at first admission = prompt tokens
    prompt tokens prefilled at first admission + tokens prefilled again after a retraction = prefill computed

and the comparison's empty state (no pressure event at all) says so in its verdict, gauge and timelines."""

import pytest

from kvlab.experiments import shortfall_eviction as se
from kvlab.sched import simulate
from kvlab.viz import eviction_plots, plots
from kvlab.viz.widgets import gauge_figure

# (workload, overrides, page size, pool tokens): small pools so most of them retract, and both page paths
CASES = [
    ("generated-shared-prefix", (("num_groups", 16), ("prompts_per_group", 8), ("output_len", 128)), 128, 9_216),
    ("generated-shared-prefix", (("num_groups", 16), ("prompts_per_group", 8), ("output_len", 128)), 1, 12_000),
    ("multi-turn-chat", (("num_sessions", 16), ("turns", 4)), 16, 4_096),
    ("few-shot", (("num_requests", 96),), 1, 8_192),
    ("few-shot", (("num_requests", 96),), 1, 16_384),  # no pressure at all
]


def _first_prefill(totals: dict) -> int:
    return totals["prefill_tokens_computed"] - totals["reprefill_tokens"]


@pytest.mark.parametrize("workload, overrides, page_size, kv_tokens", CASES,
                         ids=[f"{w}-p{p}-{k}" for w, _, p, k in CASES])
def test_the_token_account_closes_in_both_modes(workload, overrides, page_size, kv_tokens):
    settings = se.PanelSettings(workload=workload, overrides=overrides, kv_tokens=kv_tokens, page_size=page_size)
    comparison = se.compare(settings.requests(), progress=False, **settings.run_options())
    for _mode, result in comparison.arms():
        t = result.totals()
        assert t["aborted"] == 0 and t["requests"] == len(settings.requests())
        assert t["cached_prompt_tokens"] + _first_prefill(t) == t["prompt_tokens"]
        assert 0 <= t["reprefill_tokens"] <= t["prefill_tokens_computed"]
        assert (t["reprefill_tokens"] > 0) == (t["retractions"] > 0)  # re-prefill exactly when something retracted
    causes = comparison.prefill_causes()
    assert causes["extra_prefill"] == causes["lost_hits"] + causes["reprefill"]


def test_the_cases_retract_so_the_reprefill_term_is_exercised():
    for workload, overrides, page_size, kv_tokens in CASES[:4]:
        settings = se.PanelSettings(workload=workload, overrides=overrides, kv_tokens=kv_tokens, page_size=page_size)
        t = se.run(settings.requests(), eviction="full", progress=False, **settings.run_options()).totals()
        assert t["retractions"] > 0 and t["reprefill_tokens"] > 0, (workload, page_size, kv_tokens)


def test_fast_decode_counts_reprefill_as_the_reference_loop_does():
    workload, overrides, page_size, kv_tokens = CASES[0]
    settings = se.PanelSettings(workload=workload, overrides=overrides, kv_tokens=kv_tokens, page_size=page_size)
    requests = settings.requests()
    fast = se.run(requests, eviction="full", progress=False, **settings.run_options())
    plain = simulate(requests, fast.config.__class__(**{**fast.config.__dict__, "fast_decode": False}), progress=False)
    assert fast.totals() == plain.totals()


@pytest.fixture(scope="module")
def calm():
    """A pool far larger than the workload: no allocation is ever short."""
    settings = se.PanelSettings(workload="few-shot", overrides=(("num_requests", 32),), kv_tokens=131_072)
    return se.compare(settings.requests(), progress=False, **settings.run_options())


def test_no_pressure_event_says_so(calm):
    fix, bug = calm.shortfall.totals(), calm.full.totals()
    assert fix["pressure_events"] == bug["pressure_events"] == 0
    verdict = calm.verdict()
    assert verdict.startswith("No pressure event in either mode") and "-0.00" not in verdict
    frame = calm.summary_frame()
    assert set(frame["difference (fix − bug)"]) == {"0.00 points", "0"}  # no "-0.00", no "+0"


def test_no_pressure_event_draws_no_empty_axes_and_no_empty_delta(calm):
    fig = eviction_plots.cumulative_eviction(calm.cumulative_frame())
    texts = [a.text for a in fig.layout.annotations]
    assert eviction_plots.EMPTY_ROW_TEXT["evicted_tokens"] in texts
    assert eviction_plots.EMPTY_ROW_TEXT["pressure_events"] in texts
    for axis in (fig.layout.yaxis, fig.layout.yaxis2):  # whole ticks 0, 1: never "0, 1, 1"
        assert axis.dtick == 1 and axis.range[0] == 0
    gauge = gauge_figure(calm, "full")
    assert gauge.data[0].mode == "number" and "the same in both modes" in gauge.data[0].title.text
    moved = plots.hit_rate_indicator(0.52, 0.47)
    assert moved.data[0].mode == "number+delta"
