"""Pure plots of a snapshot replay (``kvlab.device.replay``): the recording and the model side by side, and the
what-ifs as bars."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.units import byte_unit, fmt_bytes

MAX_POINTS = 20_000  # longer traces are drawn every k-th event (the peak always kept)
# A recording logs a cudaMalloc as its own segment event just before the alloc that needed it (and an
# empty_cache's releases just before the next event); the model grows and shrinks inside that alloc. Drawn at the
# segment events, the recording would rise one event before the model, a step apart beside "EXACT": both are drawn
# at the other events only, where each is compared.
SEGMENT_EVENTS = frozenset({"segment_alloc", "segment_free", "segment_map", "segment_unmap"})


def _every(n: int, keep: int) -> list[int]:
    step = max(1, -(-n // MAX_POINTS))
    return sorted(set(range(0, n, step)) | ({keep} if 0 <= keep < n else set()) | ({n - 1} if n else set()))


def recorded_vs_modelled(result) -> go.Figure:
    """Reserved bytes after each compared event (not the recording's own segment events) as recorded (left) and as
    kvlab's model replays it (right, with the model's allocated bytes), in the unit of the largest value; the first
    divergence, if any, is a dashed line on both."""
    n = len(result.modelled_reserved)
    compared = [i for i in range(n) if result.trace[i]["action"] not in SEGMENT_EVENTS]
    peak = next((i for i in compared if i >= result.peak_event), result.peak_event)
    at = [compared[k] for k in _every(len(compared), compared.index(peak) if peak in compared else -1)]
    top = max([*result.recorded_reserved, *result.modelled_reserved, 1])
    unit, size = byte_unit(top)  # the unit of the largest value, as fmt_bytes prints it
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=("recorded", "modelled by kvlab"))
    line = dict(shape="hv")
    hover = f"%{{y:.2f}} {unit}<extra>%{{fullData.name}}</extra>"
    fig.add_trace(go.Scatter(x=at, y=[result.recorded_reserved[i] / size for i in at], name="reserved (recorded)",
                             mode="lines", line=dict(color="#ff7f0e", **line), hovertemplate=hover), row=1, col=1)
    fig.add_trace(go.Scatter(x=at, y=[result.modelled_reserved[i] / size for i in at], name="reserved (modelled)",
                             mode="lines", line=dict(color="#d62728", **line), hovertemplate=hover), row=1, col=2)
    fig.add_trace(go.Scatter(x=at, y=[result.modelled_allocated[i] / size for i in at], name="allocated (modelled)",
                             mode="lines", line=dict(color="#1f77b4", **line), hovertemplate=hover), row=1, col=2)
    first = result.first_divergence
    if first is not None:
        for col in (1, 2):
            fig.add_vline(x=first.index, line_dash="dash", line_color="#7f7f7f", row=1, col=col)
    fig.update_xaxes(title_text="trace event")
    fig.update_yaxes(title_text=unit, row=1, col=1)
    fig.update_layout(title="Reserved memory: the recording and kvlab's replay", hovermode="x unified")
    return fig


def what_if_bars(result, what_ifs) -> go.Figure:
    """Peak reserved, final reserved and peak cached (reserved − allocated) per scenario, the
    recording first; a dotted line at the capacity when one was given."""
    names = ["recorded", *(w.label for w in what_ifs)]
    series = {
        "peak reserved": [result.recorded_peak_reserved_bytes, *(w.peak_reserved_bytes for w in what_ifs)],
        "final reserved": [result.final.get("recorded_reserved_bytes", 0), *(w.final_reserved_bytes for w in what_ifs)],
        "peak cached (reserved − allocated)": [None, *(w.peak_fragmentation_bytes for w in what_ifs)],
    }
    capacity = next((w.capacity_bytes for w in what_ifs if w.capacity_bytes), None)
    unit, size = byte_unit(max([v for vs in series.values() for v in vs if v is not None] + [capacity or 1]))
    fig = go.Figure()
    for (label, values), colour in zip(series.items(), ("#ff7f0e", "#ffbb78", "#9467bd")):
        fig.add_trace(go.Bar(name=label, x=names, marker_color=colour,
                             y=[None if v is None else round(v / size, 3) for v in values],
                             hovertemplate=f"{label}: %{{y:.2f}} {unit}<extra>%{{x}}</extra>"))
    if capacity:
        fig.add_hline(y=capacity / size, line_dash="dot", annotation_text=f"capacity {fmt_bytes(capacity)}")
    fig.update_layout(barmode="group", yaxis_title=unit, title="What-ifs: the same allocations, other settings")
    return fig
