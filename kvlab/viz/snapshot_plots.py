"""Pure plots of an allocator snapshot (``kvlab.device.snapshot.Snapshot``), after memory_viz's
"Active Memory Timeline" and "Allocator State History"."""

from __future__ import annotations

import plotly.graph_objects as go

from kvlab.units import MiB, byte_unit
from kvlab.viz.theme import STATE_STYLE  # normalised block state -> (legend label, colour)


def active_memory_timeline(snapshot) -> go.Figure:
    """Two step lines over trace events: allocated and reserved bytes (seeded from the segments), in the unit of
    the largest value (``kvlab.units.byte_unit``: a 74 MiB snapshot in MiB, an 80 GiB one in GiB)."""
    frame = snapshot.timeline()
    unit, size = byte_unit(max([*frame["reserved_bytes"].tolist(), *frame["allocated_bytes"].tolist(), 1]))
    fig = go.Figure()
    for column, label, colour in (("allocated_bytes", "allocated", "#1f77b4"), ("reserved_bytes", "reserved", "#ff7f0e")):
        fig.add_trace(
            go.Scatter(
                x=frame["step"].tolist(), y=(frame[column] / size).round(3).tolist(), name=label, mode="lines",
                line=dict(color=colour, shape="hv"), customdata=frame["action"].tolist(),
                hovertemplate=f"{label}: %{{y:.2f}} {unit}<br>%{{customdata}}<extra></extra>",
            )
        )
    fig.update_layout(xaxis_title="trace event", yaxis_title=unit, title="Active memory timeline")
    return fig


def segment_map(snapshot) -> go.Figure:
    """One horizontal bar per segment, split into its blocks, coloured by state (one trace per state)."""
    blocks = snapshot.blocks_frame()
    order = {addr: i for i, addr in enumerate(snapshot.segments_frame()["address"].tolist())}
    fig = go.Figure()
    for state, (label, colour) in STATE_STYLE.items():
        rows = blocks[blocks["state"] == state]
        fig.add_trace(
            go.Bar(
                orientation="h", name=label, marker_color=colour,
                y=[f"seg {order[a]} ({a:#x})" for a in rows["segment_address"]],
                x=(rows["size"] / MiB).tolist(),
                base=((rows["address"] - rows["segment_address"]) / MiB).tolist(),
                customdata=rows[["address", "size", "requested_size"]].values.tolist(),
                hovertemplate="block %{customdata[0]:#x}<br>%{customdata[1]} B (requested %{customdata[2]} B)"
                f"<extra>{label}</extra>",
            )
        )
    fig.update_layout(barmode="overlay", xaxis_title="offset in segment (MiB)", title="Allocator state")
    return fig
