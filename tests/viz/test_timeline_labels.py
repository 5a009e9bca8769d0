"""Notebook 01's timeline labels never overlap (issue 25: at 960 px the with-gc arm's "measure" label covered
"gc.collect()" for the tiny-h100 preset).

The oracle reads the figure as plotly draws it: each annotation's anchor (``x`` on its axis' range and domain,
``xanchor``, the arrow's ``ax``; ``y`` and ``yanchor`` on the paper) and a box of the label's size, at each width
from the figure's minimum up; no two boxes of a plot may overlap and each stays inside its plot.
"""

from __future__ import annotations

from functools import cache

import pytest

from kvlab.experiments import kv_pool_sizing
from kvlab.viz import plots

WIDTHS = (plots.TIMELINES_MIN_WIDTH_PX, 700, 800, 960, 1100, 1280, 1600, 2400)
compare = cache(kv_pool_sizing.compare)  # both arms of a preset, once per module


def _boxes(fig, width: int) -> dict[str, list[tuple[float, float, float, float, str]]]:
    """xref -> (left, top, right, bottom, text, axis width) of each label on that axis, in pixels from the top left
    corner of the axis' plot."""
    layout = fig.layout
    plot_w = width - layout.margin.l - layout.margin.r
    plot_h = layout.height - layout.margin.t - layout.margin.b
    out: dict[str, list] = {}
    for a in layout.annotations:
        if a.xref == "paper":
            continue
        axis = layout[f"xaxis{a.xref[1:]}"]
        lo, hi = axis.range
        domain = axis.domain or (0, 1)
        axis_w = (domain[1] - domain[0]) * plot_w
        w, h = plots.label_size(a.text)
        x = (a.x - lo) / (hi - lo) * axis_w + (a.ax if a.showarrow else 0)
        left = {"left": x, "right": x - w, "center": x - w / 2}[a.xanchor]
        y = (1 - a.y) * plot_h + (a.ay if a.showarrow else 0)
        top = {"top": y, "bottom": y - h, "middle": y - h / 2}[a.yanchor]
        out.setdefault(a.xref, []).append((left, top, left + w, top + h, a.text, axis_w))
    return out


def _problems(fig, width: int) -> list[str]:
    problems = []
    plot_h = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    for xref, boxes in _boxes(fig, width).items():
        for i, (l1, t1, r1, b1, text, axis_w) in enumerate(boxes):
            if l1 < 0 or r1 > axis_w or t1 < 0 or b1 > plot_h:
                problems.append(f"{width}px {xref}: {text!r} outside its plot ({l1:.0f}..{r1:.0f} of {axis_w:.0f})")
            for l2, t2, r2, b2, other, _ in boxes[i + 1:]:
                if l1 < r2 and l2 < r1 and t1 < b2 and t2 < b1:
                    problems.append(f"{width}px {xref}: {text!r} overlaps {other!r}")
    return problems


@pytest.mark.parametrize("preset", sorted(kv_pool_sizing.SCENARIO_PRESETS))
def test_no_label_overlaps_another_at_any_width(preset):
    no_gc, with_gc = compare(preset)
    fig = plots.memory_timelines_side_by_side(no_gc.timeline, with_gc.timeline, ("without", "with"))
    labels = [a for a in fig.layout.annotations if a.xref != "paper"]
    assert sum(a.text.startswith("<b>measure</b>") for a in labels) == 2  # each arm's reading is labelled
    assert any(a.text.startswith("<b>gc.collect()</b>") and a.xref == "x2" for a in labels)
    assert [p for width in WIDTHS for p in _problems(fig, width)] == []


def test_the_tiny_preset_puts_measure_clear_of_gc_collect():
    """The case the issue saw: tiny-h100's with-gc arm, where the two-event measure phase sits right after a
    long gc.collect(): the measure label goes beside its band, and not over the gc label."""
    no_gc, with_gc = compare("tiny-h100")
    fig = plots.memory_timelines_side_by_side(no_gc.timeline, with_gc.timeline, ("without", "with"))
    boxes = {text.split("</b>")[0]: box for *box, text, _ in _boxes(fig, 960)["x2"] for box in [box]}
    gc, measure = boxes["<b>gc.collect()"], boxes["<b>measure"]
    assert measure[2] <= gc[0] or gc[2] <= measure[0] or measure[3] <= gc[1] or gc[3] <= measure[1]
    # what the tiny model's collection frees is MiB: said so, not "frees 0.00 GiB"
    texts = [a.text for a in fig.layout.annotations]
    assert "<b>gc.collect()</b><br>frees 1.75 MiB" in texts and not any("0.00 GiB" in t for t in texts), texts


def test_a_single_timeline_lays_its_labels_out_too():
    no_gc, _ = compare("sglang-pr-4xh200")
    fig = plots.memory_timeline(no_gc.timeline)
    assert len([a for a in fig.layout.annotations if a.xref == "x"]) == 2  # measure, the late collection
    assert [p for width in WIDTHS for p in _problems(fig, width)] == []


def test_label_size_counts_lines_and_characters_not_tags():
    w, h = plots.label_size("<b>measure</b><br>79.14 GiB free<br>pool sized here")
    assert w == len("pool sized here") * plots.LABEL_CHAR_PX + 2 * plots.LABEL_PAD_PX
    assert h == 3 * plots.LABEL_LINE_PX + 2 * plots.LABEL_PAD_PX


def test_the_waterfall_says_a_tiny_term_in_its_unit_never_minus_zero():
    """tiny-h100's weights (1.75 MiB) and what stays referenced (2.25 MiB) showed as "-0.00" beside "79.15";
    they are said in MiB, and every term signed with kvlab's minus sign."""
    from kvlab.units import MINUS
    from kvlab.viz.widgets import budget_figure

    _, with_gc = compare("tiny-h100")
    text = list(budget_figure(with_gc).data[0].text)
    assert text[:3] == ["79.15", f"{MINUS}1.75 MiB", f"{MINUS}2.25 MiB"] and text[3].startswith(MINUS)
    assert not any(t.lstrip("+-" + MINUS) == "0.00" and t != "0.00" for t in text), text
    assert plots._term_text(2, 0) == "0.00" and plots._term_text(1, 5 << 30) == "+5.00"
