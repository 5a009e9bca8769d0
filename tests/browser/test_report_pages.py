"""``kvlab report``'s pages in a real browser with the network cut: every figure on every page draws something
usable, and the headline figures of notebooks 01 and 02 show the numbers of the table beside them and the CLI's.

One report of every notebook is built per test session (``kvlab report --device sim:h200 --no-png``, under a
minute on 2 cores). Each page is opened from ``file://`` with every other request aborted, as a reader without a
network would open it. A figure is read from its ``.js-plotly-plot`` div: the traces the notebook asked to show
(``gd.data``, those not hidden by ``visible``), what plotly made of them (``gd._fullData``) and what it drew (the
SVG elements of each trace). Full-page screenshots go to tests/browser/artifacts/<test>/<page>.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import nbformat
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from kvlab.report import DEFAULT_NOTEBOOK_DIR, select_notebooks
from kvlab.viz.export import WIDGET_STATE, WIDGET_VIEW

from . import lab
from .panels import GIB, check_kv_pool_panel, check_shortfall_panel, pool_cli, sim_cli

PAGES = [p.stem for p in select_notebooks(DEFAULT_NOTEBOOK_DIR)]  # 00 ... 04: every notebook the report runs
LOCAL_SCHEMES = {"file", "data", "blob", "about"}  # a page from disk may load these; anything else leaves the machine
REPORT_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def report_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``kvlab report`` of every notebook, built once per test session; every notebook must have run."""
    out = tmp_path_factory.mktemp("report-pages") / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "kvlab.cli", "report", "--out", str(out), "--device", "sim:h200", "--no-png"],
        capture_output=True, text=True, timeout=REPORT_TIMEOUT_S, env={**os.environ, "KVLAB_PROGRESS": "0"})
    assert proc.returncode == 0, \
        f"kvlab report failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    ran = json.loads((out / "summary.json").read_text())["notebooks"]
    assert sorted(ran) == PAGES and all(r["ok"] for r in ran.values()), ran
    return out


@dataclass
class OfflinePage:
    page: Page
    off_machine: list[str] = field(default_factory=list)  # requests that were aborted
    page_errors: list[str] = field(default_factory=list)  # uncaught exceptions in the page's scripts
    console_errors: list[str] = field(default_factory=list)


@pytest.fixture
def offline(browser: Browser, browser_context_args: dict) -> Iterator[BrowserContext]:
    """A browser context in which only ``file:`` (and ``data:``/``blob:``) requests go through."""
    context = browser.new_context(**browser_context_args)
    context.set_default_timeout(30_000)
    yield context
    context.close()


def open_offline(context: BrowserContext, path: Path) -> OfflinePage:
    """Open ``path`` with every non-local request aborted and recorded, and wait until each plotly div has drawn
    (or 60 s passed: a figure that never draws is then reported by ``figure_problems``, not as a timeout)."""
    page = context.new_page()
    opened = OfflinePage(page)

    def local_only(route: Route) -> None:
        if urlsplit(route.request.url).scheme in LOCAL_SCHEMES:
            route.continue_()
        else:
            opened.off_machine.append(route.request.url)
            route.abort()

    page.route("**/*", local_only)
    page.on("pageerror", lambda err: opened.page_errors.append(str(err)))
    page.on("console", lambda msg: opened.console_errors.append(msg.text) if msg.type == "error" else None)
    page.goto(path.as_uri(), wait_until="load")
    try:
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".every(gd => gd._fullLayout && gd.querySelector('.main-svg'))", timeout=60_000, polling=200)
    except PlaywrightTimeout:
        pass
    return opened


# What each figure holds and drew, per trace. ``shown``: the notebook did not hide it (gd.data's visible is
# not false / 'legendonly'); ``points``: entries plotly can place (finite numbers or category names, in every
# coordinate the type needs); ``drawn``: SVG primitives inside the trace's own <g class="trace"> (a line path
# with a d, a bar or waterfall box, an icicle slice, an indicator's number).
_INSPECT = """
() => {
  const placeable = v => (typeof v === 'number' && isFinite(v)) || (typeof v === 'string' && v.trim() !== '');
  const list = a => (a && typeof a.length === 'number' && typeof a !== 'string') ? Array.from(a) : [];
  const pairs = (a, b) => {
    const xs = list(a), ys = list(b);
    if (!xs.length) return ys.filter(placeable).length;  // y only: plotly places it at x0 + i*dx
    if (!ys.length) return xs.filter(placeable).length;
    return xs.filter((x, i) => placeable(x) && placeable(ys[i])).length;
  };
  const groupOf = (gd, index) => Array.from(gd.querySelectorAll('g.trace')).filter(g => {
    const d = g.__data__; const cd = Array.isArray(d) ? d[0] : d;
    return cd && cd.trace && cd.trace.index === index;
  });
  const realPath = p => { const d = p.getAttribute('d') || ''; return d.length > 2 && d !== 'M0,0Z'; };
  return Array.from(document.querySelectorAll('.plotly-graph-div')).map((gd, figure) => {
    const wrapper = gd.closest('[class*="kvlab-"]');
    const title = gd._fullLayout && gd._fullLayout.title ? (gd._fullLayout.title.text || '') : '';
    if (!gd._fullLayout || !Array.isArray(gd._fullData)) {
      return {figure, drawn: false, title, where: wrapper ? wrapper.className : '', traces: []};
    }
    const traces = gd._fullData.map(t => {
      const user = gd.data[t.index] || {};
      const groups = groupOf(gd, t.index);
      const inGroups = sel => groups.flatMap(g => Array.from(g.querySelectorAll(sel)));
      let points = 0, value = null;
      const zRows = list(t.z).map(list);
      if (t.type === 'indicator') { value = t.value; points = placeable(t.value) ? 1 : 0; }
      else if (t.type === 'icicle' || t.type === 'treemap' || t.type === 'sunburst' || t.type === 'pie')
        points = list(t.labels).length || list(t.ids).length;
      else if (t.type === 'heatmap' || t.type === 'contour') points = zRows.flat().filter(placeable).length;
      else if (t.type === 'waterfall') points = list(t.orientation === 'h' ? t.x : t.y).filter(placeable).length;
      else points = pairs(t.x, t.y);
      return {
        index: t.index, type: t.type, name: typeof t.name === 'string' ? t.name : '', mode: t.mode || '',
        shown: user.visible !== false && user.visible !== 'legendonly', points, value,
        // a legend key: a trace of nulls that only names a colour other traces (an icicle, say) draw
        legend_key: list(t.x).length > 0 && list(t.x).concat(list(t.y)).every(v => v === null || v === undefined),
        lines: inGroups('path.js-line').filter(realPath).length,
        markers: inGroups('path.point').filter(realPath).length,
        boxes: inGroups('g.point path').filter(realPath).length,
        slices: inGroups('g.slice').length,
        number: inGroups('text.number').map(n => n.textContent.trim()).join(' '),
      };
    });
    const images = gd.querySelectorAll('.hm image, .contour image').length;
    return {figure, drawn: true, title, where: wrapper ? wrapper.className : '', traces, images};
  });
}
"""


def _trace_problem(trace: dict, figure: dict) -> str | None:
    """Why a shown trace is not usable, or None. Rules per type (the numbers a reader needs to see anything)."""
    kind, n = trace["type"], trace["points"]
    if kind == "scatter":
        if "lines" in trace["mode"]:
            if n < 2:
                return f"a line with {n} point(s)"
            if trace["lines"] == 0:
                return f"{n} points but no line drawn"
        elif n < 1 or trace["markers"] + trace["lines"] == 0 and "markers" in trace["mode"]:
            return f"{n} marker(s), {trace['markers']} drawn"
        return None
    if kind == "waterfall":
        if n < 3:
            return f"a waterfall of {n} term(s)"
        return None if trace["boxes"] >= 3 else f"{n} terms but {trace['boxes']} boxes drawn"
    if kind == "bar":
        if n == 0:  # a category with nothing in it is fine beside bars that are drawn (04's "pending" blocks)
            others = [t for t in figure["traces"] if t["type"] == "bar" and t["shown"] and t["points"]]
            return None if others else "no bar in any bar trace"
        return None if trace["boxes"] >= 1 else f"{n} bars but none drawn"
    if kind == "indicator":
        value = trace["value"]
        if not isinstance(value, (int, float)) or value == 0:
            return f"value {value!r}"
        return None if trace["number"] else "no number drawn"
    if kind in ("icicle", "treemap", "sunburst"):
        if n < 2:
            return f"{n} node(s)"
        return None if trace["slices"] >= 2 else f"{n} nodes but {trace['slices']} slices drawn"
    if kind in ("heatmap", "contour"):
        if n == 0:
            return "empty z"
        return None if figure["images"] else "z has values but no image drawn"
    return None if n else "no data"


def figure_problems(page_name: str, figures: list[dict]) -> list[tuple[str, int, str, str]]:
    """(page, figure index, trace type, reason) for every figure that is not drawn or draws nothing usable."""
    problems = []
    for fig in figures:
        where = f" ({fig['where']})" if fig["where"] else ""
        if not fig["drawn"]:
            problems.append((page_name, fig["figure"], "-", "plotly never drew it" + where))
            continue
        shown = [t for t in fig["traces"] if t["shown"] and not t.get("legend_key")]
        if not shown:
            problems.append((page_name, fig["figure"], "-", "no trace shown (legend keys aside)" + where))
        for trace in shown:
            reason = _trace_problem(trace, fig)
            if reason:
                problems.append((page_name, fig["figure"], trace["type"],
                                 f"trace {trace['index']} {trace['name']!r}: {reason}{where}"))
    return problems


def figures_in_notebook(path: Path) -> int:
    """The figures an executed notebook shows: plotly outputs of ``fig.show()``, plus the figures inside each
    displayed widget (found through the saved widget state, as the report's static copy finds them)."""
    nb = nbformat.read(path, as_version=4)
    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})

    def in_widget(model_id: str, depth: int = 0) -> int:
        state = states.get(model_id, {}).get("state", {})
        if "_widget_data" in state:
            return 1
        children = [c for c in state.get("children", []) if isinstance(c, str)] if depth < 20 else []
        return sum(in_widget(c.removeprefix("IPY_MODEL_"), depth + 1) for c in children)

    count = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            count += "application/vnd.plotly.v1+json" in data
            if WIDGET_VIEW in data:
                count += in_widget(data[WIDGET_VIEW].get("model_id", ""))
    return count


@pytest.mark.browser
@pytest.mark.slow
def test_every_figure_on_every_report_page_draws_something_usable(offline: BrowserContext, report_site: Path,
                                                                  artifacts: Path):
    problems: list[tuple[str, int, str, str]] = []
    counts: dict[str, tuple[int, int]] = {}
    for name in PAGES:
        opened = open_offline(offline, report_site / "html" / f"{name}.html")
        figures = opened.page.evaluate(_INSPECT)
        expected = figures_in_notebook(report_site / "notebooks" / f"{name}.ipynb")
        counts[name] = (len(figures), expected)
        problems += figure_problems(name, figures)
        if len(figures) != expected:
            problems.append((name, -1, "-", f"{len(figures)} figures on the page, the notebook shows {expected}"))
        if opened.page_errors:
            problems.append((name, -1, "-", f"JS errors: {opened.page_errors}"))
        if opened.off_machine:
            problems.append((name, -1, "-", f"requests off the machine: {opened.off_machine[:5]}"))
        lab.screenshot(opened.page, artifacts / f"{name}.png")
        opened.page.close()
    print("[kvlab] figures per page (drawn, in the notebook):", counts)
    assert all(n for n, _ in counts.values()), f"a page without figures: {counts}"
    assert not problems, "figures that draw nothing usable:\n" + "\n".join(map(str, problems))


def test_the_rules_catch_an_empty_figure():
    """The checks above fail on what an empty or broken figure looks like (so a pass means something)."""
    def trace(kind: str, **kw) -> dict:
        return {"index": 0, "type": kind, "name": "t", "mode": "", "shown": True, "points": 0, "value": None,
                "lines": 0, "markers": 0, "boxes": 0, "slices": 0, "number": "", **kw}

    def fig(*traces: dict, images: int = 0) -> dict:
        return {"figure": 0, "drawn": True, "title": "", "where": "", "traces": list(traces), "images": images}

    bad = [fig(), fig(trace("scatter", mode="lines", points=1, lines=1)),
           fig(trace("scatter", mode="lines", points=50, lines=0)), fig(trace("waterfall", points=2, boxes=2)),
           fig(trace("indicator", value=0, points=1, number="0")), fig(trace("bar")),
           fig(trace("icicle", points=1, slices=1)), fig(trace("heatmap")), fig(trace("heatmap", points=4)),
           fig(trace("scatter", mode="markers", legend_key=True)),  # legend keys alone draw nothing
           {"figure": 0, "drawn": False, "title": "", "where": "", "traces": []}]
    assert [len(figure_problems("p", [f])) for f in bad] == [1] * len(bad)
    good = [fig(trace("scatter", mode="lines", points=2, lines=1)), fig(trace("waterfall", points=5, boxes=5)),
            fig(trace("indicator", value=41.6, points=1, number="41.6 %")),
            fig(trace("bar", points=3, boxes=3), trace("bar")),  # an empty category beside drawn bars
            fig(trace("icicle", points=9, slices=9)), fig(trace("heatmap", points=4), images=1),
            fig(trace("scatter", mode="lines", shown=False), trace("bar", points=1, boxes=1)),
            fig(trace("icicle", points=9, slices=9), trace("scatter", mode="markers", legend_key=True))]
    assert [figure_problems("p", [f]) for f in good] == [[]] * len(good)


@pytest.mark.browser
def test_an_empty_or_broken_figure_on_a_page_is_reported(offline: BrowserContext, tmp_path: Path):
    """The page inspection finds what an empty figure looks like in a real page (not only in made-up dicts):
    each broken figure below gives one problem naming its type, the good ones none."""
    import plotly.graph_objects as go
    import plotly.io as pio

    figures = [
        go.Figure(go.Scatter(x=[0, 1, 2], y=[3, 1, 2], mode="lines")),  # good
        go.Figure(),  # no trace
        go.Figure(go.Scatter(x=[0], y=[1], mode="lines")),  # a line of one point
        go.Figure(go.Scatter(x=[0, 1, 2], y=[None, float("nan"), 1], mode="lines")),  # one placeable point
        go.Figure(go.Waterfall(x=["a", "b"], y=[3, -1], measure=["absolute", "relative"])),
        go.Figure(go.Indicator(mode="number", value=0)),
        go.Figure(go.Bar(x=[], y=[])),
        go.Figure(go.Icicle(labels=["root"], parents=[""])),
        go.Figure(go.Heatmap(z=[])),
        go.Figure([go.Bar(x=["a", "b"], y=[1, 2]), go.Bar(x=[], y=[])]),  # good: an empty category beside bars
    ]
    body = "".join(pio.to_html(f, include_plotlyjs=(i == 0), full_html=False) for i, f in enumerate(figures))
    path = tmp_path / "figures.html"
    path.write_text(f"<!doctype html><html><body>{body}</body></html>", encoding="utf-8")
    opened = open_offline(offline, path)
    problems = figure_problems("t", opened.page.evaluate(_INSPECT))
    assert sorted((p[1], p[2]) for p in problems) == [
        (1, "-"), (2, "scatter"), (3, "scatter"), (4, "waterfall"), (5, "indicator"), (6, "bar"), (7, "icicle"),
        (8, "heatmap")], problems
    assert opened.page_errors == [] and opened.off_machine == []


def _column(page: Page, table: str, key: str, value: str) -> dict[str, int | float]:
    """One column of a panel's static table: field -> its number (``data-value``)."""
    cells = page.locator(f"{table} td[data-field][data-{key}='{value}']").evaluate_all(
        "tds => tds.map(td => [td.dataset.field, td.dataset.value])")
    return {f: (float(v) if "." in v or "e" in v else int(v)) for f, v in cells if v not in ("", "None")}


@pytest.mark.browser
@pytest.mark.slow
def test_report_01_waterfall_terms_equal_the_table_and_the_cli(offline: BrowserContext, report_site: Path,
                                                               artifacts: Path):
    """The KV budget waterfall on page 01 (the panel's default: the gc arm) adds up, term by term, to the table
    beside it, and both are ``kvlab repro kv-pool-sizing --json``'s numbers."""
    cli = pool_cli(True)
    opened = open_offline(offline, report_site / "html" / "01_kv_pool_sizing.html")
    page = opened.page
    table = _column(page, ".kvlab-kv-pool-panel .kvlab-result-table", "arm", "gc")
    for key in ("pre_model_load_bytes", "available_bytes", "rest_bytes", "max_total_num_tokens", "max_req_input_len",
                "idle_bytes"):
        assert table[key] == cli[key], (key, table[key], cli[key])

    waterfall = check_kv_pool_panel(page, "gc", cli)  # first term and total vs the table, title, verdict
    terms = dict(zip(waterfall["x"], waterfall["y"]))
    assert list(terms) == ["free before load", "weights", "still referenced / cached", "slack (1 − f)",
                           "KV pool budget"]
    y = waterfall["y"]  # GiB, each rounded to 4 decimals
    assert y[0] == pytest.approx(table["pre_model_load_bytes"] / GIB, abs=1e-4)
    assert y[0] + y[1] + y[2] == pytest.approx(table["available_bytes"] / GIB, abs=2e-4)  # what the reading saw
    assert y[3] == pytest.approx(-cli["slack_bytes"] / GIB, abs=1e-4)
    assert y[3] == pytest.approx((table["rest_bytes"] - table["available_bytes"]) / GIB, abs=2e-4)
    assert sum(y[:4]) == pytest.approx(table["rest_bytes"] / GIB, abs=3e-4)
    assert waterfall["text"][-1] == f"{cli['rest_bytes'] / GIB:.2f}"  # the number on the total bar
    assert opened.page_errors == [] and opened.off_machine == []
    lab.screenshot(page, artifacts / "report01_panel.png", ".kvlab-kv-pool-panel")
    page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_report_02_gauge_equals_the_table_and_the_cli(offline: BrowserContext, report_site: Path, artifacts: Path):
    """Page 02's hit-rate gauge (the panel's default: shortfall eviction) shows the table's hit rate, and the
    table (and bars, timelines) are ``kvlab simulate --json``'s numbers for the panel's settings."""
    fix, bug = sim_cli("shortfall"), sim_cli("full")
    opened = open_offline(offline, report_site / "html" / "02_shortfall_eviction.html")
    page = opened.page
    table = _column(page, ".kvlab-shortfall-panel .kvlab-sim-result-table", "mode", "shortfall")
    gauge = lab.plotly_data(page, ".kvlab-sim-gauge")[0]
    assert gauge["type"] == "indicator"
    assert gauge["value"] == pytest.approx(100 * table["hit_rate"], abs=1e-3)
    assert gauge["value"] == pytest.approx(100 * fix["hit_rate"], abs=1e-3)
    check_shortfall_panel(page, "shortfall", fix, bug)  # the table vs the CLI, the gauge's reference, bars, lines
    assert opened.page_errors == [] and opened.off_machine == []
    lab.screenshot(page, artifacts / "report02_panel.png", ".kvlab-shortfall-panel")
    page.close()
