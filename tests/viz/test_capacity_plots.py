"""Notebook 06's panel headless: the regime map draws the loss table's numbers, the curve the hit-rate table's,
and the max-running menu redraws both curve and table."""

from __future__ import annotations

import re

import pytest

from kvlab.experiments import capacity
from kvlab.viz.capacity_plots import CapacityPanel, loss_heatmap
from tests.conftest import REPO_ROOT

TINY = REPO_ROOT / "data" / "traces" / "mooncake_tiny.jsonl"


@pytest.fixture(scope="module")
def result():
    return capacity.run(TINY, pool_pages=[7, 12, 30], max_running=[1, 256], workers=1, progress=False)


def _cells(html: str, field: str) -> dict:
    found = re.findall(r"data-field='" + field + r"' ((?:data-[a-z]+='[^']*' )+)data-value='([^']*)'", html)
    return {tuple(re.findall(r"='([^']*)'", keys)): float(value) for keys, value in found}


def test_map_draws_the_loss_table(result):
    panel = CapacityPanel(result)
    heat = panel.map.data[0]
    assert heat.type == "heatmap" and list(heat.x) == ["7", "12", "30"] and list(heat.y) == ["1", "256"]
    table = _cells(panel.loss.value, "loss_points")
    assert len(table) == 6
    for i, running in enumerate((1, 256)):
        for j, pages in enumerate((7, 12, 30)):
            assert heat.z[i][j] == table[(str(running), str(pages))] == result.loss_points().loc[running, pages]
    assert heat.text[0][0] == "+6.83" and heat.zmid == 0
    assert "costs up to 6.83 points" in panel.verdict.value


def test_menu_redraws_the_curve_and_its_table(result):
    panel = CapacityPanel(result)
    assert panel.running.value == 256 and "max running 256" in panel.curve.figure.layout.title.text
    panel.running.value = 1
    assert "max running 1" in panel.curve.figure.layout.title.text
    hits = _cells(panel.hits.value, "hit_rate")
    lines = {t.legendgroup: t for t in panel.curve.data if t.yaxis in ("y", None)}
    for mode in ("shortfall", "full"):
        assert list(lines[mode].x) == [7, 12, 30]
        assert list(lines[mode].y) == [hits[(str(p), mode)] for p in (7, 12, 30)]
        assert list(lines[mode].y) == result.hit_rates(1)[mode].tolist()


def test_an_all_zero_map_stays_pale():
    import pandas as pd

    fig = loss_heatmap(pd.DataFrame([[0.0, 0.0]], index=[4], columns=[10, 20]))
    assert (fig.data[0].zmin, fig.data[0].zmax) == (-0.5, 0.5)  # white, not a full-strength colour for 0


def test_log_axis_ticks_are_1_2_5_or_decades():
    from kvlab.viz.capacity_plots import log_ticks

    assert log_ticks(64, 4096) == [100, 200, 500, 1000, 2000]
    assert log_ticks(8, 100_000) == [10, 100, 1000, 10_000, 100_000]  # 1-2-5 would crowd: decades
    assert log_ticks(7, 30) == [10, 20]
    with pytest.raises(ValueError, match="positive"):
        log_ticks(0, 10)


def test_the_curve_labels_its_log_axis_with_clean_ticks(result):
    fig = CapacityPanel(result).curve.figure
    assert list(fig.layout.xaxis2.tickvals) == [10, 20] and list(fig.layout.xaxis2.ticktext) == ["10", "20"]


def test_the_colour_bar_covers_every_cell():
    import pandas as pd

    fig = loss_heatmap(pd.DataFrame([[0.58, -0.1]], index=[4], columns=[10, 20]))
    heat = fig.data[0]
    assert (heat.zmin, heat.zmax) == (-0.6, 0.6)  # not ±0.5 under a 0.58 cell
    assert heat.colorbar.tickvals[-1] == 0.6 and heat.colorbar.ticktext[-1] == "+0.60"
