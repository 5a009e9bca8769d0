"""The finding-1 widget panel, headless: set a control, assert on the figures and the table."""

import plotly.graph_objects as go
import pytest

from kvlab.experiments import kv_pool_sizing
from kvlab.viz import plots
from kvlab.viz.widgets import KVPoolPanel

GIB = float(1 << 30)


@pytest.fixture(scope="module")
def panel():
    return KVPoolPanel("llama-8b-l4")


def _waterfall_total(panel):
    return sum(panel.waterfall.data[0].y)


def test_toggle_switches_the_budget_and_verdict(panel):
    panel.gc_toggle.value = True
    with_gc = kv_pool_sizing.run("llama-8b-l4", gc_before_measure=True)
    assert _waterfall_total(panel) == pytest.approx(with_gc.budget.rest_bytes / GIB, abs=1e-3)
    assert f"data-max-total-num-tokens='{with_gc.max_total_num_tokens}'" in panel.verdict.value
    panel.gc_toggle.value = False
    no_gc = kv_pool_sizing.run("llama-8b-l4", gc_before_measure=False)
    assert _waterfall_total(panel) == pytest.approx(no_gc.budget.rest_bytes / GIB, abs=1e-3)
    assert f"data-max-total-num-tokens='{no_gc.max_total_num_tokens}'" in panel.verdict.value
    assert f"data-value='{no_gc.max_total_num_tokens}'" in panel.table.value


def test_timelines_show_both_arms(panel):
    no_gc, with_gc = panel.arms()
    n = plots.TRACES_PER_TIMELINE
    assert list(panel.timelines.data[0].y) == (no_gc.timeline["allocated_bytes"] / GIB).round(4).tolist()
    assert list(panel.timelines.data[n].y) == (with_gc.timeline["allocated_bytes"] / GIB).round(4).tolist()
    # the dashed parameters line: at measurement the no-gc arm sits above it by the held staging
    weights_gib = panel.timelines.data[n - 1].y[0]
    assert weights_gib == pytest.approx(no_gc.weights_bytes / GIB, abs=1e-3)
    measured = no_gc.timeline[no_gc.timeline["phase"] == "measure"]["allocated_bytes"].iloc[-1] / GIB
    assert measured - weights_gib == pytest.approx(sum(w.kept_staging_bytes for w in no_gc.weights) / GIB, abs=0.01)
    texts = [a.text for a in panel.timelines.figure.layout.annotations]
    assert sum("pool sized here" in t for t in texts) == 2  # each arm's post-load reading is labelled
    # the collection is labelled with what it freed: the loader's staging, held by the cycle until then
    gc_label = next(t for t in texts if t.startswith("<b>gc.collect()</b>"))
    freed = float(gc_label.split("frees ")[1].split(" GiB")[0])
    spans = [s for s in plots.phase_spans(with_gc.timeline) if s[0] == "gc.collect()"]
    alloc = with_gc.timeline["allocated_bytes"]
    assert freed == pytest.approx((alloc.iloc[spans[0][1] - 1] - alloc.iloc[spans[0][2]]) / GIB, abs=0.005)
    assert freed == pytest.approx(sum(w.kept_staging_bytes for w in with_gc.weights) / GIB, abs=0.05)
    legend = next(t for t in texts if t.startswith("phases:"))
    assert all(word in legend for word in ("loading weights", "gc.collect()", "free memory read", "KV pool allocated"))


def test_fraction_slider_reruns(panel):
    panel.gc_toggle.value = True
    before = _waterfall_total(panel)
    panel.fraction.value = 0.8
    assert _waterfall_total(panel) < before
    panel.fraction.value = 0.9


def test_preset_change_loads_its_defaults(panel):
    panel.preset.value = "tiny-h100"
    assert panel.fraction.value == pytest.approx(0.88) and panel.prompt.value == 1000
    panel.preset.value = "llama-8b-l4"


def test_errors_show_in_the_panel():
    panel = KVPoolPanel("tiny-h100", device="sim:h300")  # unknown device preset
    text = "".join(o.get("text", "") for o in panel.errors.outputs)
    assert "unknown device preset 'h300'" in text


def test_plots_are_figures():
    result = kv_pool_sizing.run("tiny-h100")
    assert isinstance(plots.memory_timeline(result.timeline), go.Figure)
    fig = plots.budget_waterfall(result.budget_terms())
    assert isinstance(fig, go.Figure) and list(fig.data[0].measure)[-1] == "total"


def test_a_new_setting_shows_computing_until_it_is_drawn(panel):
    seen: list[str] = []
    panel.status.widget.observe(lambda change: seen.append(change["new"]), names="value")
    panel.gc_toggle.value = not panel.gc_toggle.value  # cached: only picks the other arm
    assert seen == []
    panel.fraction.value = 0.77
    assert len(seen) == 2 and "computing both start-ups of" in seen[0] and "0.77" in seen[0]
    assert seen[1] == "" == panel.status.widget.value


def test_timelines_label_what_the_story_needs_in_both_arms():
    """Notebook 01's timelines (the PR's preset): without gc the measure phase (three events) is labelled beside
    it with an arrow pointing at it, not over the KV-pool band, with the free memory read; the late collection
    while serving is labelled with what it frees and the memory then left idle (the arm's idle_bytes); with gc,
    the collection and the measure are labelled and nothing runs late."""
    no_gc, with_gc = kv_pool_sizing.compare("sglang-pr-4xh200")
    fig = plots.memory_timelines_side_by_side(no_gc.timeline, with_gc.timeline, ("without", "with"))
    by_arm = {xref: [a for a in fig.layout.annotations if a.xref == xref] for xref in ("x", "x2")}
    measure = next(a for a in by_arm["x"] if a.text.startswith("<b>measure</b>"))
    span = [s for s in plots.phase_spans(no_gc.timeline) if s[0] == "measure"][-1]
    assert span[2] - span[1] + 1 == 3  # three events wide: too narrow to carry its label
    assert measure.showarrow and measure.x == (span[1] + span[2]) / 2 and measure.ax < 0  # the arrow comes from the left
    assert f"{no_gc.to_json()['available_bytes'] / GIB:,.2f} GiB free" in measure.text and "pool sized here" in measure.text
    late = next(a for a in by_arm["x"] if "gc runs late" in a.text)
    start, stop, freed = plots.late_collection(no_gc.timeline)
    assert start > span[2] and f"frees {freed / GIB:,.2f} GiB" in late.text
    assert f"{no_gc.idle_bytes / GIB:,.2f} GiB left idle" in late.text
    gc_label = next(a for a in by_arm["x2"] if a.text.startswith("<b>gc.collect()</b>"))
    assert f"frees {freed / GIB:,.2f} GiB" in gc_label.text  # the same staging, freed before the reading
    assert plots.late_collection(with_gc.timeline) is None and not any("late" in a.text for a in by_arm["x2"])
    assert any(a.text.startswith("<b>measure</b>") and "pool sized here" in a.text for a in by_arm["x2"])
