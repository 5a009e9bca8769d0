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

Screenshots go to tests/browser/artifacts/<test>/.
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import nbformat
import pytest
from playwright.sync_api import Browser, BrowserContext, Page

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
    lab.wait_widget_text(page, "kvlab-errors", "not an SGLang or vLLM start-up log", timeout=60_000)
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
