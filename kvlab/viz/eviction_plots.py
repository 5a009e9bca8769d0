"""Figures for finding 2 (notebook 02): pure functions, DataFrames in, ``plotly.graph_objects.Figure`` out.

- :func:`cumulative_eviction`: tokens evicted, pressure events and hit rate over simulated time, both
  eviction modes on the same axes (``ShortfallComparison.cumulative_frame()``).
- :func:`regime_heatmap`: the hit-rate loss of full eviction over workload × pool size, as small
  multiples (``eviction_regimes.regime_sweep()`` / ``hybrid_sweep()`` rows).
- :func:`radix_icicles_before_after`: a radix tree before an eviction and after it, at one scale, the
  destroyed nodes kept and drawn grey and hatched (``tree_view.tree_frame`` / ``with_evicted``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.mem_cache.tree_view import EVICTED, with_evicted
from kvlab.viz.plots import icicle_geometry
from kvlab.viz.theme import TEMPLATE

MODE_STYLE = {  # mode -> (legend name, colour, line dash)
    "shortfall": ("shortfall (the fix)", "#1f77b4", "solid"),
    "full": ("full (the bug)", "#d62728", "dash"),
}
OVER_EVICTED_NAME = "full (the bug): evicted earlier than needed"


def _need(frame: pd.DataFrame, columns: set, what: str) -> None:
    missing = columns - set(frame.columns)
    if missing:
        raise ValueError(f"{what}: the table lacks columns {sorted(missing)}")


# ---- over time -------------------------------------------------------------------------------------
CUMULATIVE_ROWS = (  # column, axis title
    ("evicted_tokens", "tokens evicted so far"),
    ("pressure_events", "pressure events so far"),
    ("hit_rate", "hit rate so far"),
)


# what an all-zero row of cumulative_eviction says instead of an empty axis
EMPTY_ROW_TEXT = {"evicted_tokens": "nothing evicted in either mode: the pool never ran short",
                  "pressure_events": "no pressure event in either mode"}


def cumulative_eviction(frame: pd.DataFrame, title: str = "When the cache is evicted, in each mode") -> go.Figure:
    """Three rows sharing one time axis; in each row both modes on the same axes: tokens evicted so far
    (and, dotted, what full eviction evicted earlier than needed), pressure events so far, and the
    cumulative hit rate. ``frame``: ``ShortfallComparison.cumulative_frame()``."""
    _need(frame, {"mode", "time_s", "over_evicted_tokens"} | {c for c, _ in CUMULATIVE_ROWS}, "cumulative_eviction")
    fig = make_subplots(rows=len(CUMULATIVE_ROWS), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    for mode, (name, colour, dash) in MODE_STYLE.items():
        arm = frame[frame["mode"] == mode]
        if arm.empty:
            continue
        x = arm["time_s"].round(4).tolist()
        for row, (column, axis_title) in enumerate(CUMULATIVE_ROWS, 1):
            y = arm[column].round(6).tolist() if column == "hit_rate" else [int(v) for v in arm[column]]
            hover = "%{y:.2%}" if column == "hit_rate" else "%{y:,}"
            fig.add_trace(go.Scatter(x=x, y=y, name=name, legendgroup=mode, showlegend=row == 1, mode="lines",
                                     line=dict(color=colour, dash=dash, width=2, shape="hv"),
                                     hovertemplate=f"{name}<br>%{{x:.1f}} s: {hover} {axis_title}<extra></extra>"),
                          row=row, col=1)
        if mode == "full":
            fig.add_trace(go.Scatter(x=x, y=[int(v) for v in arm["over_evicted_tokens"]], name=OVER_EVICTED_NAME,
                                     mode="lines", line=dict(color=colour, dash="dot", width=1.5, shape="hv"),
                                     hovertemplate="%{x:.1f} s: %{y:,} tokens evicted earlier than needed"
                                                   "<extra></extra>"),
                          row=1, col=1)
    for row, (column, axis_title) in enumerate(CUMULATIVE_ROWS, 1):
        fig.update_yaxes(title_text=axis_title, row=row, col=1,
                         tickformat=".0%" if column == "hit_rate" else ",d", rangemode="tozero")
        if column == "hit_rate":
            continue
        top = int(frame[column].max()) if len(frame) else 0
        if top < 5:  # whole counts: ticks 0, 1, 2 … (plotly's automatic halves would read "0, 1, 1")
            fig.update_yaxes(dtick=1, range=[0, max(top, 1) * 1.05], row=row, col=1)
        if top == 0:  # an empty state says what is true
            fig.add_annotation(text=EMPTY_ROW_TEXT[column], showarrow=False, font=dict(size=13, color="#555555"),
                               xref="x domain" if row == 1 else f"x{row} domain",
                               yref="y domain" if row == 1 else f"y{row} domain", x=0.5, y=0.5)
    end = (float(frame["time_s"].max()) if len(frame) else 0.0) or 1.0  # the 0 tick a little right of the axis, clear of "0%"
    fig.update_xaxes(range=[-0.02 * end, 1.02 * end])
    fig.update_xaxes(title_text="simulated time (seconds)", row=len(CUMULATIVE_ROWS), col=1)
    fig.update_layout(title=title, template=TEMPLATE, height=620, legend=dict(orientation="h", y=-0.1),
                      margin=dict(t=60, l=70, r=20, b=60))
    return fig


# ---- regimes ---------------------------------------------------------------------------------------
GAP_COLOURSCALE = [[0.0, "#ffffff"], [0.2, "#fde0dd"], [1.0, "#b2182b"]]


def share_label(share: float) -> str:
    return f"{share:.0%}"


def gap_matrix(frame: pd.DataFrame) -> tuple[list[str], list[str], list[list[float]]]:
    """(row labels, column labels, gap in points) of one group of :func:`regime_heatmap`, rows in the
    frame's order, columns by pool share."""
    rows = list(dict.fromkeys(frame["regime"]))
    shares = sorted(set(frame["share"]))
    cell = {(r, s): g for r, s, g in zip(frame["regime"], frame["share"], frame["gap_points"])}
    return rows, [share_label(s) for s in shares], [[cell.get((r, s)) for s in shares] for r in rows]


def regime_heatmap(frame: pd.DataFrame, title: str = "Hit rate lost to full eviction (the bug), in points") -> go.Figure:
    """One heatmap per ``group`` (small multiples, one colour scale): rows are regimes, columns pool
    sizes as a share of the workload's distinct prompt tokens, each cell the hit-rate loss of full
    eviction in percentage points (shortfall − full), written in the cell. Hover gives the pool in
    tokens and both hit rates."""
    _need(frame, {"group", "regime", "share", "kv_tokens", "gap_points", "hit_rate_shortfall", "hit_rate_full"},
          "regime_heatmap")
    groups = list(dict.fromkeys(frame["group"]))
    heights = [len(set(frame.loc[frame["group"] == g, "regime"])) for g in groups]
    fig = make_subplots(rows=len(groups), cols=1, subplot_titles=groups, row_heights=heights,
                        vertical_spacing=0.16 if len(groups) > 1 else 0.0)
    top = max(1.0, float(frame["gap_points"].max()))
    for row, group in enumerate(groups, 1):
        sub = frame[frame["group"] == group]
        rows, columns, z = gap_matrix(sub)
        shares = sorted(set(sub["share"]))
        info = {(r, s): (kv, hf, hb) for r, s, kv, hf, hb in zip(sub["regime"], sub["share"], sub["kv_tokens"],
                                                                    sub["hit_rate_shortfall"], sub["hit_rate_full"])}
        custom = [[[f"{info[(r, s)][0]:,}", f"{info[(r, s)][1]:.2%}", f"{info[(r, s)][2]:.2%}"] if (r, s) in info
                   else ["", "", ""] for s in shares] for r in rows]
        fig.add_trace(go.Heatmap(
            x=columns, y=rows, z=z, coloraxis="coloraxis", customdata=custom,
            text=[["" if v is None else f"{v:.2f}" for v in line] for line in z], texttemplate="%{text}",
            hovertemplate=("%{y}<br>pool %{customdata[0]} tokens (%{x} of the distinct prompt tokens)<br>"
                           "hit rate: full (the bug) %{customdata[2]} → shortfall (the fix) %{customdata[1]}<br>"
                           "lost to the bug: %{z:.2f} points<extra></extra>")), row=row, col=1)
        fig.update_yaxes(autorange="reversed", row=row, col=1)
        fig.update_xaxes(title_text="KV pool size, as a share of the workload's distinct prompt tokens", row=row, col=1)
    fig.update_layout(title=title, template=TEMPLATE, height=140 + 48 * sum(heights) + 90 * len(groups),
                      coloraxis=dict(colorscale=GAP_COLOURSCALE, cmin=0, cmax=top,
                                     colorbar=dict(title=dict(text="points lost", side="right"))),
                      margin=dict(t=80, l=20, r=20, b=50))
    return fig


# ---- trees -----------------------------------------------------------------------------------------
TREE_STATUS = {  # status -> (legend name, colour, hatch)
    "locked": ("locked: a running request's path", "#d62728", ""),
    "evictable": ("evictable leaf", "#2ca02c", ""),
    "internal": ("shared prefix (inner node)", "#1f77b4", ""),
    EVICTED: ("evicted by this event", "#c7c7c7", "/"),
}
ROOT_COLOUR = "#eeeeee"
# plotly shrinks a label to fit its block (to ~6 px in three icicles side by side): below this size it is hidden
# instead (hover still names the node), so every label shown is readable
MIN_LABEL_PX = 10


def icicle_trace(frame: pd.DataFrame) -> go.Icicle:
    """An icicle of a ``tree_frame`` (or ``with_evicted``) table, root on the left and each depth a column (a leaf's
    label gets the column's width): height = ``path_tokens``, colour and hatch by status (:data:`TREE_STATUS`)."""
    _need(frame, {"id", "parent_id", "path_tokens", "label", "status", "tokens"}, "icicle_trace")
    style = [TREE_STATUS.get(s, ("root", ROOT_COLOUR, "")) for s in frame["status"]]
    return go.Icicle(
        **icicle_geometry(frame), branchvalues="total", sort=False,
        marker=dict(colors=[c for _, c, _ in style], pattern=dict(shape=[h for _, _, h in style], fgcolor="#7f7f7f")),
        customdata=[[int(t), n] for t, (n, _, _) in zip(frame["tokens"], style)],
        hovertemplate="%{label}<br>%{customdata[0]:,} tokens on this node<br>%{customdata[1]}<extra></extra>",
        tiling=dict(orientation="h"), root=dict(color=ROOT_COLOUR), leaf=dict(opacity=1.0),
    )


def radix_icicles_before_after(before: pd.DataFrame, afters: Sequence[pd.DataFrame], titles: Sequence[str],
                               height: int = 430) -> go.Figure:
    """``before`` and each of ``afters`` side by side at ONE scale: every panel is the tree before the
    eviction, with the nodes the eviction destroyed kept in place, grey and hatched
    (``tree_view.with_evicted``), so what is left is drawn at its true size, not stretched to full width.
    ``titles``: one per panel, ``before`` first. A legend names the colours."""
    if len(titles) != 1 + len(afters):
        raise ValueError(f"radix_icicles_before_after: {1 + len(afters)} panels but {len(titles)} titles")
    frames = [before] + [with_evicted(before, after) for after in afters]
    fig = make_subplots(rows=1, cols=len(frames), specs=[[{"type": "domain"}] * len(frames)], subplot_titles=list(titles))
    for col, frame in enumerate(frames, 1):
        fig.add_trace(icicle_trace(frame), row=1, col=col)
    drawn = {s for frame in frames for s in frame["status"]}
    for status, (name, colour, hatch) in TREE_STATUS.items():
        if status in drawn:  # legend entries only for what is drawn
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True,
                                     marker=dict(symbol="square", size=14, color=colour,
                                                 line=dict(color="#7f7f7f", width=1 if hatch else 0))))
    fig.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False), height=height, margin=dict(t=50, l=10, r=10, b=10), template=TEMPLATE,
                      legend=dict(orientation="h", y=-0.04), plot_bgcolor="rgba(0,0,0,0)",
                      uniformtext=dict(minsize=MIN_LABEL_PX, mode="hide"))
    return fig
