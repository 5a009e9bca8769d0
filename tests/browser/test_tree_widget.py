"""Notebook 02's radix tree widget in a real JupyterLab: the icicle draws the demo's tree and redraws it,
node for node, after "next request" and "pressure event"."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from kvlab.experiments.tree_demo import TreeDemo
from kvlab.mem_cache.tree_view import tree_frame

from . import lab
from .lab import LabServer

NOTEBOOK = "notebooks/02_shortfall_eviction.ipynb"
START_REQUESTS = 6  # the notebook's TreeDemoPanel(start_requests=6, seed=0)


def _expected(demo: TreeDemo) -> tuple[list[str], list[int]]:
    frame = tree_frame(demo.cache, names=demo.names)
    return [str(i) for i in frame["id"]], [int(v) for v in frame["path_tokens"]]


def _drawn_slices(page: Page) -> int:
    return page.locator(".kvlab-tree-fig g.slice").count()


@pytest.mark.browser
@pytest.mark.slow
def test_tree_icicle_redraws_after_next_request_and_pressure(lab_page: Page, lab_server: LabServer, tmp_path: Path):
    demo = TreeDemo(seed=0)  # the same seeded demo, run here as the oracle
    for _ in range(START_REQUESTS):
        demo.next_request()

    lab.open_notebook(lab_page, lab_server, NOTEBOOK)
    lab.run_all(lab_page, timeout=600_000)
    before = lab.wait_plotly(lab_page, ".kvlab-tree-fig")
    assert before[0]["type"] == "icicle"
    assert (before[0]["ids"], before[0]["values"]) == _expected(demo)
    assert _drawn_slices(lab_page) >= 5  # the SVG is drawn, not just the data
    lab.wait_widget_text(lab_page, "kvlab-tree-log", f"{START_REQUESTS} of 40 requests run")
    lab.screenshot(lab_page, tmp_path / "tree-before.png", ".kvlab-tree-demo-panel")

    lab.click_widget(lab_page, "kvlab-tree-next")
    after = lab.wait_plotly_change(lab_page, ".kvlab-tree-fig", before)
    demo.next_request()
    assert (after[0]["ids"], after[0]["values"]) == _expected(demo)
    assert after[0]["values"][0] > before[0]["values"][0]  # one more cached sequence
    lab.wait_widget_text(lab_page, "kvlab-tree-log", f"{START_REQUESTS + 1} of 40 requests run")

    lab.select_dropdown(lab_page, "kvlab-tree-mode", "full (the bug)")
    lab.click_widget(lab_page, "kvlab-tree-pressure")
    pressured = lab.wait_plotly_change(lab_page, ".kvlab-tree-fig", after)
    demo.mode = "full"
    step = demo.pressure_event()
    ids, values = _expected(demo)
    # drawn at the pre-event width: the root keeps its total, a pale "__gone__" block is what was evicted
    gone = after[0]["values"][0] - values[0]
    assert (pressured[0]["ids"], pressured[0]["values"]) == (ids + ["__gone__"], [after[0]["values"][0]]
                                                              + values[1:] + [gone])
    assert len(ids) < len(after[0]["ids"]) and step.evict.over_evicted_tokens > 0 and gone > 0
    lab.wait_widget_text(lab_page, "kvlab-tree-log", f"evicted {step.evict.evicted_tokens:,}")
    lab.screenshot(lab_page, tmp_path / "tree-after.png", ".kvlab-tree-demo-panel")
