"""Notebook 06 (capacity planning) on every surface: JupyterLab (run, pick another max running, Save, reload),
Voila (``kvlab app 06``) and the static report page (``kvlab report --notebooks 06``). On each, the regime map draws
the numbers of the loss table under it, the curve those of the hit-rate table, and a cell of the map is the
difference of two ``kvlab simulate --json`` runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page

from kvlab.experiments.pool_sweep import EXAMPLE_TRACE, default_pool_pages
from kvlab.workloads.mooncake import load_trace

from . import lab
from .lab import LabServer
from .test_notebook_01 import _save
from .test_report_pages import (
    _INSPECT,
    figure_problems,
    offline,  # noqa: F401  (the context that lets only file: requests through)
    open_offline,
)
from .test_voila import voila  # noqa: F401  (the fixture that serves `kvlab app`)

NOTEBOOK = "notebooks/06_capacity_planning.ipynb"
RUNNING = (4, 16, 256)  # the notebook's MAX_RUNNING
COST_LINE = "points/minute"  # the cost line printed once the sweep is done


def _cli_loss(pages: int, running: int) -> float:
    """Hit-rate points lost to full eviction at one cell, from two ``kvlab simulate --json`` runs."""
    rates = {}
    for mode in ("shortfall", "full"):
        out = subprocess.run([sys.executable, "-m", "kvlab.cli", "simulate", "--trace", str(EXAMPLE_TRACE),
                              "--kv-pages", str(pages), "--max-running", str(running), "--eviction", mode, "--json"],
                             capture_output=True, text=True, check=True).stdout
        rates[mode] = json.loads(out)["hit_rate"]
    return round(100 * (rates["shortfall"] - rates["full"]), 4)


@pytest.fixture(scope="module")
def pools() -> list[int]:
    return default_pool_pages(load_trace(EXAMPLE_TRACE), 512, 6)


@pytest.fixture(scope="module")
def cli_cell(pools) -> tuple[int, int, float]:
    """The smallest pool at max running 4: where the bug costs on the shipped trace."""
    return pools[0], 4, _cli_loss(pools[0], 4)


def _cells(page: Page, css_class: str) -> list[dict]:
    cells = lab.table_cells(page, css_class)
    assert cells, f"no table cells in .{css_class}"
    return cells


def check_capacity_panel(page: Page, running: int, pools: list[int], cli_cell: tuple[int, int, float]) -> None:
    """The map's z is the loss table, cell by cell; the curve's hit-rate lines are the hit table at ``running``."""
    heat = lab.wait_plotly(page, ".kvlab-capacity-map", timeout=120_000)[0]
    assert heat["type"] == "heatmap"
    assert heat["x"] == [f"{p:,}" for p in pools] and heat["y"] == [str(r) for r in RUNNING]
    table = {(int(c["running"]), int(c["pages"])): float(c["value"]) for c in _cells(page, "kvlab-capacity-loss")}
    assert len(table) == len(pools) * len(RUNNING)
    for i, r in enumerate(RUNNING):
        for j, p in enumerate(pools):
            assert heat["z"][i][j] == pytest.approx(table[(r, p)], abs=1e-9), (r, p)
    pages, at, loss = cli_cell
    assert table[(at, pages)] == pytest.approx(loss, abs=1e-3) and loss > 0  # the bug costs there
    assert page.locator(".kvlab-capacity-map .hm image").count() >= 1  # the heatmap is painted, not just data

    curve = lab.wait_plotly(page, ".kvlab-capacity-curve", timeout=120_000)
    assert f"max running {running}" in lab.plotly_title(page, ".kvlab-capacity-curve")
    hits = {(int(c["pages"]), c["mode"]): float(c["value"]) for c in _cells(page, "kvlab-capacity-hits")}
    lines = {t["legendgroup"]: t for t in curve if t.get("yaxis", "y") == "y" and t.get("legendgroup")}
    assert set(lines) == {"shortfall", "full"}
    for mode, line in lines.items():
        assert line["x"] == pools
        assert line["y"] == pytest.approx([hits[(p, mode)] for p in pools], abs=1e-9), mode


@pytest.mark.browser
@pytest.mark.slow
def test_lab_06_draws_the_tables_numbers_before_and_after_a_reload(lab_page: Page, lab_server: LabServer,
                                                                    artifacts: Path, pools, cli_cell):
    work = artifacts / "06_capacity_planning.ipynb"  # a copy: saving writes outputs into the file
    shutil.copy(lab_server.root_dir / NOTEBOOK, work)
    relpath = work.relative_to(lab_server.root_dir).as_posix()
    lab.open_notebook(lab_page, lab_server, relpath)
    lab.run_all(lab_page, timeout=600_000)
    cost = lab.wait_for_output_text(lab_page, COST_LINE)
    assert f"{2 * len(pools) * len(RUNNING)} points" in cost
    check_capacity_panel(lab_page, 256, pools, cli_cell)
    lab.screenshot(lab_page, artifacts / "lab06_panel.png", ".kvlab-capacity-panel")

    before = lab.plotly_data(lab_page, ".kvlab-capacity-curve")
    lab.select_dropdown(lab_page, "kvlab-capacity-running", "4")
    lab.wait_plotly_change(lab_page, ".kvlab-capacity-curve", before)
    lab.wait_widget_text(lab_page, "kvlab-capacity-hits", "max running 4")
    check_capacity_panel(lab_page, 4, pools, cli_cell)

    _save(lab_page, work)
    lab_page.reload(wait_until="domcontentloaded")
    lab.wait_kernel_idle(lab_page, relpath)
    check_capacity_panel(lab_page, 4, pools, cli_cell)  # the views attach to the running kernel's widgets
    lab.screenshot(lab_page, artifacts / "lab06_reloaded.png", ".kvlab-capacity-panel")


@pytest.mark.browser
@pytest.mark.slow
def test_voila_06_draws_the_tables_numbers(voila, context: BrowserContext, artifacts: Path, pools,  # noqa: F811
                                           cli_cell):
    page: Page = context.new_page()
    page.goto(voila("06"), wait_until="commit")
    page.locator(".kvlab-capacity-panel").wait_for(state="attached", timeout=300_000)
    assert page.locator(".jp-CodeCell .jp-InputArea, .cm-editor").count() == 0  # code hidden
    check_capacity_panel(page, 256, pools, cli_cell)
    assert COST_LINE in page.locator("body").inner_text()
    lab.screenshot(page, artifacts / "voila06_panel.png", ".kvlab-capacity-panel")
    page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_report_06_page_draws_the_tables_numbers(offline: BrowserContext, tmp_path: Path, artifacts: Path,  # noqa: F811
                                                 pools, cli_cell):
    out = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "kvlab.cli", "report", "--out", str(out), "--notebooks", "06",
                           "--device", "sim:h200", "--no-png"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "KVLAB_PROGRESS": "0"})
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    opened = open_offline(offline, out / "html" / "06_capacity_planning.html")
    page = opened.page
    figures = page.evaluate(_INSPECT)
    # the curve, the colour map, and section 5's hit rate against pool size with a host tier
    assert len(figures) == 3 and not figure_problems("06", figures), figures
    assert any("with a host tier" in f["title"] for f in figures), figures
    check_capacity_panel(page, 256, pools, cli_cell)
    assert opened.page_errors == [] and opened.off_machine == []
    lab.screenshot(page, artifacts / "report06.png")
    page.close()
