"""No stale moment, and figures that fit (issue 25 items 1 and 2), in a real browser.

- ``kvlab app 01`` (Voila): a new preset greys out every result of the old one (``.kvlab-results.kvlab-stale``,
  a CSS spinner line with ``aria-busy``) from the first change the panel makes until the new verdict, waterfall and
  table are drawn: a MutationObserver records the panel after every DOM change, and no record shows the old verdict
  un-greyed. At 1280×720, and at 960 px (JupyterLab's width with the file browser open), no figure or table of the
  panel reaches past its container or the window, and the timelines take the container's width.
- ``kvlab app 05``: pasting text that is not a log replaces every result (figures, the "consistent with the log"
  summary) by the error, shown where the results began, not below them.
- The static report's rendering of the same panel (``kvlab.report.render_html``) at 1280 px: nothing clipped,
  the table beside the waterfall included.
- JupyterLab itself at 1280×720 with the file browser open (a workshop attendee's screen): notebooks 01 and 02 run,
  and no ``.main-svg`` or table of any output reaches past its output area, the notebook or the window; no two
  labels of notebook 01's timelines overlap (the default preset and tiny-h100, whose "measure" label covered
  "gc.collect()" at 960 px). In 02, the tree panel's "pressure event" greys the old tree out until the new one
  is drawn (a MutationObserver records the panel after every DOM change, as for 01 in Voila).

Screenshots go to tests/browser/artifacts/<test>/.
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import nbformat
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from kvlab.experiments import kv_pool_sizing

from . import lab
from .test_voila import voila  # noqa: F401  (the fixture)

# Everything in a panel's results that could be cut off: each plotly layer, each table.
_CLIPPED = """(panelSel) => {
  const vw = document.documentElement.clientWidth, out = [];
  const panel = document.querySelector(panelSel);
  const box = (panel.querySelector('.kvlab-results') || panel).getBoundingClientRect();
  for (const el of panel.querySelectorAll('.main-svg, table')) {
    if (!el.getClientRects().length) continue;  // not displayed
    const r = el.getBoundingClientRect();
    const own = el.parentElement.closest('[class*="kvlab-"]');  // the figure's or table's own widget
    const o = own.getBoundingClientRect();
    if (r.right > Math.min(vw, box.right, o.right) + 1 || r.left < Math.max(box.left, o.left) - 1)
      out.push({what: el.tagName + ' in ' + own.className, left: r.left, right: r.right,
                own: [o.left, o.right], results: [box.left, box.right], viewport: vw});
    const gd = el.closest('.js-plotly-plot');  // an SVG smaller than the figure plotly laid out crops it
    if (gd && gd._fullLayout && (r.width < gd._fullLayout.width - 1 || r.height < gd._fullLayout.height - 1))
      out.push({what: 'cropped svg in ' + own.className, svg: [r.width, r.height],
                layout: [gd._fullLayout.width, gd._fullLayout.height]});
  }
  return out;
}"""
_WIDTHS = """(sel) => { const gd = document.querySelector(sel + ' .js-plotly-plot');
  return [gd.getBoundingClientRect().width, gd.closest('.kvlab-results').getBoundingClientRect().width,
          gd._fullLayout.width]; }"""
# After each DOM change in the panel: is the results box greyed, and which pool does the verdict show?
_WATCH = """() => {
  window.__kvlab_records = [];
  const panel = document.querySelector('.kvlab-kv-pool-panel');
  const snap = () => {
    const v = panel.querySelector('.kvlab-verdict-box');
    window.__kvlab_records.push({stale: panel.querySelector('.kvlab-results').classList.contains('kvlab-stale'),
      busy: !!panel.querySelector('.kvlab-status [aria-busy=true]'),
      tokens: v ? v.dataset.maxTotalNumTokens : null, t: performance.now()});
  };
  new MutationObserver(snap).observe(panel, {subtree: true, childList: true, attributes: true,
                                             attributeFilter: ['class', 'data-max-total-num-tokens']});
}"""


# Every plotly layer and table of every output in a JupyterLab notebook: inside its output area, the notebook and
# the window.
_CLIPPED_OUTPUTS = """() => {
  const vw = document.documentElement.clientWidth, out = [];
  const nb = document.querySelector('.jp-NotebookPanel-notebook').getBoundingClientRect();
  for (const area of document.querySelectorAll('.jp-OutputArea-output')) {
    const a = area.getBoundingClientRect();
    for (const el of area.querySelectorAll('.main-svg, table')) {
      if (!el.getClientRects().length) continue;  // not displayed
      const r = el.getBoundingClientRect();
      if (r.right > Math.min(vw, nb.right, a.right) + 1 || r.left < Math.max(nb.left, a.left) - 1)
        out.push({what: el.tagName + ' in ' + (el.parentElement.closest('[class*="kvlab-"]') || area).className,
                  left: r.left, right: r.right, output: [a.left, a.right], notebook: [nb.left, nb.right], viewport: vw});
    }
  }
  return out;
}"""
# Pairs of labels (plotly annotations: their background boxes) of one figure that overlap on screen.
_OVERLAPPING_LABELS = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  const boxes = [...gd.querySelectorAll('g.annotation')].map(g => {
    const r = (g.querySelector('rect.bg') || g).getBoundingClientRect();
    return {text: g.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom};
  }).filter(b => b.r > b.l && b.b > b.t);
  const out = [];
  for (let i = 0; i < boxes.length; i++)
    for (let j = i + 1; j < boxes.length; j++) {
      const p = boxes[i], q = boxes[j];
      if (p.l < q.r - 0.5 && q.l < p.r - 0.5 && p.t < q.b - 0.5 && q.t < p.b - 0.5) out.push([p.text, q.text]);
    }
  return {count: boxes.length, overlaps: out};
}"""
# After each DOM change in the tree panel: greyed (the results, or the figure while plotly redraws), the steps the
# log counts, and whether the drawing has the pale block of what the pressure event evicted.
_WATCH_TREE = """() => {
  window.__kvlab_tree = [];
  const panel = document.querySelector('.kvlab-tree-demo-panel');
  const snap = () => {
    const log = panel.querySelector('.kvlab-tree-log [data-steps]');
    const gd = panel.querySelector('.kvlab-tree-fig .js-plotly-plot');
    const ids = gd && gd.data && gd.data[0] && gd.data[0].ids ? Array.from(gd.data[0].ids) : [];
    window.__kvlab_tree.push({stale: panel.querySelector('.kvlab-results').classList.contains('kvlab-stale'),
      drawing: !!panel.querySelector('.kvlab-drawing'), steps: log ? log.dataset.steps : null,
      gone: ids.includes('__gone__'), t: performance.now()});
  };
  new MutationObserver(snap).observe(panel, {subtree: true, childList: true, attributes: true,
                                             attributeFilter: ['class', 'data-steps']});
}"""


def _labels_apart(page: Page, sel: str = ".kvlab-timelines") -> None:
    found = page.evaluate(_OVERLAPPING_LABELS, sel)
    assert found["count"] >= 6 and found["overlaps"] == [], found  # each arm's labels, the titles, the legend


def _tokens(preset: str) -> str:
    return str(kv_pool_sizing.compare(preset)[1].to_json()["max_total_num_tokens"])  # the gc arm (the default)


def _assert_fits(page: Page, panel: str, wide: str) -> None:
    assert page.evaluate(_CLIPPED, panel) == []
    drawn, container, layout_width = page.evaluate(_WIDTHS, wide)
    assert abs(drawn - container) <= 24 and abs(layout_width - drawn) <= 2, (drawn, container, layout_width)


@pytest.mark.browser
@pytest.mark.slow
def test_voila_01_greys_out_the_old_preset_and_its_figures_fit(voila, context: BrowserContext,  # noqa: F811
                                                               artifacts: Path):
    page: Page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(voila("01"), wait_until="commit")
    page.locator(".kvlab-verdict .kvlab-verdict-box").wait_for(state="attached", timeout=300_000)
    lab.wait_plotly(page, ".kvlab-timelines")
    lab.wait_plotly(page, ".kvlab-waterfall")
    old = page.locator(".kvlab-verdict-box").get_attribute("data-max-total-num-tokens")
    page.wait_for_timeout(500)
    _assert_fits(page, ".kvlab-kv-pool-panel", ".kvlab-timelines")
    lab.screenshot(page, artifacts / "voila01_1280.png", ".kvlab-kv-pool-panel")

    new = _tokens("tiny-h100")
    assert new != old
    page.evaluate(_WATCH)
    lab.select_dropdown(page, "kvlab-preset", "tiny-h100")
    page.wait_for_function("(n) => document.querySelector('.kvlab-verdict-box').dataset.maxTotalNumTokens === n"
                           " && !document.querySelector('.kvlab-results').classList.contains('kvlab-stale')",
                           arg=new, timeout=120_000, polling=50)
    records = page.evaluate("() => window.__kvlab_records")
    assert records and records[0]["stale"] and any(r["busy"] for r in records), records[:3]  # greyed first
    assert all(r["stale"] or r["tokens"] == new for r in records), records  # never the old verdict un-greyed
    assert not records[-1]["stale"] and not records[-1]["busy"] and records[-1]["tokens"] == new
    lab.screenshot(page, artifacts / "voila01_tiny_h100.png", ".kvlab-kv-pool-panel")

    page.set_viewport_size({"width": 960, "height": 720})  # JupyterLab's notebook width with the side panel open
    page.wait_for_timeout(1500)  # the figures follow their container (ResizeObserver -> Plotly.Plots.resize)
    _assert_fits(page, ".kvlab-kv-pool-panel", ".kvlab-timelines")
    _labels_apart(page)  # tiny-h100's with-gc arm: "measure" clear of "gc.collect()"
    lab.screenshot(page, artifacts / "voila01_960.png", ".kvlab-kv-pool-panel")
    page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_voila_05_a_pasted_non_log_replaces_the_results_with_the_error(voila, context: BrowserContext,  # noqa: F811
                                                                       artifacts: Path):
    page: Page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(voila("05"), wait_until="commit")
    page.locator(".kvlab-engines .js-plotly-plot").wait_for(state="attached", timeout=300_000)
    lab.wait_widget_text(page, "kvlab-summary", "consistent with the log")
    results_top = page.locator(".kvlab-server-panel .kvlab-results").bounding_box()["y"]
    assert page.evaluate(_CLIPPED, ".kvlab-server-panel") == []

    page.locator(".kvlab-log-text textarea").fill("hello\nthis is not a start-up log\n")
    error = page.locator(".kvlab-server-panel .kvlab-errors")
    # (the server panel's errors: the runtime panel of section 5 has its own kvlab-errors box)
    expect(error).to_contain_text("not an SGLang or vLLM start-up log", timeout=60_000)
    page.wait_for_function("() => !document.querySelector('.kvlab-server-panel .kvlab-results').getClientRects().length",
                           timeout=30_000)
    shown = page.evaluate("""() => [...document.querySelectorAll(
        '.kvlab-server-panel .js-plotly-plot, .kvlab-server-panel .kvlab-summary-table')]
        .filter(e => e.getClientRects().length).length""")
    assert shown == 0  # no figure, no "consistent with the log" of the previous example
    assert "consistent with the log" not in page.locator(".kvlab-server-panel").inner_text()
    box = error.bounding_box()
    assert box and box["y"] <= results_top + 5, (box, results_top)  # where the results began, not at the bottom
    lab.screenshot(page, artifacts / "voila05_not_a_log.png", ".kvlab-server-panel")
    page.close()


def _panel_page(tmp_path: Path) -> Path:
    """The notebook-01 panel as ``kvlab report`` renders it: an executed cell's widget view and the saved widget
    state, through ``kvlab.report.render_html``."""
    from kvlab.report import render_html
    from kvlab.viz.export import WIDGET_STATE, WIDGET_VIEW
    from kvlab.viz.widgets import KVPoolPanel

    panel = KVPoolPanel("sglang-pr-4xh200")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("panel.widget")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": panel.widget.model_id},
        "text/plain": "VBox()"})]
    nb.cells = [nbformat.v4.new_markdown_cell("# the panel at 1280 px"), cell]
    nb.metadata["widgets"] = {WIDGET_STATE: widgets.Widget.get_manager_state(drop_defaults=False)}
    page = tmp_path / "panel01.html"
    page.write_text(render_html(nb), encoding="utf-8")
    return page


@pytest.mark.browser
@pytest.mark.slow
def test_report_page_at_1280_clips_nothing(browser: Browser, tmp_path: Path, artifacts: Path):
    path = _panel_page(tmp_path)
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    try:
        page = context.new_page()
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:"))
                   else route.abort())
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_function("() => [...document.querySelectorAll('.plotly-graph-div')].length >= 2 && "
                               "[...document.querySelectorAll('.plotly-graph-div')].every(gd => gd._fullLayout)",
                               timeout=60_000)
        page.wait_for_timeout(500)
        assert page.evaluate(_CLIPPED, ".kvlab-kv-pool-panel") == []
        assert page.evaluate("() => document.documentElement.scrollWidth <= 1280")  # no sideways scroll
        table = page.locator(".kvlab-result-table").bounding_box()
        assert table and table["x"] + table["width"] <= 1280
        lab.screenshot(page, artifacts / "report01_panel_1280.png")
    finally:
        context.close()


LAB_NOTEBOOKS = {  # key -> notebook, text of an output once it ran, its panels, each panel's figures
    "01": ("notebooks/01_kv_pool_sizing.ipynb", "× larger",
           {".kvlab-kv-pool-panel": (".kvlab-timelines", ".kvlab-waterfall")}),
    "02": ("notebooks/02_shortfall_eviction.ipynb", "destroyed only by full eviction",
           {".kvlab-shortfall-panel": (".kvlab-sim-gauge", ".kvlab-sim-timelines", ".kvlab-sim-bars"),
            ".kvlab-tree-demo-panel": (".kvlab-tree-fig",)}),
}


def _assert_lab_fits(page: Page, panels: dict) -> None:
    for figures in panels.values():
        for sel in figures:
            lab.wait_plotly(page, sel, timeout=120_000)
    page.wait_for_timeout(1000)  # every figure laid out at its container's width
    assert page.evaluate(_CLIPPED_OUTPUTS) == []
    for panel in panels:
        assert page.evaluate(_CLIPPED, panel) == [], panel


def _window_shot(page: Page, path: Path, selector: str) -> None:
    """The window as the attendee sees it (file browser, notebook), scrolled to ``selector``."""
    page.locator(selector).scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    page.screenshot(path=path)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(LAB_NOTEBOOKS))
def test_lab_at_1280_with_the_file_browser_open_clips_nothing(key: str, lab_page: Page, lab_server: lab.LabServer,
                                                              artifacts: Path):
    notebook, ran, panels = LAB_NOTEBOOKS[key]
    lab_page.set_viewport_size({"width": 1280, "height": 720})
    lab.open_notebook(lab_page, lab_server, notebook)
    assert lab.open_file_browser(lab_page) >= 150
    lab.run_all(lab_page, timeout=600_000)
    lab.wait_for_output_text(lab_page, ran)
    assert lab_page.locator("#filebrowser").is_visible()  # still open beside the notebook
    _assert_lab_fits(lab_page, panels)
    for panel in panels:
        name = panel.strip(".").removeprefix("kvlab-")
        _window_shot(lab_page, artifacts / f"lab{key}_{name}_window.png", panel)
        lab.screenshot(lab_page, artifacts / f"lab{key}_{name}.png", panel)
    if key == "01":
        _lab_01_tiny_preset(lab_page, artifacts)
    else:
        _lab_02_pressure_event_greys_the_old_tree(lab_page, artifacts)


def _lab_01_tiny_preset(page: Page, artifacts: Path) -> None:
    """Labels apart on the default preset, and on tiny-h100 (the issue's case), whose figures still fit."""
    _labels_apart(page)
    new = _tokens("tiny-h100")
    lab.select_dropdown(page, "kvlab-preset", "tiny-h100")
    page.wait_for_function("(n) => document.querySelector('.kvlab-verdict-box').dataset.maxTotalNumTokens === n"
                           " && !document.querySelector('.kvlab-kv-pool-panel .kvlab-results')"
                           ".classList.contains('kvlab-stale') && !document.querySelector('.kvlab-drawing')",
                           arg=new, timeout=120_000, polling=100)
    _assert_lab_fits(page, LAB_NOTEBOOKS["01"][2])
    _labels_apart(page)
    lab.screenshot(page, artifacts / "lab01_tiny_h100.png", ".kvlab-kv-pool-panel")
    _window_shot(page, artifacts / "lab01_tiny_h100_window.png", ".kvlab-timelines")


def _lab_02_pressure_event_greys_the_old_tree(page: Page, artifacts: Path) -> None:
    """From the click on "pressure event" until the tree is redrawn, no moment shows the old tree un-greyed."""
    steps = page.locator(".kvlab-tree-log [data-steps]").get_attribute("data-steps")
    new = str(int(steps) + 1)
    lab.select_dropdown(page, "kvlab-tree-mode", "full (the bug)")  # evicts more than the shortfall: a visible change
    lab.wait_widget_text(page, "kvlab-tree-log", "mode full")
    page.wait_for_function("() => !document.querySelector('.kvlab-tree-demo-panel .kvlab-results')"
                           ".classList.contains('kvlab-stale')", timeout=30_000)
    page.evaluate(_WATCH_TREE)
    lab.click_widget(page, "kvlab-tree-pressure")
    page.wait_for_function(
        "(n) => { const p = document.querySelector('.kvlab-tree-demo-panel');"
        " const gd = p.querySelector('.kvlab-tree-fig .js-plotly-plot');"
        " return p.querySelector('.kvlab-tree-log [data-steps]').dataset.steps === n"
        " && Array.from(gd.data[0].ids).includes('__gone__')"
        " && !p.querySelector('.kvlab-results').classList.contains('kvlab-stale') && !p.querySelector('.kvlab-drawing'); }",
        arg=new, timeout=60_000, polling=50)
    page.wait_for_timeout(300)  # any late change is recorded too
    records = page.evaluate("() => window.__kvlab_tree")
    assert records and records[0]["stale"], records[:3]  # greyed first, before anything of the new tree
    fresh = [r for r in records if not (r["stale"] or r["drawing"])]
    assert all(r["steps"] == new and r["gone"] for r in fresh), records  # never the old tree un-greyed
    last = records[-1]
    assert not last["stale"] and not last["drawing"] and last["steps"] == new and last["gone"], last
    lab.screenshot(page, artifacts / "lab02_after_pressure.png", ".kvlab-tree-demo-panel")
