"""Pure plotting functions: DataFrames and typed results in, ``plotly.graph_objects.Figure`` out."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

GIB = float(1 << 30)
SERIES = (  # column, label, colour
    ("allocated_bytes", "allocated", "#1f77b4"),
    ("reserved_bytes", "reserved", "#ff7f0e"),
    ("free_bytes", "free (driver)", "#2ca02c"),
)
PHASE_COLOURS = {
    "before load": "rgba(200,200,200,0.25)",
    "weights": "rgba(31,119,180,0.10)",
    "draft weights": "rgba(148,103,189,0.12)",
    "measure": "rgba(214,39,40,0.18)",
    "kv pool": "rgba(44,160,44,0.12)",
    "serving": "rgba(140,86,75,0.12)",
}


def phase_spans(frame: pd.DataFrame) -> list[tuple[str, int, int]]:
    """(phase, first step, last step) runs of consecutive events with the same phase label."""
    spans: list[tuple[str, int, int]] = []
    for step, phase in enumerate(frame["phase"].tolist()):
        if spans and spans[-1][0] == phase:
            spans[-1] = (phase, spans[-1][1], step)
        else:
            spans.append((phase, step, step))
    return spans


def timeline_traces(frame: pd.DataFrame, *, showlegend: bool = True) -> list[go.Scatter]:
    steps = list(range(len(frame)))
    traces = []
    for column, label, colour in SERIES:
        traces.append(
            go.Scatter(
                x=steps, y=(frame[column] / GIB).round(4).tolist(), name=label, mode="lines",
                line=dict(color=colour, width=2, shape="hv"), legendgroup=label, showlegend=showlegend,
                customdata=frame["phase"].tolist(),
                hovertemplate=f"{label}: %{{y:.2f}} GiB<br>phase: %{{customdata}}<extra></extra>",
            )
        )
    return traces


def phase_bands(frame: pd.DataFrame, xref: str = "x") -> tuple[list[dict], list[dict]]:
    """Shaded rectangles and labels for the phases of a timeline (layout shapes and annotations)."""
    shapes, labels = [], []
    spans = [span for span in phase_spans(frame) if span[0] in PHASE_COLOURS and span[2] > span[1]]
    for row, (phase, start, stop) in enumerate(spans):
        shapes.append(dict(type="rect", xref=xref, yref="paper", x0=start - 0.5, x1=stop + 0.5, y0=0, y1=1,
                           fillcolor=PHASE_COLOURS[phase], line_width=0, layer="below"))
        # labels step down in three rows so short neighbouring phases stay readable
        labels.append(dict(xref=xref, yref="paper", x=start - 0.5, y=1 - 0.06 * (row % 3), text=phase, showarrow=False,
                           xanchor="left", yanchor="top", font=dict(size=10, color="#555")))
    return shapes, labels


def _add_phase_bands(fig: go.Figure, frame: pd.DataFrame, col: int | None = None) -> None:
    shapes, labels = phase_bands(frame, "x" if not col or col == 1 else f"x{col}")
    for shape in shapes:
        fig.add_shape(shape)
    for label in labels:
        fig.add_annotation(label)


def memory_timeline(frame: pd.DataFrame, title: str = "Device memory") -> go.Figure:
    """Allocated / reserved / free across the recorded events, phases shaded."""
    fig = go.Figure(timeline_traces(frame))
    _add_phase_bands(fig, frame)
    fig.update_layout(title=title, xaxis_title="allocator event", yaxis_title="GiB", template="plotly_white",
                      legend=dict(orientation="h", y=-0.2))
    return fig


def memory_timelines_side_by_side(left: pd.DataFrame, right: pd.DataFrame, titles: tuple[str, str]) -> go.Figure:
    """Two timelines on one shared y axis: the two arms of a finding."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=titles, horizontal_spacing=0.04)
    for col, frame in ((1, left), (2, right)):
        for trace in timeline_traces(frame, showlegend=col == 1):
            fig.add_trace(trace, row=1, col=col)
        _add_phase_bands(fig, frame, col)
    fig.update_layout(template="plotly_white", height=420, legend=dict(orientation="h", y=-0.18),
                      margin=dict(t=60, l=50, r=20, b=60))
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    fig.update_xaxes(title_text="allocator event")
    return fig


def budget_waterfall(terms: list[tuple[str, int]], title: str = "KV budget") -> go.Figure:
    """Signed byte terms ending in the KV budget (the total bar)."""
    fig = go.Figure(waterfall_trace(terms))
    fig.update_layout(title=title, yaxis_title="GiB", template="plotly_white", showlegend=False)
    return fig


def waterfall_trace(terms: list[tuple[str, int]]) -> go.Waterfall:
    labels = [name for name, _ in terms] + ["KV pool budget"]
    values = [round(v / GIB, 4) for _, v in terms] + [0]
    measure = ["absolute"] + ["relative"] * (len(terms) - 1) + ["total"]
    return go.Waterfall(x=labels, y=values, measure=measure, textposition="outside",
                        text=[f"{v:+.2f}" if i else f"{v:.2f}" for i, v in enumerate(values[:-1])] + [""],
                        connector=dict(line=dict(color="#999")))
