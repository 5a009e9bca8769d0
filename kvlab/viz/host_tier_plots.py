"""Figures for the host tier (notebook 07): pure functions, DataFrames in, ``plotly.graph_objects.Figure`` out.

- :func:`host_tier_icicles`: two-tier trees before a pressure event and after it in each eviction mode, one row
  per scenario (write policy, host pool), coloured by residency, what the event destroyed kept grey and hatched
  (``host_tier.pressure_events()``).
- :func:`policy_bars`: each write policy's hit rate and copies on the shipped trace, per host ratio
  (``host_tier_sweep.policy_numbers()``).
- :func:`hit_rate_vs_host_size`: hit rate against host pool size, one line per write policy (and eviction mode)
  (``host_tier_sweep.hit_rate_frame``).
- :func:`host_regime_heatmap`: finding 2 with a host tier (``host_tier_sweep.regime_frame``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.mem_cache.tree_view import EVICTED, with_evicted
from kvlab.viz.eviction_plots import MODE_STYLE
from kvlab.viz.plots import RESIDENCY_COLOURS, RESIDENCY_NAMES, icicle_geometry
from kvlab.viz.theme import TEMPLATE

DESTROYED_STYLE = ("destroyed by this event (gone from both tiers)", "#c7c7c7", "/")
ROOT_COLOUR = "#eeeeee"


def _need(frame: pd.DataFrame, columns: set, what: str) -> None:
    missing = columns - set(frame.columns)
    if missing:
        raise ValueError(f"{what}: the table lacks columns {sorted(missing)}")


def residency_icicle_trace(frame: pd.DataFrame) -> go.Icicle:
    """An icicle of a two-tier ``tree_frame`` (or ``with_evicted``) table, root on the left and each depth a column
    (so a leaf's label has the column's width, not its sliver of the row's): height = ``path_tokens``, colour by
    ``residency`` (:data:`~kvlab.viz.plots.RESIDENCY_COLOURS`), destroyed nodes grey and hatched."""
    _need(frame, {"id", "parent_id", "path_tokens", "label", "status", "tokens", "residency"},
          "residency_icicle_trace")
    colours, hatches, words = [], [], []
    for status, residency in zip(frame["status"], frame["residency"]):
        if status == EVICTED:
            name, colour, hatch = DESTROYED_STYLE
        elif residency:
            name, colour, hatch = RESIDENCY_NAMES[residency], RESIDENCY_COLOURS[residency], ""
        else:
            name, colour, hatch = "root", ROOT_COLOUR, ""
        colours.append(colour)
        hatches.append(hatch)
        words.append(name)
    return go.Icicle(
        **icicle_geometry(frame), branchvalues="total", sort=False,
        marker=dict(colors=colours, pattern=dict(shape=hatches, fgcolor="#7f7f7f")),
        customdata=[[int(t), w] for t, w in zip(frame["tokens"], words)],
        hovertemplate="%{label}<br>%{customdata[0]:,} tokens on this node<br>%{customdata[1]}<extra></extra>",
        tiling=dict(orientation="h"), root=dict(color=ROOT_COLOUR), leaf=dict(opacity=1.0),
    )


ICICLE_LABEL_PX = 11  # a leaf's label at least this size, or hidden (the hover still names it)


def host_tier_icicles(rows: Sequence[tuple[str, pd.DataFrame, Sequence[pd.DataFrame]]],
                      columns: Sequence[str], height_per_row: int = 250) -> go.Figure:
    """One row per scenario: ``(row title, tree before, [tree after, ...])``, each panel the tree before the event
    at one scale with what the event destroyed kept in place, grey and hatched (``tree_view.with_evicted``).
    ``columns``: the panel titles of a row, ``before`` first, written once over the top row; each row's title is
    one line across the row, above it (titles per panel ran into each other at laptop width). Labels under
    :data:`ICICLE_LABEL_PX` are hidden rather than shrunk. A legend names the colours."""
    if not rows:
        raise ValueError("host_tier_icicles: no scenarios to draw")
    ncols = len(columns)
    for title, _before, afters in rows:
        if len(afters) + 1 != ncols:
            raise ValueError(f"host_tier_icicles: row {title!r} has {len(afters) + 1} panels but {ncols} columns")
    height = 90 + height_per_row * len(rows)
    fig = make_subplots(rows=len(rows), cols=ncols, specs=[[{"type": "domain"}] * ncols] * len(rows),
                        vertical_spacing=min(0.2, 40 / height) if len(rows) > 1 else 0.0, horizontal_spacing=0.02)
    drawn = set()
    for r, (title, before, afters) in enumerate(rows, 1):
        frames = [before] + [with_evicted(before, after) for after in afters]
        for c, frame in enumerate(frames, 1):
            fig.add_trace(residency_icicle_trace(frame), row=r, col=c)
            drawn |= {EVICTED if s == EVICTED else res for s, res in zip(frame["status"], frame["residency"])}
            domain = fig.data[-1].domain
            if r == 1:
                fig.add_annotation(text=columns[c - 1], x=sum(domain.x) / 2, y=domain.y[1], xref="paper",
                                   yref="paper", yanchor="bottom", yshift=20, showarrow=False, font_size=13)
        fig.add_annotation(text=f"<b>{title}</b>", x=0, y=domain.y[1], xref="paper", yref="paper", xanchor="left",
                           yanchor="bottom", showarrow=False, font_size=12)
    legend = [(RESIDENCY_NAMES[k], colour, "") for k, colour in RESIDENCY_COLOURS.items() if k in drawn]
    if EVICTED in drawn:
        legend.append(DESTROYED_STYLE)
    for name, colour, hatch in legend:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True,
                                 marker=dict(symbol="square", size=14, color=colour,
                                             line=dict(color="#7f7f7f", width=1 if hatch else 0))))
    fig.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False), template=TEMPLATE,
                      height=height, margin=dict(t=70, l=10, r=10, b=10),
                      uniformtext=dict(minsize=ICICLE_LABEL_PX, mode="hide"),
                      legend=dict(orientation="h", y=-0.02), plot_bgcolor="rgba(0,0,0,0)")
    return fig


POLICY_BARS = (  # column of host_tier_sweep.policy_numbers(), panel title, number format
    ("hit_rate", "hit rate (device + loaded back)", "{:.1%}"),
    ("written_gib", "written to host (GiB)", "{:,.1f}"),
    ("loaded_back_gib", "loaded back from host (GiB)", "{:,.1f}"),
    ("host_evicted_gib", "host copies evicted (GiB)", "{:,.1f}"),
)
POLICY_COLOURS = {"write_through": "#2ca02c", "write_through_selective": "#9467bd", "write_back": "#ff7f0e"}
RATIO_COLOURS = ("#9ecae1", "#3182bd", "#08519c", "#08306b")  # host ratios, light to dark


def policy_bars(frame: pd.DataFrame, title: str = "Write policies on the same requests") -> go.Figure:
    """Small multiples on a 2 × 2 grid, one per quantity (:data:`POLICY_BARS`): a horizontal bar per write policy
    (rows, labelled on the left) and host ratio (colour), the number written beside the bar, so the labels stay
    readable at laptop width. ``frame``: ``host_tier_sweep.policy_numbers()``."""
    _need(frame, {"write_policy", "host_ratio"} | {c for c, _, _ in POLICY_BARS}, "policy_bars")
    fig = make_subplots(rows=2, cols=2, subplot_titles=[t for _, t, _ in POLICY_BARS], horizontal_spacing=0.22,
                        vertical_spacing=0.2)
    policies = list(dict.fromkeys(frame["write_policy"]))
    ratios = sorted(set(frame["host_ratio"]))
    for k, ratio in enumerate(ratios):
        arm = frame[frame["host_ratio"] == ratio].set_index("write_policy")
        name = f"host ratio {ratio:g}"
        for i, (column, _t, fmt) in enumerate(POLICY_BARS):
            values = [float(arm.loc[p, column]) for p in policies]
            fig.add_trace(go.Bar(
                y=policies, x=values, orientation="h", name=name, legendgroup=name, showlegend=i == 0,
                marker_color=RATIO_COLOURS[k % len(RATIO_COLOURS)], text=[fmt.format(v) for v in values],
                textposition="outside", textfont_size=12, cliponaxis=False,
                hovertemplate=f"{name}<br>%{{y}}: %{{text}}<extra></extra>"), row=i // 2 + 1, col=i % 2 + 1)
    for i, (column, _t, _f) in enumerate(POLICY_BARS):
        top = float(frame[column].max()) or 1.0
        fig.update_xaxes(range=[0, top * 1.3], row=i // 2 + 1, col=i % 2 + 1,
                         tickformat=".0%" if column == "hit_rate" else None)
        fig.update_yaxes(autorange="reversed", row=i // 2 + 1, col=i % 2 + 1)
    fig.update_layout(title=title, template=TEMPLATE, barmode="group", height=560,
                      legend=dict(orientation="h", y=-0.12), margin=dict(t=90, l=10, r=30, b=60))
    return fig


def hit_rate_vs_host_size(frame: pd.DataFrame, title: str = "Hit rate against host pool size") -> go.Figure:
    """One line per ``series`` (a write policy, coloured by :data:`POLICY_COLOURS`) and eviction mode (dashed: the
    bug): x = ``host_gib`` (the host pool in GiB; 0 = no host tier), y = ``hit_rate``; hover names the host ratio
    and the tokens loaded back. ``frame``: one row per run with ``mode``, ``host_gib``, ``host_ratio``,
    ``hit_rate``, ``loaded_back_tokens`` (and ``series``; ``host_tier_sweep.hit_rate_frame``)."""
    _need(frame, {"mode", "host_gib", "host_ratio", "hit_rate", "loaded_back_tokens"}, "hit_rate_vs_host_size")
    fig = go.Figure()
    series = list(dict.fromkeys(frame["series"])) if "series" in frame else [None]
    for s in series:
        part = frame if s is None else frame[frame["series"] == s]
        for mode, (name, colour, dash) in MODE_STYLE.items():
            arm = part[part["mode"] == mode].sort_values("host_gib")
            if arm.empty:
                continue
            label = name if s is None else (s if part["mode"].nunique() == 1 else f"{s}, {name}")
            fig.add_trace(go.Scatter(
                x=arm["host_gib"].round(3).tolist(), y=arm["hit_rate"].round(6).tolist(), name=label,
                mode="lines+markers", line=dict(color=POLICY_COLOURS.get(s, colour), dash=dash, width=2),
                customdata=[[f"{r:g}", f"{int(t):,}"] for r, t in zip(arm["host_ratio"], arm["loaded_back_tokens"])],
                hovertemplate=(f"{label}<br>host pool %{{x:.2f}} GiB (ratio %{{customdata[0]}})<br>hit rate "
                               "%{y:.2%}<br>%{customdata[1]} tokens loaded back<extra></extra>")))
    right = float(frame["host_gib"].max()) or 1.0  # the 0 tick a little right of the axis, clear of the y's "0%"
    fig.update_xaxes(title_text="host pool (GiB; 0 = no host tier)", range=[-0.03 * right, 1.03 * right])
    fig.update_yaxes(title_text="hit rate (device + loaded back)", tickformat=".0%", rangemode="tozero")
    fig.update_layout(title=title, template=TEMPLATE, height=420, legend=dict(orientation="h", y=-0.2),
                      margin=dict(t=60, l=70, r=20, b=80))
    return fig


def host_regime_heatmap(frame: pd.DataFrame) -> go.Figure:
    """The regime map of finding 2 with a host tier (``host_tier_sweep.regime_frame``): one panel per write policy
    (the device-only runs first), a row per host ratio, a column per device pool; each cell the hit-rate points full
    eviction loses (shortfall − full). Notebook 02's ``regime_heatmap``, titled for the host tier."""
    from kvlab.viz.eviction_plots import regime_heatmap

    fig = regime_heatmap(frame, title="Hit rate lost to full eviction (the bug) with a host tier, in points")
    fig.update_xaxes(title_text="device KV pool, as a share of the trace's distinct prompt pages")
    return fig
