"""The teaching notebooks (00 allocator tour, 03 hybrid caches, 04 bring your own, 07 host tier) run top to bottom in a real
JupyterLab: every code cell executes, none shows a traceback, their plotly figures render in the page, and
lab-step checks render as ``.kvlab-check`` boxes."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from . import lab
from .lab import LabServer

ROOT = Path(__file__).resolve().parents[2]
PLOTS = ".jp-OutputArea-output.js-plotly-plot, .jp-OutputArea-output .js-plotly-plot"
TEACHING = ["00_caching_allocator_tour", "03_hybrid_caches", "04_bring_your_own", "07_host_tier"]

# The cells that ran (an execution count in their prompt) and the code cells there are.
_CELL_COUNTS = """() => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
  const ran = cells.filter(c => /\\[\\d+\\]/.test(c.querySelector('.jp-InputPrompt')?.textContent || ''));
  return [ran.length, cells.length];
}"""


def _params() -> list:
    return [pytest.param(stem, id=stem[:2], marks=pytest.mark.skipif(
        not (ROOT / "notebooks" / f"{stem}.ipynb").exists(), reason=f"notebooks/{stem}.ipynb not written yet"))
        for stem in TEACHING]


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("stem", _params())
def test_runs_top_to_bottom_in_jupyterlab(stem: str, lab_page: Page, lab_server: LabServer):
    lab.open_notebook(lab_page, lab_server, f"notebooks/{stem}.ipynb")
    lab.run_all(lab_page, timeout=600_000)  # raises, with the page's tracebacks, if a cell failed
    ran, total = lab_page.evaluate(_CELL_COUNTS)
    assert total > 0 and ran == total, f"{ran} of {total} code cells executed"
    tracebacks = lab_page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]',
                                  has_text="Traceback")
    assert tracebacks.count() == 0, "\n---\n".join(tracebacks.all_inner_texts())
    # a static figure's output element is the plot itself; a widget's plot (LiveFigure) sits inside its output
    plots = lab_page.locator(PLOTS)
    plots.first.wait_for(state="visible", timeout=90_000)
    drawn = lab_page.evaluate(
        f"() => [...document.querySelectorAll('{PLOTS}')]"
        ".filter(gd => Array.isArray(gd.data) && gd.data.length > 0).length")
    assert drawn >= 2, f"only {drawn} plotly figures drew traces"
    if stem.startswith("04"):  # the snapshot's two, the replay's three (side by side, what-ifs, peak map), the sweep
        assert drawn >= 6, f"only {drawn} plotly figures drew traces"
        titles = lab_page.locator(".js-plotly-plot .gtitle").all_text_contents()
        for title in ("Reserved memory: the recording and kvlab's replay",
                      "What-ifs: the same allocations, other settings"):
            assert title in titles, titles
    if stem.startswith("00"):
        checks = lab_page.locator(".kvlab-check")
        assert checks.count() >= 6, f"{checks.count()} lab-step checks shown (one per step expected)"
    if stem.startswith("07"):  # the event icicles, the policy bars, the tree widget; the exercise's starter fails
        assert drawn >= 3, f"only {drawn} plotly figures drew traces"
        assert lab_page.locator(".kvlab-check.kvlab-check-fail").count() == 1
