"""Notebook 05 ("your server") in a real browser, in every view: live JupyterLab (and after a reload), Voila
(``kvlab app 05``) and the static report page. The numbers drawn are the CLI's (``kvlab explain-log
--compare-engines``) for the same files, before and after a what-if control and an example change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page

from kvlab import cli
from kvlab.serving.examples import DATA_DIR, LOG_DIR, QWEN_FP8, get_example

from . import lab
from .lab import LabServer
from .test_report_pages import _INSPECT, figure_problems, figures_in_notebook, offline, open_offline  # noqa: F401
from .test_voila import voila  # noqa: F401  (the fixture)

NOTEBOOK = "notebooks/05_your_server.ipynb"
SGLANG = LOG_DIR / "qwen3-235b-fp8-4xh100-sglang-0.4.9.log"
VLLM = LOG_DIR / "qwen3-235b-fp8-4xh100-vllm-0.10.1.1.log"
# the five figures outside the panels (four in sections 1-3, the runtime timeline of section 5), each drawn with traces
_STATIC_DRAWN = """() => [...document.querySelectorAll('.jp-OutputArea-output .js-plotly-plot, .jp-OutputArea-output.js-plotly-plot')]
  .filter(gd => !gd.closest('.kvlab-server-panel, .kvlab-runtime-panel') && Array.isArray(gd.data) && gd.data.length > 0)
  .length == 5"""
# after a reload: each still shown, as a plotly figure or as the PNG plotly saved beside it (JupyterLab shows the
# PNG, a "safe" output, while the reopened notebook is not trusted)
_STATIC_SHOWN = """() => [...document.querySelectorAll('.jp-OutputArea-output')].filter(o => !o.querySelector('.kvlab-server-panel, .kvlab-runtime-panel')
  && (o.matches('.js-plotly-plot') || o.querySelector('.js-plotly-plot') || o.querySelector('img[src^="data:image/png"]'))
  ).length == 5"""
_ANNOTATIONS = """(root) => { const gd = root.classList.contains('js-plotly-plot') ? root
    : root.querySelector('.js-plotly-plot'); return (gd.layout.annotations || []).map(a => a.text); }"""
# the drawn x labels and notes of a figure: how many, how many labels touch a note, how many leave the figure
_LABELS_AND_NOTES = """(root) => { const gd = root.classList.contains('js-plotly-plot') ? root
    : root.querySelector('.js-plotly-plot');
  const boxes = sel => [...gd.querySelectorAll(sel)].map(e => e.getBoundingClientRect()).filter(r => r.width > 0);
  const ticks = boxes('.xtick text'), notes = boxes('.annotation-text'), fig = gd.getBoundingClientRect();
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  return {ticks: ticks.length, notes: notes.length, overlaps: ticks.filter(t => notes.some(n => hit(t, n))).length,
          outside: [...ticks, ...notes].filter(r => r.bottom > fig.bottom + 1 || r.left < fig.left - 1).length}; }"""
LLAMA_LOG = LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log"


def _cli(*args) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["explain-log", *map(str, args), "--json"]) == 0
    return json.loads(out.getvalue())


def _report_case() -> dict:
    return _cli(SGLANG, "--model-config", DATA_DIR / QWEN_FP8, "--gpu", "h100-80g", "--compare-engines",
                "--vllm-log", VLLM)


def _check_engines(page: Page, comp: dict) -> None:
    """The panel's engine waterfalls end in the CLI's budgets and name its token counts; the gap bars are its gap."""
    engines = lab.wait_plotly(page, ".kvlab-engines")
    assert [t["y"][-1] for t in engines] == pytest.approx(
        [comp["sglang"]["budget_gib"], comp["vllm"]["budget_gib"]], abs=1e-4)
    titles = " ".join(lab.widget(page, "kvlab-engines").evaluate(_ANNOTATIONS))
    assert f"{comp['sglang']['tokens']:,} tokens" in titles and f"{comp['vllm']['tokens']:,} tokens" in titles
    gap = lab.wait_plotly(page, ".kvlab-gap")[0]
    assert list(gap["x"]) == [row["tokens"] for row in comp["gap"]]


@pytest.mark.browser
@pytest.mark.slow
def test_lab_draws_the_clis_numbers_and_the_controls_recompute(lab_page: Page, lab_server: LabServer,
                                                                artifacts: Path):
    comp = _report_case()["engine_comparison"]
    # a copy in the (git-ignored) artifacts folder: the test saves it with its outputs before reloading
    copy = artifacts / "05_your_server.ipynb"
    shutil.copy(lab_server.root_dir / NOTEBOOK, copy)
    relpath = copy.relative_to(lab_server.root_dir).as_posix()
    lab.open_notebook(lab_page, lab_server, relpath)
    lab.run_all(lab_page, timeout=600_000)
    lab.wait_for_output_text(lab_page, "panel:")
    _check_engines(lab_page, comp)
    assert lab_page.evaluate(_STATIC_DRAWN)  # sections 1-3 and 5 draw their figures outside the panels too
    lab.screenshot(lab_page, artifacts / "lab05_panel.png", ".kvlab-server-panel")

    # what if mem_fraction_static = 0.9: the what-if bar is the CLI's
    what_if = _cli(SGLANG, "--model-config", DATA_DIR / QWEN_FP8, "--gpu", "h100-80g", "--what-if",
                   "mem_fraction_static=0.9")["what_if"][0]["max_total_num_tokens"]
    before = lab.wait_plotly(lab_page, ".kvlab-what-ifs")
    assert lab.set_slider(lab_page, "kvlab-whatif-fraction", 0.9) == "0.90"
    bars = lab.wait_plotly_change(lab_page, ".kvlab-what-ifs", before)[0]
    assert list(bars["x"]) == ["as explained", "mem_fraction_static=0.9"] and bars["y"][1] == what_if

    _check_waterfall_at_1280(lab_page, artifacts)

    # the Llama log's text pasted over the Qwen3 example: judged with its own model (the log's architecture and
    # numbers), no Qwen3 vLLM log beside it, the GPU asked for: the verdict the menu gives for it (issue 35)
    ex = get_example("llama-3.1-8b-h100-sglang-0.5.23")
    cli_ex = _cli(LOG_DIR / ex.filename, "--model-config", ex.model_source, "--gpu", ex.gpu, "--compare-engines")
    lab_page.locator(".kvlab-log-text textarea").fill(LLAMA_LOG.read_text())
    verdict = (f"{cli_ex['max_total_num_tokens_computed']:,} tokens (print rounding allows "
               f"{cli_ex['computed_range'][0]:,}–{cli_ex['computed_range'][1]:,}): consistent with the log")
    lab.wait_widget_text(lab_page, "kvlab-summary", verdict, timeout=60_000)
    lab.wait_widget_text(lab_page, "kvlab-asks", "Choose the GPU")
    assert lab_page.locator(".kvlab-vllm-text textarea").input_value() == ""
    assert lab.widget(lab_page, "kvlab-model").locator("select").input_value() == ex.model
    lab.screenshot(lab_page, artifacts / "lab05_pasted_llama.png", ".kvlab-server-panel")

    # the same log from the menu: the same verdict, and with the example's GPU the comparison is drawn
    engines = lab.plotly_data(lab_page, ".kvlab-engines")
    lab.select_dropdown(lab_page, "kvlab-example", ex.name)
    lab.wait_plotly_change(lab_page, ".kvlab-engines", engines, timeout=60_000)
    lab.wait_widget_text(lab_page, "kvlab-summary", verdict)
    drawn = lab.plotly_data(lab_page, ".kvlab-waterfall")[0]
    budget = next(t for t in cli_ex["terms"] if t["name"] == "KV pool budget (rest)")  # after any version terms
    assert drawn["y"][-1] == pytest.approx(budget["gib"])
    lab.wait_widget_text(lab_page, "kvlab-summary", f"{cli_ex['max_total_num_tokens_computed']:,} tokens")
    _check_engines(lab_page, cli_ex["engine_comparison"])
    lab.screenshot(lab_page, artifacts / "lab05_llama.png", ".kvlab-server-panel")

    # saved, then a reload: the saved outputs' views attach again to the live widgets and draw what the panel
    # shows now, and the static figures come back from the saved outputs
    lab_page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    lab_page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    lab_page.reload(wait_until="domcontentloaded")
    lab.wait_kernel_idle(lab_page, relpath)
    lab.wait_plotly(lab_page, ".kvlab-engines", timeout=120_000)
    _check_engines(lab_page, cli_ex["engine_comparison"])
    lab_page.wait_for_function(_STATIC_SHOWN, timeout=60_000)
    lab.screenshot(lab_page, artifacts / "lab05_reloaded.png", ".kvlab-server-panel")


def _check_waterfall_at_1280(page: Page, artifacts: Path) -> None:
    """At 1280 px with the file browser open (issue 35): the waterfall's slanted labels clear of its footnote and
    inside the figure; the weights bar hovers as its term (−55.17 GiB, assumed), not the level after it (21.86)."""
    size = page.viewport_size
    page.set_viewport_size({"width": 1280, "height": 720})
    lab.open_file_browser(page)
    page.wait_for_timeout(1_000)  # the figures are laid out again at the new width
    layout = lab.widget(page, "kvlab-waterfall").evaluate(_LABELS_AND_NOTES)
    assert layout["ticks"] >= 4 and layout["notes"] >= 1 and layout["overlaps"] == 0 and layout["outside"] == 0, layout
    weights = lab.widget(page, "kvlab-waterfall").locator(".point").nth(1)
    weights.scroll_into_view_if_needed()
    box = weights.bounding_box()  # plotly's drag layer takes the pointer events: move the mouse over the bar
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = lab.widget(page, "kvlab-waterfall").locator(".hoverlayer .hovertext")
    hover.wait_for(timeout=10_000)
    text = hover.text_content()
    assert "weights and other memory loaded: -55.17* GiB" in text and "assumed, not read" in text, text
    lab.screenshot(page, artifacts / "lab05_waterfall_1280.png", ".kvlab-waterfall")
    page.mouse.move(0, 0)
    page.set_viewport_size(size)


@pytest.mark.browser
@pytest.mark.slow
def test_voila_05_draws_the_report_case(voila, context: BrowserContext, artifacts: Path):  # noqa: F811
    comp = _report_case()["engine_comparison"]
    page: Page = context.new_page()
    page.goto(voila("05"), wait_until="commit")
    page.locator(".kvlab-engines .js-plotly-plot").wait_for(state="attached", timeout=300_000)
    assert page.locator(".jp-CodeCell .jp-InputArea, .jp-CodeMirrorEditor, .cm-editor").count() == 0
    _check_engines(page, comp)
    for selector in (".kvlab-waterfall", ".kvlab-what-ifs"):
        assert lab.wait_plotly(page, selector)
    runtime = lab.wait_plotly(page, ".kvlab-runtime-figure")  # the runtime panel (issue 36): the example drawn
    assert {"tokens in use", "cumulative", "retraction / preemption"} <= {t.get("name") for t in runtime}
    lab.screenshot(page, artifacts / "voila05.png", ".kvlab-server-panel")
    lab.screenshot(page, artifacts / "voila05_runtime.png", ".kvlab-runtime-panel")
    page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_report_page_05_draws_every_figure(offline: BrowserContext, tmp_path: Path, artifacts: Path):  # noqa: F811
    out = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "kvlab.cli", "report", "--out", str(out), "--device", "sim:h200",
                           "--no-png", "--notebooks", "05"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KVLAB_PROGRESS": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = "05_your_server"
    opened = open_offline(offline, out / "html" / f"{name}.html")
    figures = opened.page.evaluate(_INSPECT)
    expected = figures_in_notebook(out / "notebooks" / f"{name}.ipynb")
    assert len(figures) == expected == 10  # 4 in sections 1-3, 4 in the panel, the runtime timeline and its panel
    assert not figure_problems(name, figures)
    assert not opened.page_errors and not opened.off_machine
    comp = _report_case()["engine_comparison"]
    text = opened.page.locator("body").inner_text()
    assert f"{comp['sglang']['tokens']:,} tokens (log 367,404)" in text
    lab.screenshot(opened.page, artifacts / "report05.png")
    opened.page.close()
