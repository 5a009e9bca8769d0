"""Notebook 01 in a real JupyterLab: run it, flip gc-before-measure, and see the CLI's numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Page

from . import lab
from .lab import LabServer

NOTEBOOK = "notebooks/01_kv_pool_sizing.ipynb"
GIB = float(1 << 30)


def _cli(flag: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "kvlab.cli", "repro", "kv-pool-sizing", "--preset", "sglang-pr-4xh200", flag, "--json"],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)


def _verdict(page: Page) -> dict:
    box = page.locator(".kvlab-verdict .kvlab-verdict-box")
    return {"accepted": box.get_attribute("data-accepted"),
            "tokens": int(box.get_attribute("data-max-total-num-tokens")), "text": box.inner_text()}


@pytest.mark.browser
@pytest.mark.slow
def test_gc_toggle_changes_plot_and_table_to_cli_values(lab_page: Page, lab_server: LabServer, tmp_path: Path):
    with_gc, no_gc = _cli("--gc-before-measure"), _cli("--no-gc-before-measure")
    lab.open_notebook(lab_page, lab_server, NOTEBOOK)
    lab.run_all(lab_page, timeout=600_000)
    lab.wait_for_output_text(lab_page, "× larger")

    before = lab.wait_plotly(lab_page, ".kvlab-waterfall")
    assert sum(before[0]["y"]) == pytest.approx(with_gc["rest_bytes"] / GIB, abs=2e-3)
    verdict = _verdict(lab_page)
    assert verdict["accepted"] == "true" and verdict["tokens"] == with_gc["max_total_num_tokens"]
    lab.screenshot(lab_page, tmp_path / "with_gc.png", ".kvlab-kv-pool-panel")

    lab.check_widget(lab_page, "kvlab-gc-toggle", False)
    after = lab.wait_plotly_change(lab_page, ".kvlab-waterfall", before)
    assert sum(after[0]["y"]) == pytest.approx(no_gc["rest_bytes"] / GIB, abs=2e-3)
    lab.wait_widget_text(lab_page, "kvlab-verdict", "refused")
    verdict = _verdict(lab_page)
    assert verdict["accepted"] == "false" and verdict["tokens"] == no_gc["max_total_num_tokens"]
    assert no_gc["error"] in verdict["text"]
    table = lab.table_text(lab_page, "kvlab-table")
    assert f"{no_gc['max_total_num_tokens']:,}" in table and f"{with_gc['max_total_num_tokens']:,}" in table
    lab.screenshot(lab_page, tmp_path / "without_gc.png", ".kvlab-kv-pool-panel")

    timelines = lab.plotly_data(lab_page, ".kvlab-timelines")
    assert len(timelines) == 8 and sum(len(t["y"]) > 100 for t in timelines) == 6
