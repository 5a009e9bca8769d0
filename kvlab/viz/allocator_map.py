"""memory_viz's "Allocator State History" for one lab step of the allocator tour: the segment map
(one horizontal bar per segment, split into its blocks, coloured live / pending free / free) after
each action, on a slider, above the allocated / reserved / free-in-cache timeline.

Pure functions of a snapshot dict (torch's ``_snapshot()`` schema, read through
``kvlab.device.snapshot.read_snapshot``) and of a
:class:`kvlab.experiments.allocator_tour.StepRun`; nothing here touches an allocator.

Trace layout of :func:`block_traces`: one *group* of bar traces per segment (``meta`` holds the
segment's row label), one trace in the group per block state present in that segment, one bar
per block. ``legendgroup`` is the state, so clicking "free" in the legend hides the free
blocks of every segment at once.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.device.snapshot import read_snapshot
from kvlab.units import GiB, KiB, MiB, fmt_bytes
from kvlab.viz.snapshot_plots import STATE_STYLE
from kvlab.viz.theme import TEMPLATE

TIMELINE_SERIES = (  # column, label, colour
    ("allocated_bytes", "allocated", STATE_STYLE["active_allocated"][1]),
    ("reserved_bytes", "reserved", "#ff7f0e"),
    ("cached_free_bytes", "free in cache (reserved − allocated)", "#7f7f7f"),
)


def segment_label(pool: str, address: int, is_expandable: bool = False) -> str:
    """The row name of a segment: ``"large · 0x7f0000200000"`` (``" · expandable"`` appended)."""
    return f"{pool} · {address:#x}" + (" · expandable" if is_expandable else "")


def _size_text(nbytes: int) -> str:
    return f"{fmt_bytes(nbytes)} ({nbytes:,} B)"


def block_traces(snapshot: dict, unit_bytes: int = MiB) -> list[go.Bar]:
    """The bars of one snapshot: for each segment (in snapshot order), one ``go.Bar`` per block
    state present in it, one bar per block at its offset in the segment (in ``unit_bytes``, MiB by
    default). Hover: segment, block address, size and requested size in human units and bytes."""
    snap = read_snapshot(snapshot)
    segments = snap.segments_frame()
    blocks = snap.blocks_frame()
    traces: list[go.Bar] = []
    shown_in_legend: set[str] = set()
    for seg in segments.itertuples(index=False):
        row = segment_label(seg.segment_type, seg.address, seg.is_expandable)
        in_segment = blocks[blocks["segment_address"] == seg.address]
        seg_text = f"{row}<br>segment {_size_text(int(seg.total_size))}, allocated {fmt_bytes(int(seg.allocated_size))}"
        for state, (label, colour) in STATE_STYLE.items():
            rows = in_segment[in_segment["state"] == state]
            if rows.empty:
                continue
            custom = [
                [seg_text, f"{int(addr):#x}", _size_text(int(size)),
                 _size_text(int(req)) if state != "inactive" else "—"]
                for addr, size, req in zip(rows["address"], rows["size"], rows["requested_size"])
            ]
            traces.append(go.Bar(
                orientation="h", name=label, marker_color=colour, marker_line=dict(color="white", width=1),
                y=[row] * len(rows), x=(rows["size"] / unit_bytes).tolist(),
                base=((rows["address"] - seg.address) / unit_bytes).tolist(),
                customdata=custom, meta=row, legendgroup=label, showlegend=label not in shown_in_legend,
                hovertemplate="%{customdata[0]}<br><b>" + label + "</b> block %{customdata[1]}"
                              "<br>size %{customdata[2]}<br>requested %{customdata[3]}<extra></extra>",
            ))
            shown_in_legend.add(label)
    return traces


def block_map(snapshot: dict, title: str = "Allocator state") -> go.Figure:
    """One snapshot's segments and blocks (sizes and addresses on hover)."""
    fig = go.Figure(block_traces(snapshot))
    fig.update_layout(barmode="overlay", title=title, xaxis_title="offset in segment (MiB)", template=TEMPLATE,
                      yaxis=dict(autorange="reversed", title="segment"), legend=dict(orientation="h", y=-0.25))
    return fig


def timeline_traces(frame: pd.DataFrame) -> list[go.Scatter]:
    """Allocated, reserved and free-in-cache MiB after each allocator event of a ``StepRun.timeline``
    (one x per event); the event, the state it leads to and the driver's free memory on hover."""
    frame = frame.assign(cached_free_bytes=frame["reserved_bytes"] - frame["allocated_bytes"])
    events = list(range(len(frame)))
    custom = list(zip(frame["step"], frame["action"], (frame["free_bytes"] / GiB).round(3)))
    return [
        go.Scatter(x=events, y=(frame[column] / MiB).round(4).tolist(), name=label, mode="lines",
                   line=dict(color=colour, width=2, shape="hv", dash="dot" if column == "cached_free_bytes" else None),
                   customdata=custom, legendgroup=label,
                   hovertemplate=f"{label}: %{{y:.3f}} MiB<br>%{{customdata[1]}}, leading to: %{{customdata[0]}}"
                                 "<br>driver free: %{customdata[2]} GiB<extra></extra>")
        for column, label, colour in TIMELINE_SERIES
    ]


def _caption(i: int, n: int, state) -> str:
    return (f"{i + 1}/{n} · after {state.label} — allocated {fmt_bytes(state.allocated_bytes)}, "
            f"reserved {fmt_bytes(state.reserved_bytes)}")


def _arm_boundaries(frame: pd.DataFrame) -> list[tuple[int, str]]:
    """(first event index, arm label) of each arm of a multi-arm timeline; [] for one arm."""
    if "arm" not in frame or frame["arm"].nunique() < 2:
        return []
    arms = frame["arm"].tolist()
    return [(i, arm) for i, arm in enumerate(arms) if i == 0 or arms[i - 1] != arm]


def _active_state(run, active: int | None) -> int:
    """The index of the state the slider starts at: ``active`` checked and made non-negative."""
    states = run.states
    if active is None:
        return run.focus_index
    if not -len(states) <= active < len(states):
        raise ValueError(f"state_history(active={active!r}): run {run.key!r} has {len(states)} states "
                         f"(0..{len(states) - 1}, or negative to count from the last)")
    return range(len(states))[active]


def _add_state_bars(fig: go.Figure, states, active: int, unit_bytes: int) -> tuple[list[list[int]], float]:
    """Add every state's bars to the top row (only ``active``'s visible): each state's trace indices, and
    the widest bar end in ``unit_bytes``."""
    groups: list[list[int]] = []
    widest = 0.0
    for i, state in enumerate(states):
        first = len(fig.data)
        for trace in block_traces(state.snapshot, unit_bytes):
            trace.visible = i == active
            fig.add_trace(trace, row=1, col=1)
            widest = max([widest, *(b + x for b, x in zip(trace.base, trace.x))])
        groups.append(list(range(first, len(fig.data))))
    return groups, widest


def _slider_steps(run, title: str, groups: list[list[int]], n_bars: int, n_timeline: int) -> list[dict]:
    """One slider step per state: its bars (and the timeline) visible, its caption, its marker on the
    timeline and the arms' separators and names."""
    states = run.states
    arms = _arm_boundaries(run.timeline)
    arm_shapes = [dict(type="line", xref="x2", yref="y2 domain", x0=i - 0.5, x1=i - 0.5, y0=0, y1=1,
                       line=dict(color="#555", width=1, dash="dot")) for i, _ in arms[1:]]
    arm_notes = [dict(xref="x2", yref="y2 domain", x=i - 0.5, y=1.0, xanchor="left", yanchor="bottom",
                      showarrow=False, font=dict(size=11, color="#555"), text=f"{arm} (fresh allocator)")
                 for i, arm in arms]

    def marker(pos: int) -> list[dict]:
        return [*arm_shapes, dict(type="line", xref="x2", yref="y2 domain", x0=pos, x1=pos, y0=0, y1=1,
                                  line=dict(color="#d62728", width=1.5, dash="dash"))]

    def note(state) -> list[dict]:
        if state.snapshot["segments"]:
            return list(arm_notes)
        return [*arm_notes, dict(xref="x domain", yref="y domain", x=0.5, y=0.5, showarrow=False,
                                 font=dict(color="#555"), text="no segments: every byte is back with the driver")]

    steps = []
    for i, (state, group) in enumerate(zip(states, groups)):
        visible = [False] * n_bars + [True] * n_timeline
        for index in group:
            visible[index] = True
        steps.append(dict(method="update", label=str(i + 1),
                          args=[{"visible": visible},
                                {"title.text": f"{title}<br><sub>{_caption(i, len(states), state)}</sub>",
                                 "shapes": marker(state.timeline_index), "annotations": note(state)}]))
    return steps


def _bar_axis(view_bytes: int | None, unit_bytes: int, unit: str, widest: float) -> tuple[list[float], str]:
    """The bar row's x range and title: zoomed to ``view_bytes`` when the run sets it, else the widest bar."""
    if view_bytes is not None:
        return [0, view_bytes / unit_bytes], (f"offset in segment ({unit}) · zoomed to the first "
                                              f"{fmt_bytes(view_bytes)}; double-click to see the whole segment")
    return [0, max(widest, 1.0) * 1.02], f"offset in segment ({unit}) · blocks: live / pending free / free"


def state_history(run, title: str | None = None, active: int | None = None) -> go.Figure:
    """The segment map after every action of ``run`` (a ``StepRun``) on a slider, above the
    step's memory timeline with a dashed line at the chosen state. The slider starts at
    ``active`` (default: the run's focus state, the one its facts are read at). The bar axis
    keeps one range for all states (the largest segment, or the run's ``view_bytes`` when it sets
    one, in KiB below 1 MiB) so sizes compare across the slider.
    A run with several arms (orders, expandable off / on: each on a fresh allocator) gets a
    dotted separator and the arm's name on the timeline.

    ``fig.layout.meta["states"]`` lists, per state, the indices of its bar traces in ``fig.data``
    (the timeline traces come after all bars and are always visible)."""
    states = run.states
    active = _active_state(run, active)
    title = title or f"Allocator state history · {run.key} · {run.device_name}"
    fig = make_subplots(rows=2, cols=1, row_heights=[0.6, 0.4], vertical_spacing=0.16)
    view_bytes = getattr(run, "view_bytes", None)
    unit_bytes, unit = (KiB, "KiB") if view_bytes is not None and view_bytes < MiB else (MiB, "MiB")
    groups, widest = _add_state_bars(fig, states, active, unit_bytes)
    n_bars = len(fig.data)
    timeline = timeline_traces(run.timeline)
    for trace in timeline:
        fig.add_trace(trace, row=2, col=1)
    steps = _slider_steps(run, title, groups, n_bars, len(timeline))
    shown = steps[active]["args"][1] if steps else {"title.text": title, "shapes": [], "annotations": []}
    fig.update_layout(
        barmode="overlay", template=TEMPLATE, height=640, title=dict(text=shown["title.text"]),
        shapes=shown["shapes"], annotations=shown["annotations"], legend=dict(x=1.02, y=1, xanchor="left"),
        sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix="state "), pad=dict(t=50))],
        margin=dict(t=90, l=60, r=20, b=60), meta={"states": groups},
    )
    fig.update_yaxes(autorange="reversed", title_text="segment", row=1, col=1)
    x_range, x_title = _bar_axis(view_bytes, unit_bytes, unit, widest)
    fig.update_xaxes(title_text=x_title, row=1, col=1, range=x_range)
    # ticks at the states' marker events, numbered as on the slider
    fig.update_xaxes(title_text="allocator event (ticks: the states on the slider)", row=2, col=1,
                     tickvals=[s.timeline_index for s in states], ticktext=[str(i + 1) for i in range(len(states))])
    fig.update_yaxes(title_text="MiB", row=2, col=1)
    return fig
