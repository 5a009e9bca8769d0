"""Notebook 01 in a real JupyterLab: run it, flip gc-before-measure, and see the CLI's numbers; and the same
panel after Save and a page reload (kernel still running), where every view attaches to widgets that already
exist."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page

from . import lab
from .lab import LabServer
from .panels import check_kv_pool_panel, drawn_lines, pool_cli

NOTEBOOK = "notebooks/01_kv_pool_sizing.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _verdict(page: Page) -> dict:
    box = page.locator(".kvlab-verdict .kvlab-verdict-box")
    return {"accepted": box.get_attribute("data-accepted"),
            "tokens": int(box.get_attribute("data-max-total-num-tokens")), "text": box.inner_text()}


def _check_timelines(page: Page) -> list[dict]:
    lines = drawn_lines(page, ".kvlab-timelines")
    assert len(lines) == 8 and sum(len(t["y"]) > 100 for t in lines) == 6  # 3 series + weights line, per arm
    return lines


@pytest.mark.browser
@pytest.mark.slow
def test_gc_toggle_changes_plot_and_table_to_cli_values(lab_page: Page, lab_server: LabServer, artifacts: Path):
    with_gc, no_gc = pool_cli(True), pool_cli(False)
    lab.open_notebook(lab_page, lab_server, NOTEBOOK)
    lab.run_all(lab_page, timeout=600_000)
    lab.wait_for_output_text(lab_page, "× larger")

    before = check_kv_pool_panel(lab_page, "gc", with_gc)
    verdict = _verdict(lab_page)
    assert verdict["accepted"] == "true" and verdict["tokens"] == with_gc["max_total_num_tokens"]
    lab.screenshot(lab_page, artifacts / "lab01_with_gc.png", ".kvlab-kv-pool-panel")

    lab.check_widget(lab_page, "kvlab-gc-toggle", False)
    lab.wait_plotly_change(lab_page, ".kvlab-waterfall", [before])
    lab.wait_widget_text(lab_page, "kvlab-verdict", "refused")
    check_kv_pool_panel(lab_page, "no-gc", no_gc)
    verdict = _verdict(lab_page)
    assert verdict["accepted"] == "false" and verdict["tokens"] == no_gc["max_total_num_tokens"]
    assert no_gc["error"] in verdict["text"]
    table = lab.table_text(lab_page, "kvlab-table")
    assert f"{no_gc['max_total_num_tokens']:,}" in table and f"{with_gc['max_total_num_tokens']:,}" in table
    lab.screenshot(lab_page, artifacts / "lab01_without_gc.png", ".kvlab-kv-pool-panel")
    _check_timelines(lab_page)


def _save(page: Page, notebook: Path, timeout: float = 60.0) -> None:
    """File > Save, then wait until the file on disk holds the panel's widget output."""
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    deadline = time.monotonic() + timeout
    while WIDGET_VIEW not in notebook.read_text(encoding="utf-8"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{notebook} was not saved with its widget outputs in {timeout} s")
        time.sleep(0.2)


def _fully_visible(page: Page, selector: str) -> None:
    """``selector`` lies inside the notebook's area, not cut off by it (the table beside the waterfall)."""
    box = page.locator(selector).bounding_box()
    area = page.locator(".jp-NotebookPanel-notebook").bounding_box()
    assert box and area and box["width"] > 0 and box["x"] + box["width"] <= area["x"] + area["width"] + 1, (box, area)


@pytest.mark.browser
@pytest.mark.slow
def test_panel_draws_after_save_and_reload(lab_page: Page, lab_server: LabServer, artifacts: Path):
    """The tester's JupyterLab case: Save, reload the page; the kernel keeps running and JupyterLab restores
    the panel's widgets from it. Every figure must draw the panel's current data and the toggle still work."""
    with_gc, no_gc = pool_cli(True), pool_cli(False)
    work = artifacts / "01_kv_pool_sizing.ipynb"  # a copy: saving writes outputs into the file
    shutil.copy(lab_server.root_dir / NOTEBOOK, work)
    relpath = work.relative_to(lab_server.root_dir).as_posix()
    lab.open_notebook(lab_page, lab_server, relpath)
    lab.run_all(lab_page, timeout=600_000)
    lab.wait_for_output_text(lab_page, "× larger")
    check_kv_pool_panel(lab_page, "gc", with_gc)
    _save(lab_page, work)
    (kernel,) = [s["kernel"]["id"] for s in lab_server.sessions(relpath)]

    lab_page.reload(wait_until="domcontentloaded")
    lab.wait_kernel_idle(lab_page, relpath)
    assert [s["kernel"]["id"] for s in lab_server.sessions(relpath)] == [kernel]  # the same, still running
    lines = _check_timelines(lab_page)
    before = check_kv_pool_panel(lab_page, "gc", with_gc)
    lab.wait_widget_text(lab_page, "kvlab-verdict", "accepted")
    _fully_visible(lab_page, ".kvlab-table table")
    lab.screenshot(lab_page, artifacts / "lab01_reloaded_with_gc.png", ".kvlab-kv-pool-panel")

    lab.check_widget(lab_page, "kvlab-gc-toggle", False)
    lab.wait_plotly_change(lab_page, ".kvlab-waterfall", [before])
    lab.wait_widget_text(lab_page, "kvlab-verdict", "refused")
    check_kv_pool_panel(lab_page, "no-gc", no_gc)
    assert _check_timelines(lab_page) == lines
    lab.screenshot(lab_page, artifacts / "lab01_reloaded_without_gc.png", ".kvlab-kv-pool-panel")
