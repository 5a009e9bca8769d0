"""What a drawn panel must show, read from the DOM: shared by the Voila and JupyterLab tests.

Each check reads the figures' drawn data (``gd.data`` of the ``.js-plotly-plot``) and the numbers behind the
table beside them (its ``data-*`` attributes), asserts they agree, and that they are the CLI's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from playwright.sync_api import Page

from kvlab.experiments.shortfall_eviction import MODE_LABELS, PANEL_DEFAULTS

from . import lab

GIB = float(1 << 30)
SIM_PANEL = PANEL_DEFAULTS.cli_args()  # ShortfallPanel()'s defaults


def _cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "kvlab.cli", *args, "--json"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def pool_cli(gc: bool) -> dict:
    return _cli("repro", "kv-pool-sizing", "--preset", "sglang-pr-4xh200",
                "--gc-before-measure" if gc else "--no-gc-before-measure")


def _column(cells: list[dict], key: str, value: str) -> dict[str, float]:
    """One column of a panel's table: field -> number (empty cells left out)."""
    return {c["field"]: float(c["value"]) for c in cells if c.get(key) == value and c["value"] not in ("", "None")}


def drawn_lines(page: Page, selector: str) -> list[dict]:
    """The scatter traces of a figure, each required to draw at least two points, on axes that are not
    plotly's empty default."""
    traces = lab.wait_plotly(page, selector, timeout=120_000)
    lines = [t for t in traces if t.get("type", "scatter") == "scatter"]
    assert lines and all(len(t["x"]) >= 2 and len(t["y"]) == len(t["x"]) for t in lines), \
        [(t.get("name"), len(t.get("x") or [])) for t in lines]
    for axis, (lo, hi) in lab.plotly_axes(page, selector).items():
        if axis.startswith("x"):
            assert (lo, hi) != (-1, 1) and hi - lo > 2, f"{selector} {axis} drawn empty: {lo}..{hi}"
    return lines


def check_kv_pool_panel(page: Page, arm: str, cli: dict) -> dict:
    """The waterfall of the selected arm equals the table beside it and the CLI; returns the waterfall."""
    cells = lab.table_cells(page, "kvlab-table")
    table = _column(cells, "arm", arm)
    waterfall = lab.wait_plotly(page, ".kvlab-waterfall")[0]
    assert waterfall["type"] == "waterfall" and len(waterfall["x"]) >= 4 and waterfall["x"][-1] == "KV pool budget"
    assert waterfall["measure"][0] == "absolute" and waterfall["measure"][-1] == "total"
    assert waterfall["y"][0] == pytest.approx(table["pre_model_load_bytes"] / GIB, abs=1e-3)
    assert sum(waterfall["y"]) == pytest.approx(table["rest_bytes"] / GIB, abs=2e-3)
    assert table["rest_bytes"] == cli["rest_bytes"] and table["max_total_num_tokens"] == cli["max_total_num_tokens"]
    assert f"{cli['rest_bytes'] / GIB:,.2f} GiB" in lab.plotly_title(page, ".kvlab-waterfall")
    box = page.locator(".kvlab-verdict .kvlab-verdict-box")
    assert box.get_attribute("data-accepted") == str(cli["accepted"]).lower()
    assert int(box.get_attribute("data-max-total-num-tokens")) == cli["max_total_num_tokens"]
    return waterfall


def sim_cli(mode: str) -> dict:
    return _cli("simulate", *SIM_PANEL, "--eviction", mode)


def check_shortfall_panel(page: Page, mode: str, fix: dict, bug: dict) -> None:
    """Gauge, bars and timelines equal the table beside them, and the table equals the CLI."""
    cells = lab.table_cells(page, "kvlab-sim-table")
    tables = {m: _column(cells, "mode", m) for m in ("shortfall", "full")}
    for m, cli in (("shortfall", fix), ("full", bug)):
        for key in ("hit_rate", "prefill_tokens_computed", "evicted_tokens", "over_evicted_tokens"):
            assert tables[m][key] == pytest.approx(cli[key], abs=1e-6), (m, key)
    gauge = lab.wait_plotly(page, ".kvlab-sim-gauge")[0]
    other = "full" if mode == "shortfall" else "shortfall"
    assert gauge["value"] == pytest.approx(100 * tables[mode]["hit_rate"], abs=1e-3)
    assert gauge["delta"]["reference"] == pytest.approx(100 * tables[other]["hit_rate"], abs=1e-3)
    bars = lab.wait_plotly(page, ".kvlab-sim-bars")
    assert len(bars) == 2
    for trace, m in zip(bars, ("full", "shortfall")):  # the bug, then the fix (kvlab.units' convention)
        assert trace["name"] == MODE_LABELS[m] and len(trace["x"]) >= 3 and trace["y"] == [tables[m][k] for k in trace["customdata"]]
    lines = drawn_lines(page, ".kvlab-sim-timelines")
    assert len(lines) == 7  # per mode: evicted, pressure events, hit rate; plus full's evicted-early line
    hit = {t["name"]: t for t in lines if t.get("yaxis") == "y3"}  # the bottom row: cumulative hit rate
    assert hit[MODE_LABELS["shortfall"]]["y"][-1] == pytest.approx(fix["hit_rate"], abs=1e-4)
    assert hit[MODE_LABELS["full"]]["y"][-1] == pytest.approx(bug["hit_rate"], abs=1e-4)
    early = next(t for t in lines if "earlier than needed" in t["name"])
    assert early["y"][-1] == bug["over_evicted_tokens"]
    box = page.locator(".kvlab-sim-verdict .kvlab-sim-verdict-box")
    assert box.get_attribute("data-mode") == mode
    assert int(box.get_attribute("data-over-evicted")) == (fix if mode == "shortfall" else bug)["over_evicted_tokens"]
