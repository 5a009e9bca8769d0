"""Pure plotting functions: DataFrames and typed results in, ``plotly.graph_objects.Figure`` out."""

from __future__ import annotations

import re
from typing import NamedTuple

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.units import GiB, fmt_bytes, fmt_signed_bytes, is_zero_text, with_sign
from kvlab.viz.theme import TEMPLATE

SERIES = (  # column, label, colour
    ("allocated_bytes", "allocated", "#1f77b4"),
    ("reserved_bytes", "reserved", "#ff7f0e"),
    ("free_bytes", "free (driver)", "#2ca02c"),
)
PHASE_COLOURS = {
    "before load": "rgba(200,200,200,0.25)",
    "weights": "rgba(31,119,180,0.10)",
    "draft weights": "rgba(148,103,189,0.14)",
    "gc.collect()": "rgba(255,187,0,0.28)",
    "measure": "rgba(214,39,40,0.18)",
    "kv pool": "rgba(44,160,44,0.12)",
    "serving": "rgba(140,86,75,0.12)",
}
PHASE_MEANING = {  # what the phase legend says of each band
    "weights": "loading weights",
    "draft weights": "draft model",
    "gc.collect()": "gc.collect()",
    "measure": "free memory read",
    "kv pool": "KV pool allocated",
    "serving": "serving",
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


TRACES_PER_TIMELINE = len(SERIES) + 1  # + the dashed weights reference line


def weights_line(n_steps: int, weights_bytes: int | None) -> tuple[list, list]:
    """x, y of the dashed reference at the parameters' size: allocated above it is temporaries."""
    if weights_bytes is None or n_steps == 0:
        return [], []
    return [0, n_steps - 1], [round(weights_bytes / GiB, 4)] * 2


def timeline_traces(frame: pd.DataFrame, *, weights_bytes: int | None = None, showlegend: bool = True) -> list[go.Scatter]:
    """allocated / reserved / free step lines, plus a dashed line at the weights' size."""
    steps = list(range(len(frame)))
    traces = []
    for column, label, colour in SERIES:
        traces.append(
            go.Scatter(
                x=steps, y=(frame[column] / GiB).round(4).tolist(), name=label, mode="lines",
                line=dict(color=colour, width=2, shape="hv"), legendgroup=label, showlegend=showlegend,
                customdata=frame["phase"].tolist(),
                hovertemplate=f"{label}: %{{y:.2f}} GiB<br>phase: %{{customdata}}<extra></extra>",
            )
        )
    x, y = weights_line(len(frame), weights_bytes)
    traces.append(go.Scatter(x=x, y=y, name="weights (parameters)", mode="lines", legendgroup="weights",
                             showlegend=showlegend, line=dict(color="#7f7f7f", width=1.5, dash="dash"),
                             hovertemplate="parameters: %{y:.2f} GiB — allocated above this is temporaries<extra></extra>"))
    return traces


NARROW_SPAN = 0.05  # a band narrower than this share of the events gets its label beside it, with an arrow

# The timelines' labels are laid out in pixels at the narrowest the figure is drawn (TIMELINES_MIN_WIDTH_PX, the
# panels' CSS min-width): a label is a box of fixed size anchored at a point that moves with the width, so two
# labels that do not overlap there, in the order of their anchors, never overlap at any wider width.
TIMELINES_MIN_WIDTH_PX = 640
LABEL_FONT_PX = 11
LABEL_CHAR_PX = 7.0  # at least the advance of any character of the labels at 11 px, bold included
LABEL_LINE_PX = 15.0
LABEL_PAD_PX = 4.0  # around the text: plotly's borderpad and a little air
ARROW_GAP_PX = 30  # from a narrow band to the label beside it
EDGE_PX = 6  # the top and bottom rows keep this far from the plot's edge


class LabelBox(NamedTuple):
    """Where a label sits in its plot at a given width: pixels from the plot area's left and top edges."""

    left: float
    top: float
    width: float
    height: float
    anchor: float  # the share of the plot's width its position follows (0 left edge, 1 right edge)

    def overlaps(self, other: LabelBox) -> bool:
        return (self.left < other.left + other.width and other.left < self.left + self.width
                and self.top < other.top + other.height and other.top < self.top + self.height)


def label_size(text: str) -> tuple[float, float]:
    """A label's box in pixels (width, height), from its lines (``<br>``) and their characters, tags left out."""
    lines = [re.sub(r"<[^>]*>", "", line) for line in text.split("<br>")]
    return (max(len(line) for line in lines) * LABEL_CHAR_PX + 2 * LABEL_PAD_PX,
            len(lines) * LABEL_LINE_PX + 2 * LABEL_PAD_PX)


def _label_candidates(start: int, stop: int, n: int, size: tuple[float, float], plot: tuple[float, float]):
    """Each place a moment's label may go, in order of preference: (anchor share, pixel offset of the box's left
    edge from the anchor, box top in pixels, how plotly anchors it). Over a wide band: centred on it, then aligned
    to either edge; beside a narrow one: an arrow from its left, then from its right. Rows: top, below the top
    row, bottom."""
    width, height = size
    frac = lambda x: (x + 0.5) / n  # noqa: E731  (the x range is [-0.5, n - 0.5])
    centre = (start + stop) / 2
    if (stop - start + 1) / n < NARROW_SPAN:
        across = [(frac(centre), -ARROW_GAP_PX - width, dict(x=centre, xanchor="right", ax=-ARROW_GAP_PX)),
                  (frac(centre), ARROW_GAP_PX, dict(x=centre, xanchor="left", ax=ARROW_GAP_PX))]
    else:
        across = [(frac(centre), -width / 2, dict(x=centre, xanchor="center")),
                  (frac(start - 0.5), 0.0, dict(x=start - 0.5, xanchor="left")),
                  (frac(stop + 0.5), -width, dict(x=stop + 0.5, xanchor="right"))]
    rows = (EDGE_PX, EDGE_PX + 4 * LABEL_LINE_PX + 2 * LABEL_PAD_PX + 4, plot[1] - EDGE_PX - height)
    return [(a, off, top, spec) for top in rows for a, off, spec in across]


def layout_labels(moments: list[tuple[int, int, str]], n: int, plot: tuple[float, float]):
    """Place each moment's label (``(start, stop, text)``, in event numbers) in a plot ``plot`` = (width, height)
    pixels wide and high: the first candidate (:func:`_label_candidates`) inside the plot that overlaps no label
    placed before it, with the labels' left-to-right order that of their anchors (so no wider drawing can make them
    cross); where none fits, the one overlapping least. Returns ``(box, plotly spec)`` per moment."""
    placed: list[LabelBox] = []
    out = []
    for start, stop, text in sorted(moments):
        size = label_size(text)
        best = None
        for anchor, offset, top, spec in _label_candidates(start, stop, n, size, plot):
            box = LabelBox(anchor * plot[0] + offset, top, size[0], size[1], anchor)
            outside = max(0.0, -box.left) + max(0.0, box.left + box.width - plot[0]) + max(0.0, -box.top)
            clash = sum(1 for other in placed if box.overlaps(other) or (
                box.top < other.top + other.height and other.top < box.top + box.height
                and (box.left < other.left) != (box.anchor < other.anchor) and box.anchor != other.anchor))
            cost = (outside > 0) + clash
            if best is None or cost < best[0]:
                best = (cost, box, spec)
            if cost == 0:
                break
        placed.append(best[1])
        out.append((best[1], {**best[2], "y": 1 - (best[1].top + best[1].height / 2) / plot[1]}))
    return out


def late_collection(frame: pd.DataFrame) -> tuple[int, int, int] | None:
    """(first step, last step, bytes freed) of the collection that runs while serving — the arm that did not
    collect before measuring frees the loader's temporaries only then, after the pool was sized — or None when
    allocated memory never falls during ``serving``."""
    serving = [span for span in phase_spans(frame) if span[0] == "serving"]
    if not serving or not len(frame):
        return None
    _, start, stop = serving[0]
    allocated = frame["allocated_bytes"].tolist()
    falls = [i for i in range(start, stop + 1) if allocated[i] < allocated[i - 1]] if start else []
    if not falls:
        return None
    freed = allocated[falls[0] - 1] - min(allocated[falls[0]:stop + 1])
    return falls[0], falls[-1], freed


def phase_bands(frame: pd.DataFrame, xref: str = "x", plot: tuple[float, float] = (480.0, 240.0)
                ) -> tuple[list[dict], list[dict]]:
    """Shaded rectangles for the phases of a timeline, and labels for the moments the finding turns on.

    Every phase is shaded (its colour is named by :func:`phase_legend`); three moments get a label on the plot:
    ``gc.collect()`` before measuring with the memory it freed (allocated bytes at its start minus at its end, in
    the unit its size calls for: 1.75 MiB, not 0.00 GiB),
    the post-load ``measure`` (where the pool is sized, with the free memory read), and a late collection while
    serving (:func:`late_collection`: what it frees sits idle, the pool was sized before it). The labels are laid
    out by :func:`layout_labels` for a plot ``plot`` = (width, height) pixels at its narrowest: none overlaps
    another there or at any wider width; a band narrower than ``NARROW_SPAN`` of the events is labelled beside it
    with an arrow (and a dotted line down the band), not over its neighbours.
    """
    shapes, moments = [], []  # moments: (start, stop, text)
    spans = [span for span in phase_spans(frame) if span[0] in PHASE_COLOURS and span[2] > span[1]]
    allocated = frame["allocated_bytes"].tolist() if len(frame) else []
    free = frame["free_bytes"].tolist() if "free_bytes" in frame and len(frame) else []
    measures = [span for span in spans if span[0] == "measure"]
    for phase, start, stop in spans:
        shapes.append(dict(type="rect", xref=xref, yref="paper", x0=start - 0.5, x1=stop + 0.5, y0=0, y1=1,
                           fillcolor=PHASE_COLOURS[phase], line_width=0, layer="below"))
        if phase == "gc.collect()":
            freed = allocated[max(start - 1, 0)] - allocated[stop]
            moments.append((start, stop, f"<b>gc.collect()</b><br>frees {fmt_bytes(freed)}"))
        elif measures and (phase, start, stop) == measures[-1]:
            read = f"<br>{free[stop] / GiB:,.2f} GiB free" if free else ""
            moments.append((start, stop, f"<b>measure</b>{read}<br>pool sized here"))
    late = late_collection(frame) if len(frame) else None
    if late is not None:
        start, stop, freed = late  # inside the serving band: labelled, not shaded again
        idle = f",<br>{free[-1] / GiB:,.2f} GiB left idle" if free else ""
        moments.append((start, stop, f"<b>serving: gc runs late</b><br>frees {fmt_bytes(freed)} after<br>"
                                     f"the pool was sized{idle}"))
    labels = []
    for (*_, text), (_, spec) in zip(sorted(moments), layout_labels(moments, max(len(frame), 1), plot)):
        label = dict(xref=xref, yref="paper", text=text, showarrow=False, yanchor="middle", align="center",
                     font=dict(size=LABEL_FONT_PX, color="#333"), bgcolor="rgba(255,255,255,0.85)", **spec)
        if "ax" in spec:  # beside a narrow band: an arrow at the band's middle, a dotted line down it
            shapes.append(dict(type="line", xref=xref, yref="paper", x0=spec["x"], x1=spec["x"], y0=0, y1=spec["y"],
                               line=dict(color="#333", width=1, dash="dot")))
            label.update(showarrow=True, arrowhead=2, arrowwidth=1.5, arrowcolor="#333", ay=0)
        labels.append(label)
    return shapes, labels


def phase_legend(frames: list[pd.DataFrame], y: float = -0.34) -> dict:
    """One annotation under the plot naming each phase colour that appears in ``frames``."""
    seen = {span[0] for frame in frames for span in phase_spans(frame) if span[2] > span[1]}
    items = [f'<span style="color:{PHASE_COLOURS[p].rsplit(",", 1)[0].replace("rgba", "rgb")})">■</span> '
             f"{PHASE_MEANING[p]}" for p in PHASE_MEANING if p in seen]
    return dict(xref="paper", yref="paper", x=0, y=y, xanchor="left", yanchor="top", showarrow=False,
                text="phases: " + " &nbsp; ".join(items), font=dict(size=12, color="#444"))


def _add_phase_bands(fig: go.Figure, frame: pd.DataFrame, plot: tuple[float, float], col: int | None = None) -> None:
    """The phase bands and labels of one timeline, and its x range fixed to the bands' ([-0.5, n - 0.5]: the range
    :func:`layout_labels` assumes)."""
    xref = "x" if not col or col == 1 else f"x{col}"
    shapes, labels = phase_bands(frame, xref, plot)
    for shape in shapes:
        fig.add_shape(shape)
    for label in labels:
        fig.add_annotation(label)
    fig.update_xaxes(range=[-0.5, max(len(frame), 1) - 0.5], row=1 if col else None, col=col)


TIMELINE_HEIGHT_PX = 450
TIMELINE_MARGIN = dict(t=60, l=60, r=20, b=110)
TIMELINES_HEIGHT_PX = 470  # two side by side
TIMELINES_MARGIN = dict(t=60, l=50, r=20, b=115)
TIMELINES_SPACING = 0.04


def _plot_px(width: int, height: int, margin: dict, share: float = 1.0) -> tuple[float, float]:
    """(width, height) in pixels of a plot area: ``share`` of the figure's width within its margins."""
    return share * (width - margin["l"] - margin["r"]), height - margin["t"] - margin["b"]


def memory_timeline(frame: pd.DataFrame, title: str = "Device memory", weights_bytes: int | None = None) -> go.Figure:
    """Allocated / reserved / free across the recorded events, phases shaded."""
    fig = go.Figure(timeline_traces(frame, weights_bytes=weights_bytes))
    _add_phase_bands(fig, frame, _plot_px(TIMELINES_MIN_WIDTH_PX, TIMELINE_HEIGHT_PX, TIMELINE_MARGIN))
    fig.add_annotation(phase_legend([frame]))
    fig.update_layout(title=title, xaxis_title="allocator event", yaxis_title="GiB", template=TEMPLATE,
                      legend=dict(orientation="h", y=-0.2), height=TIMELINE_HEIGHT_PX, margin=TIMELINE_MARGIN)
    return fig


def memory_timelines_side_by_side(left: pd.DataFrame, right: pd.DataFrame, titles: tuple[str, str],
                                  weights_bytes: tuple[int | None, int | None] = (None, None)) -> go.Figure:
    """Two timelines on one shared y axis: the two arms of a finding. Drawn at any width from
    ``TIMELINES_MIN_WIDTH_PX`` up (the panels' CSS min-width), no two labels overlap."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=titles, horizontal_spacing=TIMELINES_SPACING)
    plot = _plot_px(TIMELINES_MIN_WIDTH_PX, TIMELINES_HEIGHT_PX, TIMELINES_MARGIN, (1 - TIMELINES_SPACING) / 2)
    for col, frame, weights in ((1, left, weights_bytes[0]), (2, right, weights_bytes[1])):
        for trace in timeline_traces(frame, weights_bytes=weights, showlegend=col == 1):
            fig.add_trace(trace, row=1, col=col)
        _add_phase_bands(fig, frame, plot, col)
    fig.add_annotation(phase_legend([left, right], y=-0.25))
    fig.update_layout(template=TEMPLATE, height=TIMELINES_HEIGHT_PX, legend=dict(orientation="h", y=-0.15),
                      margin=TIMELINES_MARGIN)
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    fig.update_xaxes(title_text="allocator event")
    return fig


def budget_waterfall(terms: list[tuple[str, int]], title: str = "KV budget") -> go.Figure:
    """Signed byte terms ending in the KV budget (the total bar)."""
    fig = go.Figure(waterfall_trace(terms))
    fig.update_layout(title=title, yaxis_title="GiB", template=TEMPLATE, showlegend=False)
    return fig


def waterfall_trace(terms: list[tuple[str, int]]) -> go.Waterfall:
    labels = [name for name, _ in terms] + ["KV pool budget"]
    values = [round(v / GiB, 4) for _, v in terms] + [0]
    measure = ["absolute"] + ["relative"] * (len(terms) - 1) + ["total"]
    total = round(sum(values), 4)
    return go.Waterfall(x=labels, y=values, measure=measure, textposition="outside",
                        text=[_term_text(i, v) for i, (_, v) in enumerate(terms)] + [f"{total:.2f}"],
                        connector=dict(line=dict(color="#999")))


def _term_text(i: int, n_bytes: int) -> str:
    """A waterfall bar's number, in GiB like its axis, signed as kvlab signs (``+25.69``, ``−33.32``); a term too
    small to show in GiB in the unit its size calls for (``−1.75 MiB``), and a zero as ``0.00``: never ``-0.00``."""
    text = f"{abs(n_bytes) / GiB:.2f}"
    if i == 0:
        return text
    if is_zero_text(text):
        return "0.00" if n_bytes == 0 else fmt_signed_bytes(n_bytes)
    return with_sign(text, n_bytes)


# ---- finding 2: totals and the big number ------------------------------------------------------
TOTALS_WORDS = {"prefill_tokens_computed": "prefill tokens<br>computed", "evicted_tokens": "tokens<br>evicted",
                "over_evicted_tokens": "evicted beyond<br>the shortfall"}


def totals_bars(totals: dict[str, dict], keys: tuple[str, ...] = ("prefill_tokens_computed", "evicted_tokens",
                                                                   "over_evicted_tokens")) -> go.Figure:
    """Grouped bars of a few totals per arm (``totals``: arm name -> totals dict). Bars are labelled in words;
    each bar's ``customdata`` is the totals key it shows."""
    words = [TOTALS_WORDS.get(k, k.replace("_", " ")) for k in keys]
    fig = go.Figure([go.Bar(name=arm, x=words, y=[t[k] for k in keys], customdata=list(keys),
                            hovertemplate=f"{arm}: %{{y:,}} tokens<extra></extra>") for arm, t in totals.items()])
    fig.update_layout(barmode="group", template=TEMPLATE, height=340, yaxis_title="tokens",
                      yaxis=dict(rangemode="tozero"), margin=dict(t=40, l=60, r=20, b=40))
    return fig


def hit_rate_indicator(hit_rate: float, reference: float, title: str = "hit rate") -> go.Figure:
    """The big number: ``hit_rate`` (0..1) in percent, with its difference from ``reference`` in points; when
    the two round to the same 0.01 point there is no delta to draw, and the figure says so in words."""
    same = round(100 * hit_rate, 2) == round(100 * reference, 2)
    fig = go.Figure(go.Indicator(
        mode="number" if same else "number+delta", value=round(100 * hit_rate, 4),
        number=dict(suffix=" %", valueformat=".2f"),
        delta=dict(reference=round(100 * reference, 4), valueformat=".2f", suffix=" pts"),
        title=dict(text=f"{title}<br><span style='font-size:0.8em'>the same in both modes</span>" if same else title)))
    fig.update_layout(height=200, width=300, margin=dict(t=40, b=10, l=10, r=10))
    return fig


# ---- radix tree -------------------------------------------------------------------------------
TREE_COLOURS = {"root": "#dddddd", "locked": "#d62728", "evictable": "#2ca02c", "internal": "#1f77b4"}
TREE_HOVER = ("<b>%{label}</b><br>key %{customdata[6]}<br>%{customdata[0]:,} tokens "
              "(%{customdata[5]:,} from the root)<br>%{customdata[1]}, lock_ref %{customdata[2]}<br>"
              "last access %{customdata[3]}, hits %{customdata[4]}%{customdata[7]}<extra></extra>")
_TREE_CUSTOM = ["tokens", "status", "lock_ref", "last_access_time", "hit_count", "prefix_tokens", "preview"]
# Two-tier trees (HiRadixCache): colour by where a node's KV lives; a locked node gets a red outline instead.
RESIDENCY_COLOURS = {"device": "#2ca02c", "both": "#1f77b4", "host": "#ff7f0e"}
RESIDENCY_NAMES = {"device": "device only (L1)", "both": "device and host (L1 + L2)", "host": "host only (L2)"}
LOCKED_OUTLINE = dict(width=3, color="#d62728")
# Hybrid trees: a node holding a Mamba state is outlined; a tombstone (Mamba state or SWA KV gone) is hatched.
STATE_OUTLINE = dict(width=3, color="#222222")
TOMBSTONE_PATTERN = "/"


def _state_text(row) -> str:
    state = row.get("state", "") if hasattr(row, "get") else ""
    if not state:
        return ""
    slot = row.get("mamba_slot")
    slot_text = f" in slot {int(slot)}" if slot is not None and not pd.isna(slot) else ""
    return f"<br>{state}{slot_text}"


def icicle_geometry(frame: pd.DataFrame) -> dict[str, list]:
    """``ids``, ``parents``, ``values`` (a node's ``path_tokens``, so children fill their parent) and ``labels``
    of a ``tree_frame`` table: the tree's shape, whatever colours a drawing then gives it."""
    return dict(
        ids=frame["id"].astype(str).tolist(),
        parents=["" if p is None or pd.isna(p) else str(int(p)) for p in frame["parent_id"]],
        values=[int(v) for v in frame["path_tokens"]],
        labels=frame["label"].astype(str).tolist(),
    )


def icicle_arrays(frame: pd.DataFrame) -> dict[str, list]:
    """The icicle's per-node arrays from a ``tree_frame`` table (the key preview from ``key_preview``, else
    ``preview``, else the label). On a hybrid tree (a non-empty ``state`` column) nodes holding a state get
    an outline and tombstones a hatch, and the hover names the state (and its Mamba slot). On a two-tier tree (a
    non-empty ``residency`` column) the colour is the residency (:data:`RESIDENCY_COLOURS`), a locked node is
    outlined red, and the hover names the residency."""
    preview = frame["key_preview"] if "key_preview" in frame else frame["preview"] if "preview" in frame \
        else frame["label"]
    custom = frame.assign(preview=preview)[_TREE_CUSTOM]
    records = frame.to_dict("records")
    states = [r.get("state", "") or "" for r in records]
    out = dict(
        **icicle_geometry(frame),
        colors=[TREE_COLOURS.get(s, "#bbbbbb") for s in frame["status"]],
        customdata=[[int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), str(r[6]), _state_text(rec)]
                    for r, rec in zip(custom.itertuples(index=False), records)],
    )
    residency = [r.get("residency", "") or "" for r in records]
    if any(residency):
        out["colors"] = [RESIDENCY_COLOURS.get(r, TREE_COLOURS["root"]) for r in residency]
        locked = [s == "locked" for s in frame["status"]]
        out["line_widths"] = [LOCKED_OUTLINE["width"] if k else 0.5 for k in locked]
        out["line_colors"] = [LOCKED_OUTLINE["color"] if k else "#ffffff" for k in locked]
        out["patterns"] = [""] * len(records)
        for row, r in zip(out["customdata"], residency):
            if r:
                row[7] = f"<br>{RESIDENCY_NAMES[r]}"
    if any(states):
        has_state = [bool(r.get("has_state", False)) for r in records]
        out["line_widths"] = [STATE_OUTLINE["width"] if h else 0.5 for h in has_state]
        out["line_colors"] = [STATE_OUTLINE["color"] if h else "#ffffff" for h in has_state]
        out["patterns"] = [TOMBSTONE_PATTERN if "tombstone" in st else "" for st in states]
    return out


def radix_icicle_trace(frame: pd.DataFrame) -> go.Icicle:
    """One icicle: a node's width is the tokens of the cached sequences through it (children fill their
    parent), colour by locked / evictable leaf / internal; hover gives the node's own tokens, key, lock,
    last access and hits, and on a hybrid tree its state (outlined: holds a state; hatched: tombstone)."""
    a = icicle_arrays(frame)
    marker = dict(colors=a["colors"])
    if "line_widths" in a:
        marker.update(line=dict(width=a["line_widths"], color=a["line_colors"]),
                      pattern=dict(shape=a["patterns"], fillmode="overlay", fgcolor="rgba(255,255,255,0.75)",
                                   size=8, solidity=0.3))
    return go.Icicle(ids=a["ids"], parents=a["parents"], values=a["values"], labels=a["labels"],
                     marker=marker, customdata=a["customdata"], branchvalues="total",
                     hovertemplate=TREE_HOVER, tiling=dict(orientation="v"), root=dict(color="#eeeeee"),
                     leaf=dict(opacity=1.0), sort=False)


def radix_icicle(frame: pd.DataFrame, title: str = "Radix cache", height: int = 360) -> go.Figure:
    fig = go.Figure(radix_icicle_trace(frame))
    # uirevision: a redraw of the same tree keeps the node a viewer zoomed into
    fig.update_layout(title=title, margin=dict(t=40, l=10, r=10, b=10), height=height, uirevision="kvlab-tree")
    return fig


def radix_icicles_side_by_side(frames: list[pd.DataFrame], titles: list[str]) -> go.Figure:
    """Several trees next to each other (e.g. before and after an eviction in each mode)."""
    fig = make_subplots(rows=1, cols=len(frames), specs=[[{"type": "domain"}] * len(frames)], subplot_titles=titles)
    for col, frame in enumerate(frames, 1):
        fig.add_trace(radix_icicle_trace(frame), row=1, col=col)
    fig.update_layout(height=420, margin=dict(t=50, l=10, r=10, b=10))
    return fig
