"""Static exports of the findings' key figures (PNG through kaleido, standalone HTML), for ``kvlab report``.

Lives in ``viz`` because it imports plotly; ``kvlab.report`` imports it lazily so the core stays plot-free.
kaleido ≥ 1 drives a system Chrome/Chromium through choreographer; Debian's ``/usr/bin/chromium`` works and
is used when ``$BROWSER_PATH`` is not set (kaleido would otherwise look for a Chrome it downloaded itself).
"""

from __future__ import annotations

import os
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from kvlab.errors import KvlabError

SYSTEM_CHROMIUM = "/usr/bin/chromium"


# What each key figure shows, in words: the report's captions (the figures' own titles are per-panel only).
FIGURE_CAPTIONS = {
    "finding1_memory_timelines": "Finding 1 · GPU memory of rank 0 while SGLang starts, without and with gc.collect() "
                                 "before the memory reading: allocated, reserved and free bytes per allocator event",
    "finding1_budget_no_gc": "Finding 1 · How the KV budget is computed without gc.collect(): from the memory free "
                             "before loading to the KV pool budget",
    "finding1_budget_gc": "Finding 1 · How the KV budget is computed with gc.collect() (the fix)",
    "finding2_timelines": "Finding 2 · Cumulative prefix-cache hit rate, evicted and over-evicted tokens over the "
                          "workload, shortfall eviction (the fix) beside full eviction (the bug)",
    "finding2_totals": "Finding 2 · Prefill tokens computed, tokens evicted and tokens over-evicted over the whole "
                       "workload, per eviction mode",
}


def key_figures(pool_arms, comparison) -> dict[str, go.Figure]:
    """The findings' headline figures by file stem (captions in ``FIGURE_CAPTIONS``): finding 1's timelines
    and both budgets, finding 2's timelines and totals. ``pool_arms`` is ``kv_pool_sizing.compare(...)``'s
    (without gc, with gc)."""
    from kvlab.viz import widgets  # the panels' own figure builders: the report shows what the panels draw

    no_gc, with_gc = pool_arms
    figures = {"finding1_memory_timelines": widgets.timelines_figure(no_gc, with_gc),
               "finding1_budget_no_gc": widgets.budget_figure(no_gc),
               "finding1_budget_gc": widgets.budget_figure(with_gc),
               "finding2_timelines": widgets.sim_timelines_figure(comparison),
               "finding2_totals": widgets.totals_figure(comparison)}
    return figures


def caption(stem: str) -> str:
    """A figure's caption in words; a stem without one gets its words back (``finding3_x`` -> ``finding3 x``)."""
    return FIGURE_CAPTIONS.get(stem, stem.replace("_", " "))


# PNG size: 1200 layout px wide (the index shows them at up to ~1100 CSS px, so text keeps about its size),
# drawn at scale 2 for sharp text, with a base font of 14 px instead of plotly's 12.
PNG_WIDTH = 1200
PNG_DEFAULT_HEIGHT = 500
PNG_SCALE = 2
PNG_FONT_SIZE = 14


# kaleido's page loads MathJax from cdnjs unless told not to: the key figures carry no LaTeX, and no request may
# leave the machine. plotly.js comes from the plotly package (kaleido's default when plotly is installed).
KALEIDO_OPTIONS = {"mathjax": False}


class FigureExportError(KvlabError):
    """kaleido did not write a figure."""


def write_pngs(figures: dict[str, go.Figure], out_dir: str | os.PathLike[str], *, width: int = PNG_WIDTH,
               scale: float = PNG_SCALE, font_size: int = PNG_FONT_SIZE) -> list[Path]:
    """Write ``<stem>.png`` for each figure in one kaleido session (one browser start for all of them), at
    ``width`` × the figure's own height (or ``PNG_DEFAULT_HEIGHT``) layout pixels, ``scale`` × that many
    image pixels. Copies are exported: the callers' figures keep their fonts. A figure kaleido fails to
    write raises ``FigureExportError`` naming it (plotly's ``write_images`` would only skip the file)."""
    import kaleido

    if not os.environ.get("BROWSER_PATH") and os.access(SYSTEM_CHROMIUM, os.X_OK):
        os.environ["BROWSER_PATH"] = SYSTEM_CHROMIUM
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs, paths = [], []
    for stem, fig in figures.items():
        copy = go.Figure(fig).update_layout(font_size=font_size)
        path = out / f"{stem}.png"
        path.unlink(missing_ok=True)
        specs.append({"fig": copy.to_dict(), "path": path, "opts": {
            "format": "png", "width": width, "height": copy.layout.height or PNG_DEFAULT_HEIGHT, "scale": scale}})
        paths.append(path)
    try:
        kaleido.write_fig_from_object_sync(specs, kopts=dict(KALEIDO_OPTIONS), cancel_on_error=True)
    except Exception as exc:  # kaleido's own errors (no browser, a render that failed or timed out)
        missing = [p.stem for p in paths if not p.is_file()]
        raise FigureExportError(f"PNG export of {', '.join(missing) or 'the figures'} to {out} failed: "
                                f"{type(exc).__name__}: {exc}") from exc
    missing = [p.stem for p in paths if not p.is_file()]
    if missing:
        raise FigureExportError(f"kaleido wrote no PNG for {', '.join(missing)} in {out}")
    return paths


# ---- static stand-ins for widget outputs (for nbconvert's HTML) -------------------------------------
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def plotly_js() -> str:
    """plotly.min.js's text, from the plotly package (``kvlab report`` writes it once, beside its pages)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def plotly_js_tag() -> str:
    """plotly.js inlined, hidden from any AMD loader: the report's template loads no require.js, but an
    output that defines ``define`` would make plotly.min.js register a module instead of setting
    ``window.Plotly``."""
    from plotly.offline import get_plotlyjs

    return ("<script>window.__kvlab_define = window.define; window.define = undefined;</script>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script>"
            "<script>window.define = window.__kvlab_define;</script>")


def _figure_html(state: dict) -> str:
    fig = go.Figure(data=state.get("_widget_data") or [], layout=state.get("_widget_layout") or {})
    # the page's width (no layout width: the figure follows its container, kvlab.viz.widgets) and the figure's own
    # height in px: a height of "100%" inside a box of no set height would collapse and clip the figure
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, default_width="100%",
                       default_height=f"{fig.layout.height or 450}px", post_script=_FOLLOW_CONTAINER)


# plotly.js' own "responsive" follows the window only; a figure in a row beside a table must follow its box (which
# settles once the rest of the page has loaded, and changes when the row wraps)
_FOLLOW_CONTAINER = ("(function (gd) { if (!gd || !window.ResizeObserver) return; var w = gd.offsetWidth;"
                     " new ResizeObserver(function () { if (gd.offsetWidth && gd.offsetWidth !== w) {"
                     " w = gd.offsetWidth; Plotly.Plots.resize(gd); } }).observe(gd); })"
                     "(document.getElementById('{plot_id}'));")


def _widget_html(model_id: str, states: dict, depth: int = 0) -> str:
    """HTML that shows what a widget (tree) displayed when the notebook ran: figures as plotly divs,
    HTML widgets as their value, boxes as flex rows/columns, controls as 'description: value'."""
    import html as _html

    model = states.get(model_id)
    if model is None or depth > 20:
        return ""
    name, state = model.get("model_name", ""), model.get("state", {})
    classes = " ".join(state.get("_dom_classes", []))
    layout = states.get(str(state.get("layout", "")).removeprefix("IPY_MODEL_"), {}).get("state", {})
    if layout.get("display") == "none" and "kvlab-style" not in classes:  # hidden on the page: hidden here too
        return ""
    if "_widget_data" in state:
        return f"<div class='{classes}'>{_figure_html(state)}</div>"
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<div class='{classes}'>{state.get('value', '')}</div>"
    if name in ("HBoxModel", "VBoxModel", "BoxModel", "GridBoxModel"):
        # a row wraps: on a narrow page the table beside a figure goes below it instead of being cut off
        flow = "flex-flow:row wrap;align-items:flex-start" if name == "HBoxModel" else "flex-direction:column"
        inner = "".join(_widget_html(c.removeprefix("IPY_MODEL_"), states, depth + 1) for c in state.get("children", []))
        return f"<div class='{classes}' style='display:flex;{flow};gap:8px;min-width:0'>{inner}</div>"
    if name == "OutputModel":
        texts = [o.get("text", "") for o in state.get("outputs", []) if o.get("output_type") == "stream"]
        return f"<pre class='{classes}'>{_html.escape(''.join(texts))}</pre>" if any(texts) else ""
    if name == "TextareaModel":  # a pasted log or config: kept as text, in a short scrolling box
        label = state.get("description") or ""
        head = f"<div style='color:#555'>{_html.escape(label)}</div>" if label else ""
        if not state.get("value"):
            return (f"<div class='{classes}' style='padding:2px 6px;color:#888'>{head}"
                    f"<i>{_html.escape(state.get('placeholder') or '(empty)')}</i></div>")
        return (f"<div class='{classes}'>{head}<pre style='max-height:10em;overflow:auto;margin:2px 0;"
                f"padding:4px 6px;border:1px solid #ddd;font-size:85%'>{_html.escape(state['value'])}</pre></div>")
    if name == "FileUploadModel":
        count = len(state.get("value") or ())
        label = state.get("description") or "upload"
        return (f"<div class='{classes}' style='padding:2px 6px;color:#555'>{_html.escape(label)}: "
                f"<b>{count} file{'s' if count != 1 else ''}</b></div>")
    if state.get("description") is not None and ("value" in state or "index" in state):
        label = state.get("description") or name.removesuffix("Model")
        value = state.get("value")
        if "_options_labels" in state and isinstance(state.get("index"), int):  # dropdowns, toggle buttons
            value = state["_options_labels"][state["index"]]
        return (f"<div class='{classes}' style='padding:2px 6px;color:#555'>{_html.escape(str(label))}: "
                f"<b>{_html.escape(str(value))}</b></div>")
    return ""


PLOTLY_JS_MARKER = "* plotly.js v"  # the first lines of plotly.min.js: an output that loads plotly.js itself


def static_widget_outputs(nb):
    """A copy of an executed notebook fit for an offline page: widget outputs are replaced by static HTML from
    the saved widget state (the panels' figures as plotly divs, HTML widgets as their value), remote
    ``<script src>`` tags are dropped from HTML outputs (plotly's ``notebook`` renderer adds MathJax from a
    CDN to each figure), and plotly.js is inlined once, in the first output that draws a figure, unless an
    earlier output (plotly's notebook-renderer init) already loads it. nbformat's widget state is dropped from
    the copy (it would make nbconvert load widget code from a CDN)."""
    import copy

    from kvlab.viz.offline import strip_remote_scripts

    nb = copy.deepcopy(nb)
    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    js_done = False
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            view = data.get(WIDGET_VIEW)
            if view:
                body = _widget_html(view.get("model_id", ""), states)
                if body:
                    out["data"] = {"text/html": body, "text/plain": data.get("text/plain", "")}
                    data = out["data"]  # NotebookNode stores a converted copy of the dict
            body = data.get("text/html")
            if body is None:
                continue
            body = strip_remote_scripts("".join(body) if isinstance(body, list) else body)
            if PLOTLY_JS_MARKER in body:
                js_done = True
            elif "plotly-graph-div" in body and not js_done:
                body = plotly_js_tag() + body
                js_done = True
            data["text/html"] = body
    nb.metadata.pop("widgets", None)
    return nb
