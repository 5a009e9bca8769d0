"""Notebook 02 in a real JupyterLab: toggle the eviction mode and see the CLI's hit rate plotted, in the big
number, the bars and the timelines, each equal to the table beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from . import lab
from .lab import LabServer
from .panels import check_shortfall_panel, sim_cli

NOTEBOOK = "notebooks/02_shortfall_eviction.ipynb"


@pytest.mark.browser
@pytest.mark.slow
def test_mode_toggle_plots_the_cli_hit_rate(lab_page: Page, lab_server: LabServer, artifacts: Path):
    fix, bug = sim_cli("shortfall"), sim_cli("full")
    lab.open_notebook(lab_page, lab_server, NOTEBOOK)
    lab.run_all(lab_page, timeout=600_000)
    lab.wait_for_output_text(lab_page, "destroyed only by full eviction")

    gauge = lab.wait_plotly(lab_page, ".kvlab-sim-gauge")
    check_shortfall_panel(lab_page, "shortfall", fix, bug)
    lab.screenshot(lab_page, artifacts / "lab02_shortfall.png", ".kvlab-shortfall-panel")

    lab.select_dropdown(lab_page, "kvlab-eviction-mode", "full (the bug)")
    lab.wait_plotly_change(lab_page, ".kvlab-sim-gauge", gauge)
    lab.wait_widget_text(lab_page, "kvlab-sim-verdict", "your server: full (the bug)")
    check_shortfall_panel(lab_page, "full", fix, bug)
    assert bug["over_evicted_tokens"] > 0
    lab.screenshot(lab_page, artifacts / "lab02_full.png", ".kvlab-shortfall-panel")
