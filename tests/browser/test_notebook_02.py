"""Notebook 02 in a real JupyterLab: toggle the eviction mode and see the CLI's hit rate plotted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Page

from . import lab
from .lab import LabServer

NOTEBOOK = "notebooks/02_shortfall_eviction.ipynb"
PANEL_WORKLOAD = ["--workload", "generated-shared-prefix", "--workload-param", "num_groups=16",
                  "--workload-param", "prompts_per_group=8", "--workload-param", "output_len=128",
                  "--kv-tokens", "20000"]


def _cli(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "kvlab.cli", "simulate", *PANEL_WORKLOAD, "--eviction", mode, "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.browser
@pytest.mark.slow
def test_mode_toggle_plots_the_cli_hit_rate(lab_page: Page, lab_server: LabServer, tmp_path: Path):
    fix, bug = _cli("shortfall"), _cli("full")
    lab.open_notebook(lab_page, lab_server, NOTEBOOK)
    lab.run_all(lab_page, timeout=600_000)
    lab.wait_for_output_text(lab_page, "destroyed only by full eviction")

    gauge = lab.wait_plotly(lab_page, ".kvlab-sim-gauge")
    assert gauge[0]["value"] == pytest.approx(100 * fix["hit_rate"], abs=1e-3)
    lab.screenshot(lab_page, tmp_path / "shortfall.png", ".kvlab-shortfall-panel")

    lab.select_dropdown(lab_page, "kvlab-eviction-mode", "full (bug)")
    after = lab.wait_plotly_change(lab_page, ".kvlab-sim-gauge", gauge)
    assert after[0]["value"] == pytest.approx(100 * bug["hit_rate"], abs=1e-3)
    lab.wait_widget_text(lab_page, "kvlab-sim-verdict", "full eviction")
    box = lab_page.locator(".kvlab-sim-verdict .kvlab-sim-verdict-box")
    assert int(box.get_attribute("data-over-evicted")) == bug["over_evicted_tokens"] > 0
    timelines = lab.plotly_data(lab_page, ".kvlab-sim-timelines")
    assert timelines[0]["y"][-1] == pytest.approx(fix["hit_rate"], abs=1e-4)
    assert timelines[3]["y"][-1] == pytest.approx(bug["hit_rate"], abs=1e-4)
    lab.screenshot(lab_page, tmp_path / "full.png", ".kvlab-shortfall-panel")
