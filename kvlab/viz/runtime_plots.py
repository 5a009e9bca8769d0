"""A server's runtime log as one figure (issue 36): KV pool use, running and queued requests, the prefix-cache hit
rate (per batch and cumulative) and throughput on a shared time axis, retractions and preemptions marked.

Every number drawn is a column of :class:`kvlab.serving.runtime.timeline.RuntimeTimeline`'s frame (the same
numbers ``kvlab explain-log`` prints); ``tests/viz/test_runtime_plots.py`` checks it.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.viz.theme import BUG_COLOUR, TEMPLATE

ROWS = ("KV pool use", "requests", "prefix-cache hit rate", "throughput (tok/s)")
EVENT_COLOUR = BUG_COLOUR


def _x(tl, rows):
    return rows[tl.time_axis]


def runtime_timeline_figure(tl, *, title: str | None = None) -> go.Figure:
    """The timeline of ``tl`` (a ``RuntimeTimeline``): one row per quantity, one trace per primary rank."""
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.05, subplot_titles=ROWS)
    frame = tl.frame
    many = len(tl.primary) > 1
    use = "used_tokens_est" if tl.pool_tokens else "usage"
    for rank in tl.primary:
        rows = frame[frame["rank"] == rank]
        name = f" {rank}" if many else ""
        used = rows.dropna(subset=[use])
        fig.add_trace(go.Scatter(x=_x(tl, used), y=used[use], name=f"tokens in use{name}" if tl.pool_tokens
                                 else f"token usage{name}", mode="lines", legendgroup="use"), row=1, col=1)
        for column, label in (("running", "running"), ("queue", "queued")):
            part = rows.dropna(subset=[column])
            fig.add_trace(go.Scatter(x=_x(tl, part), y=part[column], name=f"{label}{name}", mode="lines"),
                          row=2, col=1)
        pre = rows[rows["kind"] == "prefill"]
        fig.add_trace(go.Scatter(x=_x(tl, pre), y=pre["batch_hit_rate"], name=f"per batch{name}", mode="markers",
                                 marker=dict(size=4, opacity=0.5)), row=3, col=1)
        fig.add_trace(go.Scatter(x=_x(tl, pre), y=pre["cum_hit_rate"], name=f"cumulative{name}", mode="lines"),
                      row=3, col=1)
        printed = rows.dropna(subset=["logged_hit_rate"])
        if len(printed):  # the server's own rate (vLLM's window; SGLang 0.2-0.4's cumulative), as printed
            fig.add_trace(go.Scatter(x=_x(tl, printed), y=printed["logged_hit_rate"], name=f"as printed{name}",
                                     mode="lines", line=dict(dash="dot")), row=3, col=1)
        for column, label in (("prefill_tput", "prefill"), ("gen_tput", "decode")):
            part = rows.dropna(subset=[column])
            fig.add_trace(go.Scatter(x=_x(tl, part), y=part[column], name=f"{label}{name}", mode="lines"),
                          row=4, col=1)
    if tl.pool_tokens:
        fig.add_hline(y=tl.pool_tokens, line_dash="dot", line_color="#7f7f7f", row=1, col=1,
                      annotation_text=f"pool {tl.pool_tokens:,} tokens", annotation_position="top left")
    _mark_events(fig, tl)
    fig.update_yaxes(title_text="tokens" if tl.pool_tokens else "fraction", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=3, col=1)
    fig.update_xaxes(title_text="seconds from the first runtime line" if tl.time_axis == "t_s" else "log line",
                     row=4, col=1)
    fig.update_layout(template=TEMPLATE, height=820, title=title or f"Runtime: {tl.log.path}",
                      legend=dict(groupclick="toggleitem"), margin=dict(t=70))
    return fig


def _mark_events(fig: go.Figure, tl) -> None:
    """A vertical line through every row at each retraction / preemption, its count in the hover of a marker."""
    events = [e for e in tl.log.events if e.rank in tl.primary or e.kind == "preempt" or not tl.primary]
    if not events:
        return
    xs = [e.t if tl.time_axis == "t_s" else e.line for e in events]
    for x in sorted(set(xs)):
        fig.add_vline(x=x, line_color=EVENT_COLOUR, line_width=1, opacity=0.35)
    fig.add_trace(go.Scatter(
        x=xs, y=[tl.pool_tokens or 1.0] * len(xs), mode="markers", name="retraction / preemption",
        marker=dict(symbol="x", color=EVENT_COLOUR, size=9),
        customdata=[[e.kind, e.count, e.line] for e in events],
        hovertemplate="%{customdata[0]}: %{customdata[1]} request(s), line %{customdata[2]}<extra></extra>"),
        row=1, col=1)
