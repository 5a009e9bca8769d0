"""Notebook 07 (the host tier) on every surface: JupyterLab (run, step the two-tier tree widget, switch the write
policy, Save, reload), Voila (``kvlab app 07``) and the static report page (``kvlab report --notebooks 07``). On each,
the tree widget draws the seeded demo's tree node for node, coloured by residency, with the summary's host numbers
equal to what is drawn, the write-policy bars draw the numbers of the table above them, and the scheduler's figures
(hit rate against host size, finding 2's regime map) draw the tables' numbers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page

from kvlab.experiments import host_tier, host_tier_sweep
from kvlab.experiments import multiturn_tiers as mt
from kvlab.mem_cache.tree_view import tree_frame
from kvlab.viz.plots import RESIDENCY_COLOURS, TREE_COLOURS

from . import lab
from .lab import LabServer
from .test_notebook_01 import _save
from .test_report_pages import (
    _INSPECT,
    figure_problems,
    figures_in_notebook,
    offline,  # noqa: F401  (the context that lets only file: requests through)
    open_offline,
)
from .test_voila import voila  # noqa: F401  (the fixture that serves `kvlab app`)

NOTEBOOK = "notebooks/07_host_tier.ipynb"
START_REQUESTS = 30  # the notebook's HostTierPanel(start_requests=30, seed=0)
TREE = ".kvlab-host-tier-panel .kvlab-tree-fig"
POLICY_TITLE = "Write policies on the same requests"
CURVE_TITLE = "Hit rate against host pool size"
REGIME_TITLE = "Hit rate lost to full eviction (the bug) with a host tier, in points"

TIERS_TITLE = "Where each round's hits came from"  # section 7's static figure
TIER_BARS = ".kvlab-multiturn-panel .kvlab-tier-bars"

_FIGURE_BY_TITLE = """(title) => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')].find(
      g => g._fullLayout && g._fullLayout.title && g._fullLayout.title.text === title);
  return gd ? gd.data.map(t => ({name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || []),
                                 z: Array.from(t.z || []).map(r => Array.from(r)), xaxis: t.xaxis || 'x'})) : null;
}"""


@pytest.fixture(scope="module")
def runs():
    """Section 2's numbers: the write policies on the shipped trace (the notebook's table and bars show these)."""
    sweep = host_tier_sweep
    return sweep.policy_numbers(sweep.host_sweep(kv_pages=[sweep.CURVE_POOL_PAGES],
                                                 host_ratios=sweep.POLICY_HOST_RATIOS, policies=sweep.POLICIES))


@pytest.fixture(scope="module")
def sims() -> tuple:
    """Sections 3 and 4's scheduler runs, computed here as the oracle (the notebook's tables show these numbers)."""
    sweep = host_tier_sweep
    sizes = sweep.host_sweep(kv_pages=[sweep.CURVE_POOL_PAGES], host_ratios=sweep.CURVE_HOST_RATIOS,
                             policies=sweep.POLICIES)
    regimes = sweep.host_sweep(kv_pages=sweep.REGIME_POOL_PAGES, host_ratios=(0.0, *sweep.REGIME_HOST_RATIOS),
                               policies=sweep.POLICIES)
    return sweep.curve_table(sizes), sweep.finding2_frame(regimes)


def oracle_demo(steps: list[str], policy: str = "write_through") -> host_tier.HostTierDemo:
    """The panel's demo: the notebook's first requests, then ``steps``, all under ``policy`` (switching the policy
    replays the same steps under it)."""
    demo = host_tier.HostTierDemo(seed=0, write_policy=policy)
    for _ in range(START_REQUESTS):
        demo.next_request()
    for step in steps:
        getattr(demo, step)()
    return demo


def check_tree(page: Page, demo: host_tier.HostTierDemo) -> list[dict]:
    """The icicle is ``demo``'s tree node for node (ids, widths), each node coloured by its residency, and the summary
    line's host numbers are the tree's."""
    drawn = lab.wait_plotly(page, TREE, timeout=120_000)
    frame = tree_frame(demo.cache, names=demo.names)
    icicle = drawn[0]
    assert icicle["type"] == "icicle"
    assert (icicle["ids"], icicle["values"]) == ([str(i) for i in frame["id"]], [int(v) for v in frame["path_tokens"]])
    colours = [RESIDENCY_COLOURS.get(r, TREE_COLOURS["root"]) for r in frame["residency"]]
    assert icicle["marker"]["colors"] == colours
    # the SVG is drawn, not just the data (after a redraw plotly animates the slices in: wait for them)
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n",
                           arg=[f"{TREE} g.slice", min(5, len(frame))], timeout=30_000)
    host_only = sum(int(t) for t, r in zip(frame["tokens"], frame["residency"]) if r == "host")
    summary = page.locator(".kvlab-host-tier-panel .kvlab-tree-sizes")
    assert summary.get_attribute("data-host-only") == str(host_only)
    assert summary.get_attribute("data-host") == str(demo.cache.host_size())
    return drawn


def check_policy_bars(page: Page, runs) -> None:
    """The bars are the runs' numbers (hit rate, GiB written), and the table above them shows the same numbers."""
    page.wait_for_function(f"(t) => ({_FIGURE_BY_TITLE})(t) !== null", arg=POLICY_TITLE, timeout=300_000)
    traces = page.evaluate(_FIGURE_BY_TITLE, POLICY_TITLE)
    for ratio in host_tier_sweep.POLICY_HOST_RATIOS:
        at = runs[runs["host_ratio"] == ratio]
        name = f"host ratio {ratio:g}"
        rates = next(t["x"] for t in traces if t["xaxis"] == "x" and t["name"] == name)
        written = next(t["x"] for t in traces if t["xaxis"] == "x2" and t["name"] == name)
        assert rates == pytest.approx(at["hit_rate"].tolist()) and written == pytest.approx(at["written_gib"].tolist())
    text = page.locator("body").inner_text()
    for r in runs.itertuples():  # the table above the bars
        assert f"{r.hit_rate:.2%}" in text and f"{r.written_gib:,.2f}" in text


def _figure(page: Page, title: str) -> list[dict]:
    page.wait_for_function(f"(t) => ({_FIGURE_BY_TITLE})(t) !== null", arg=title, timeout=300_000)
    return page.evaluate(_FIGURE_BY_TITLE, title)


def check_simulator_figures(page: Page, sims: tuple) -> None:
    """The hit-rate curve draws the curve table's hit rates; the regime map's cells are finding 2's points lost, and
    the table under it shows them."""
    curve, finding2 = sims
    lines = {t["name"]: t for t in _figure(page, CURVE_TITLE)}
    for policy in host_tier_sweep.POLICIES:  # one curve per write policy
        assert lines[policy]["y"] == pytest.approx(curve[f"hit rate, {policy}"].round(6).tolist(), abs=1e-9)
        assert lines[policy]["x"] == pytest.approx(curve["host pool (GiB)"].tolist(), abs=1e-3), policy
    drawn = sorted(v for t in _figure(page, REGIME_TITLE) for row in t["z"] for v in row if v is not None)
    assert drawn == pytest.approx(sorted(finding2["gap_points"].tolist()), abs=1e-9)
    text = page.locator("body").inner_text()
    for r in finding2.itertuples():
        assert f"{r.hit_rate_shortfall:.2%}" in text


@pytest.fixture(scope="module")
def tier_cli() -> dict:
    """Section 7's oracle: ``kvlab simulate --workload multiturn ... --json``'s per-round rates, per setting."""
    out = {}
    for setting in (mt.DEFAULT, mt.TierSetting(2.0, "wait_complete")):
        proc = subprocess.run([sys.executable, "-m", "kvlab.cli", "simulate", *setting.cli_args(), "--json"],
                              capture_output=True, text=True, check=True, timeout=300)
        out[setting] = [row["cache_hit_rate"] for row in json.loads(proc.stdout)["rounds"]]
    return out


def _stacked(traces: list[dict]) -> list[float]:
    bars = [t for t in traces if t.get("type", "bar") == "bar" and "hits" in (t.get("name") or "")]
    return [sum(t["y"][i] for t in bars) for i in range(len(bars[0]["y"]))]


def check_tiers(page: Page, tier_cli: dict) -> None:
    """Section 7: the stacked tier bars (static and the live panel's) add up to the CLI's per-round hit rates, and
    the panel's per-round table shows the same rates."""
    rates = tier_cli[mt.DEFAULT]
    assert _stacked(_figure(page, TIERS_TITLE)) == pytest.approx(rates, abs=1e-6)
    assert _stacked(lab.wait_plotly(page, TIER_BARS, timeout=300_000)) == pytest.approx(rates, abs=1e-6)
    table = lab.table_text(page, "kvlab-rounds-table-box")
    assert all(f"{rate:.6f}" in table for rate in rates)
    assert "below the no-eviction ideal from round" in lab.table_text(page, "kvlab-dropoff")


def switch_prefetch(page: Page, tier_cli: dict) -> None:
    """wait_complete: the panel redraws on the no-eviction ideal, the CLI's numbers for that setting."""
    before = lab.plotly_data(page, TIER_BARS)
    page.locator(".kvlab-prefetch-policy button", has_text="wait_complete").click()
    drawn = lab.wait_plotly_change(page, TIER_BARS, before, timeout=120_000)
    assert _stacked(drawn) == pytest.approx(tier_cli[mt.TierSetting(2.0, "wait_complete")], abs=1e-6)
    lab.wait_widget_text(page, "kvlab-dropoff", "every round on the no-eviction ideal")


@pytest.mark.browser
@pytest.mark.slow
def test_lab_07_tree_and_bars_before_and_after_a_reload(lab_page: Page, lab_server: LabServer, artifacts: Path,
                                                        runs, sims, tier_cli):
    work = artifacts / "07_host_tier.ipynb"  # a copy: saving writes outputs into the file
    shutil.copy(lab_server.root_dir / NOTEBOOK, work)
    relpath = work.relative_to(lab_server.root_dir).as_posix()
    lab.open_notebook(lab_page, lab_server, relpath)
    lab.run_all(lab_page, timeout=600_000)
    lab.wait_for_output_text(lab_page, "NOT YET")  # the exercise's starter fails its check, as it should
    before = check_tree(lab_page, oracle_demo([]))
    check_policy_bars(lab_page, runs)
    check_simulator_figures(lab_page, sims)
    lab.wait_widget_text(lab_page, "kvlab-tree-log", f"{START_REQUESTS} of 40 requests run")
    lab.screenshot(lab_page, artifacts / "lab07_tree.png", ".kvlab-host-tier-panel")
    check_tiers(lab_page, tier_cli)
    lab.screenshot(lab_page, artifacts / "lab07_tiers.png", ".kvlab-multiturn-panel")
    switch_prefetch(lab_page, tier_cli)
    lab.screenshot(lab_page, artifacts / "lab07_tiers_wait_complete.png", ".kvlab-multiturn-panel")

    lab.click_widget(lab_page, "kvlab-tree-pressure")
    pressured = lab.wait_plotly_change(lab_page, TREE, before)
    demo = oracle_demo(["pressure_event"])
    check_tree(lab_page, demo)
    step = demo.history[-1]
    lab.wait_widget_text(lab_page, "kvlab-tree-log", f"{step.evict.demoted_tokens:,} demoted to host")

    lab.select_dropdown(lab_page, "kvlab-tree-write-policy", "write_back")  # the same steps, replayed under it
    lab.wait_plotly_change(lab_page, TREE, pressured)
    replayed = oracle_demo(["pressure_event"], policy="write_back")
    check_tree(lab_page, replayed)
    lab.wait_widget_text(lab_page, "kvlab-tree-log",
                         f"{replayed.history[-1].evict.written_back_tokens:,} of them written to host first")
    lab.click_widget(lab_page, "kvlab-tree-next")
    lab.wait_widget_text(lab_page, "kvlab-tree-log", f"{START_REQUESTS + 1} of 40 requests run")
    check_tree(lab_page, oracle_demo(["pressure_event", "next_request"], policy="write_back"))

    _save(lab_page, work)
    lab_page.reload(wait_until="domcontentloaded")
    lab.wait_kernel_idle(lab_page, relpath)
    check_tree(lab_page, oracle_demo(["pressure_event", "next_request"], policy="write_back"))  # live widgets
    lab_page.locator(".kvlab-multiturn-panel").scroll_into_view_if_needed()
    wait_complete = tier_cli[mt.TierSetting(2.0, "wait_complete")]  # the panel as saved: switched
    assert _stacked(lab.wait_plotly(lab_page, TIER_BARS, timeout=120_000)) == pytest.approx(wait_complete, abs=1e-6)
    # (the static figures far above are not in the page after a reload: JupyterLab renders only the cells in view;
    # they were checked before it, and the report test checks them as saved)
    lab.screenshot(lab_page, artifacts / "lab07_reloaded.png", ".kvlab-host-tier-panel")


@pytest.mark.browser
@pytest.mark.slow
def test_voila_07_draws_the_tree_and_the_bars(voila, context: BrowserContext, artifacts: Path, runs,  # noqa: F811
                                              sims, tier_cli):
    page: Page = context.new_page()
    page.goto(voila("07"), wait_until="commit")
    page.locator(".kvlab-host-tier-panel").wait_for(state="attached", timeout=300_000)
    assert page.locator(".jp-CodeCell .jp-InputArea, .cm-editor").count() == 0  # code hidden
    tree = check_tree(page, oracle_demo([]))
    lab.screenshot(page, artifacts / "voila07_tree.png", ".kvlab-host-tier-panel")
    lab.click_widget(page, "kvlab-tree-pressure")
    lab.wait_plotly_change(page, TREE, tree, timeout=60_000)
    check_tree(page, oracle_demo(["pressure_event"]))
    # Voila runs the dashboard cell first, then the rest in order: the scheduler sections take minutes on 2 cores
    page.locator(".kvlab-check").first.wait_for(state="attached", timeout=900_000)
    check_policy_bars(page, runs)
    check_simulator_figures(page, sims)
    page.locator(".kvlab-multiturn-panel").wait_for(state="attached", timeout=300_000)
    check_tiers(page, tier_cli)
    switch_prefetch(page, tier_cli)
    lab.screenshot(page, artifacts / "voila07_tiers.png", ".kvlab-multiturn-panel")
    page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_report_07_page_draws_the_tree_and_the_tables_numbers(offline: BrowserContext, tmp_path: Path,  # noqa: F811
                                                              artifacts: Path, runs, sims, tier_cli):
    out = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "kvlab.cli", "report", "--out", str(out), "--notebooks", "07",
                           "--device", "sim:h200", "--no-png"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "KVLAB_PROGRESS": "0"})
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    opened = open_offline(offline, out / "html" / "07_host_tier.html")
    page = opened.page
    figures = page.evaluate(_INSPECT)
    assert len(figures) == figures_in_notebook(out / "notebooks" / "07_host_tier.ipynb") >= 3
    assert not figure_problems("07", figures), figures
    check_tree(page, oracle_demo([]))  # the saved widget state: the panel as the notebook left it
    check_policy_bars(page, runs)
    check_simulator_figures(page, sims)
    check_tiers(page, tier_cli)  # the panel's saved state: the default setting
    assert opened.page_errors == [] and opened.off_machine == []
    lab.screenshot(page, artifacts / "report07.png")
    page.close()
