"""Notebook 06's figures and panel: hit rate against pool size, and the regime map of full eviction's cost
(:class:`kvlab.experiments.capacity.CapacityResult`)."""

from __future__ import annotations

import html
import math

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from kvlab.viz.live import LiveFigure
from kvlab.viz.sweep_plots import hit_rate_vs_pool
from kvlab.viz.theme import BUG_COLOUR, FIX_COLOUR
from kvlab.viz.widgets import PanelShell

# Diverging: white where full eviction costs nothing, the bug's red where it costs, the fix's blue where the bug
# happened to do better. Symmetric around 0 (zmid), so the colour of a cell is its sign and size.
LOSS_COLOURS = [[0.0, FIX_COLOUR], [0.5, "#f7f7f7"], [1.0, BUG_COLOUR]]
MIN_COLOUR_RANGE_POINTS = 0.5  # a map of tiny differences is not painted as dark as a costly one


def log_ticks(lo: float, hi: float, max_ticks: int = 9) -> list[float]:
    """Clean ticks for a log axis over [lo, hi]: 1-2-5 per decade (10, 20, 50, 100, …), or decades alone where
    1-2-5 would crowd the axis — never plotly's minor labels ("7 8 9 100 2 3")."""
    if lo <= 0 or hi <= 0:
        raise ValueError(f"log ticks need positive bounds, got {lo!r}, {hi!r}")
    lo, hi = min(lo, hi), max(lo, hi)
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for steps in ((1, 2, 5), (1,)):
        ticks = [m * 10 ** e for e in range(first, last + 1) for m in steps if lo <= m * 10 ** e <= hi]
        if len(ticks) <= max_ticks:
            break
    return ticks if len(ticks) >= 2 else [lo, hi]


def _tick_text(v: float) -> str:
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def colour_bound(z_max: float) -> float:
    """The colour bar's half-range: the largest |value| rounded up to a tenth, at least
    ``MIN_COLOUR_RANGE_POINTS``, so the bar's end tick covers every cell (0.58 -> ±0.6, not ±0.5)."""
    return max(MIN_COLOUR_RANGE_POINTS, math.ceil(round(z_max * 10, 6)) / 10)


def _points(v: float) -> str:
    """A difference fix − bug in points as the map and its table write it: signed (positive where full eviction
    loses hits), and a plain 0.00 where there is none."""
    return "0.00" if v == 0 else f"{v:+.2f}"


def loss_heatmap(loss: pd.DataFrame, *, title: str = "Hit rate, fix − bug, in points") -> go.Figure:
    """The regime map: ``loss`` (``CapacityResult.loss_points()``: a row per max running, a column per pool in
    pages, values in points) as a heatmap with each cell's value written in it. Pools and max running are
    categories, so every cell is the same size whatever the spacing of the values."""
    z = loss.to_numpy(dtype=float)
    bound = colour_bound(float(abs(z).max()) if z.size else 0.0)
    ticks = [-bound, -bound / 2, 0.0, bound / 2, bound]
    x = [f"{int(p):,}" for p in loss.columns]
    y = [str(int(r)) for r in loss.index]
    fig = go.Figure(go.Heatmap(
        z=z.tolist(), x=x, y=y, text=[[_points(v) for v in row] for row in z], texttemplate="%{text}",
        colorscale=LOSS_COLOURS, zmid=0, zmin=-bound, zmax=bound, xgap=2, ygap=2,
        colorbar=dict(title=dict(text="fix − bug", side="right"), thickness=14, tickvals=ticks,
                      ticktext=[_points(round(t, 2)) for t in ticks]),
        hovertemplate=("pool %{x} pages · max running %{y}<br>hit rate, fix − bug: %{z:+.2f} points (positive: "
                       "full eviction, the bug, hits less)<extra></extra>")))
    fig.update_xaxes(title_text=loss.columns.name or "KV pool size (pages)", type="category")
    # rows top to bottom in the table's order (plotly puts the first category at the bottom)
    fig.update_yaxes(title_text=loss.index.name or "max running", type="category", autorange="reversed")
    fig.update_layout(title=f"{title} (shortfall − full; positive: the bug loses hits)", height=150 + 50 * len(y), margin=dict(t=50, b=50))
    return fig


def hit_rate_curve(result, max_running: int | None = None) -> go.Figure:
    """Hit rate against pool size in both modes at one max running (default: the largest)."""
    running = max(result.max_running) if max_running is None else max_running
    frame = result.curve(running)
    fig = hit_rate_vs_pool(frame, ideal_hit_rate=result.ideal_hit_rate)
    if len(frame):
        ticks = log_ticks(float(frame["kv_pages"].min()), float(frame["kv_pages"].max()))
        fig.update_xaxes(tickvals=ticks, ticktext=[_tick_text(t) for t in ticks], minor=dict(showgrid=False))
    fig.update_layout(title=f"Hit rate against KV pool size (max running {running})")
    return fig


_CELL = "padding:2px 8px"
_NUMBER = "padding:2px 8px;text-align:right"


def _table_html(caption: str, corner: str, head: list[str], rows: list[tuple[str, str]]) -> str:
    """A kvlab table under a caption: a header row (``corner`` then ``head``), then one row per (label, cells)."""
    head_cells = "".join(f"<th style='{_CELL}'>{label}</th>" for label in head)
    body = "".join(f"<tr><th style='{_NUMBER}'>{label}</th>{cells}</tr>" for label, cells in rows)
    return (f"<p style='margin:4px 0'>{caption}</p><table class='kvlab-table'>"
            f"<tr><th>{corner}</th>{head_cells}</tr>{body}</table>")


def _hits_html(result, max_running: int) -> str:
    table = result.hit_rates(max_running)
    rows = [(f"{pages:,}", "".join(
        f"<td data-field='hit_rate' data-pages='{pages}' data-mode='{m}' data-value='{v}' "
        f"style='{_NUMBER}'>{v:.2%}</td>" for m, v in values.items())) for pages, values in table.iterrows()]
    return _table_html(f"hit rate at max running {max_running}", "pool (pages)",
                       [html.escape(m) for m in table.columns], rows)


def _loss_html(loss: pd.DataFrame) -> str:
    rows = [(f"{running}", "".join(
        f"<td data-field='loss_points' data-running='{running}' data-pages='{pages}' data-value='{v}' "
        f"style='{_NUMBER}'>{_points(v)}</td>" for pages, v in values.items())) for running, values in loss.iterrows()]
    return _table_html("hit-rate points lost to full eviction, shortfall − full (rows: max running; columns: KV pool "
                       "in pages)", "", [f"{int(p):,}" for p in loss.columns], rows)


class CapacityPanel:
    """The curve (one max running at a time, chosen from a dropdown) and the regime map, each above its table.

    Figures are :class:`~kvlab.viz.live.LiveFigure`s drawn whole, so JupyterLab, a reload, Voila and the
    report's saved widget state all show the current figure; ``widget`` is what the notebook displays. Laid out
    by :class:`~kvlab.viz.widgets.PanelShell`: the verdict (the whole sweep's) and the menu, the busy line and
    errors, then the results, greyed out (``kvlab-stale``) from a new max running until they are redrawn."""

    def __init__(self, result) -> None:
        self.result = result
        self.verdict = widgets.HTML(f"<p style='max-width:60em'><b>{html.escape(result.verdict())}</b></p>")
        self.running = widgets.Dropdown(options=[(str(r), r) for r in result.max_running],
                                        value=max(result.max_running), description="max running",
                                        style={"description_width": "initial"})
        self.curve = LiveFigure()
        self.hits = widgets.HTML()
        self.map = LiveFigure(loss_heatmap(result.loss_points()))
        self.loss = widgets.HTML(_loss_html(result.loss_points()))
        for w, css in ((self.verdict, "kvlab-capacity-verdict"), (self.running, "kvlab-capacity-running"),
                       (self.curve, "kvlab-capacity-curve"), (self.hits, "kvlab-capacity-hits"),
                       (self.map, "kvlab-capacity-map"), (self.loss, "kvlab-capacity-loss")):
            w.add_class(css)
        self.shell = PanelShell([self.curve, self.hits, self.map, self.loss])
        self.status, self.errors = self.shell.status, self.shell.errors
        self.running.observe(self.shell.guard(lambda change: self.show(change["new"])), names="value")
        self.shell.guard(self.show)(self.running.value)
        self.widget = self.shell.box(self.verdict, self.running)
        self.widget.add_class("kvlab-capacity-panel")

    def show(self, max_running: int) -> None:
        """Draw the curve and its table at ``max_running`` (the map and its table stay: they cover every one)."""
        with self.shell.showing():
            self.curve.draw(lambda: hit_rate_curve(self.result, max_running), key=max_running)
            self.hits.value = _hits_html(self.result, max_running)


HOST_RATIO_COLOURS = ("#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e")  # no host tier first, then each ratio


def hit_rate_by_host(axis) -> go.Figure:
    """Hit rate against pool size (log x), a colour per host ratio (grey: no host tier), solid the fix
    (shortfall), dashed the bug (full). ``axis``: ``capacity.host_axis(...)``."""
    fig = go.Figure()
    for i, ratio in enumerate(axis.host_ratios):
        colour = HOST_RATIO_COLOURS[i % len(HOST_RATIO_COLOURS)]
        for mode, dash, word in (("shortfall", "solid", "shortfall (the fix)"), ("full", "dash", "full (the bug)")):
            part = axis.frame[(axis.frame["host_ratio"] == ratio) & (axis.frame["mode"] == mode)].sort_values("kv_pages")
            if part.empty:
                continue
            host = "no host tier" if not ratio else f"host ratio {ratio:g}"
            fig.add_trace(go.Scatter(
                x=part["kv_pages"].tolist(), y=part["hit_rate"].round(6).tolist(), name=f"{host}, {word}",
                legendgroup=host, mode="lines+markers", line=dict(color=colour, dash=dash),
                hovertemplate=f"{host}, {word}<br>pool %{{x}} pages<br>hit rate %{{y:.2%}}<extra></extra>"))
    fig.update_xaxes(type="log", title_text="device KV pool (pages)")
    fig.update_yaxes(title_text="hit rate (device + host)", tickformat=".0%", rangemode="tozero")
    fig.update_layout(title=f"Hit rate against pool size, with a host tier ({axis.write_policy}, max running "
                            f"{axis.max_running})", height=460, legend=dict(orientation="h", y=-0.2),
                      margin=dict(t=60, b=90))
    return fig
