"""The harness itself works: tests/fixtures/smoke.ipynb in real JupyterLab, and headless through nbrun.

The notebook shows a ToggleButton (``kvlab-smoke-toggle``) and a FigureWidget (inside ``kvlab-smoke-fig``)
whose trace goes from y = scale * [1, 2, 3] to scale * [3, 2, 1] when the toggle is pressed, and an
IntSlider ``factor`` plus a Dropdown ``mode`` that drive an HTML table: mode of factor * scale * [1, 2, 3].
"""

from __future__ import annotations

from pathlib import Path

import pytest
from notebooks.nbrun import execute_notebook, find_output
from playwright.sync_api import Page

from . import lab
from .lab import LabServer

SMOKE = "tests/fixtures/smoke.ipynb"  # relative to the Lab root (the repo)
FIG = ".kvlab-smoke-fig"


@pytest.mark.browser
def test_toggle_updates_figure_widget(lab_page: Page, lab_server: LabServer, tmp_path: Path) -> None:
    """Run all, flip the toggle, and see the plot's y values change to the expected ones."""
    lab.open_notebook(lab_page, lab_server, SMOKE)
    lab.run_all(lab_page)
    assert "kvlab-smoke-ready scale=1" in lab.wait_for_output_text(lab_page, "kvlab-smoke-ready")

    before = lab.wait_plotly(lab_page, FIG)
    assert [(t["name"], t["x"], t["y"]) for t in before] == [("smoke", [0, 1, 2], [1, 2, 3])]
    lab.screenshot(lab_page, tmp_path / "before.png", FIG)

    lab.check_widget(lab_page, "kvlab-smoke-toggle", True)
    after = lab.wait_plotly_change(lab_page, FIG, before)
    assert [(t["x"], t["y"]) for t in after] == [([0, 1, 2], [3, 2, 1])]
    lab.screenshot(lab_page, tmp_path / "after.png", FIG)

    lab.click_widget(lab_page, "kvlab-smoke-toggle")  # and back
    assert lab.wait_plotly_change(lab_page, FIG, after)[0]["y"] == [1, 2, 3]

    assert lab.table_rows(lab_page, "kvlab-smoke-table") == [["mode", "value"], ["sum", "6"]]
    assert lab.set_slider(lab_page, "kvlab-smoke-slider", 4) == "4"
    lab.wait_widget_text(lab_page, "kvlab-smoke-table", "24")
    lab.select_dropdown(lab_page, "kvlab-smoke-mode", "max")
    lab.wait_widget_text(lab_page, "kvlab-smoke-table", "max")
    assert lab.table_rows(lab_page, "kvlab-smoke-table") == [["mode", "value"], ["max", "12"]]
    lab.screenshot(lab_page, tmp_path / "page.png")
    assert len(lab_server.sessions(SMOKE)) == 1


@pytest.mark.slow
def test_smoke_notebook_headless(repo_root: Path) -> None:
    """nbrun injects env and parameters, executes, and keeps the widget state."""
    nb = execute_notebook(repo_root / SMOKE, timeout=120, parameters={"scale": 2}, env={"KVLAB_DEVICE": "cpu"})
    find_output(nb, "kvlab-smoke-ready scale=2 device=cpu")
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    classes = {c for model in state.values() for c in model["state"].get("_dom_classes", [])}
    assert {"kvlab-smoke-toggle", "kvlab-smoke-fig"} <= classes
