"""One convention on every surface (issue 25 item 5): the bug's column, then the fix's, then the difference
fix − bug, with the same sign for the same number: notebook 01's and 02's tables, the report's headline
tables and summary.json, and ``kvlab simulate --compare`` / ``kvlab repro kv-pool-sizing --compare``."""

import json

import pytest

from kvlab import cli
from kvlab.experiments import kv_pool_sizing
from kvlab.experiments import shortfall_eviction as se
from kvlab.units import DIFFERENCE_HEADER, MINUS

PR = "sglang-pr-4xh200"
pytestmark = pytest.mark.slow  # both CLI comparisons, both notebooks' tables and the report's summary: ~10 s


def _sign(text: str) -> int:
    """+1, -1 or 0 from a shown difference ("+17,792", "−17,792 tokens", "", "0.00 points")."""
    text = text.strip()
    assert "-" not in text[:1], f"an ASCII minus where the convention prints {MINUS}: {text!r}"
    return 1 if text.startswith("+") else -1 if text.startswith(MINUS) else 0


def _value(text: str) -> float:
    head = text.strip().split()[0].replace(",", "").replace(MINUS, "-").replace("+", "")
    return float(head)


def _header_order(header: str) -> list[int]:
    return [header.index(word) for word in ("(the bug)", "(the fix)", DIFFERENCE_HEADER)]


@pytest.fixture(scope="module")
def panel():
    return se.panel_comparison(progress=False)


@pytest.fixture(scope="module")
def pool_arms():
    return kv_pool_sizing.compare(PR)


@pytest.fixture(scope="module")
def simulate_cli():
    """``kvlab simulate --compare`` at notebook 02's setting: (text lines, --json)."""
    import contextlib
    import io

    out = {}
    for flag in ("text", "--json"):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert cli.main(["simulate", *se.PANEL_DEFAULTS.cli_args(), "--compare",
                             *([flag] if flag != "text" else [])]) == 0
        out[flag] = buffer.getvalue()
    return out["text"].splitlines(), json.loads(out["--json"])


@pytest.fixture(scope="module")
def pool_cli():
    import contextlib
    import io

    out = {}
    for flag in ("text", "--json"):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert cli.main(["repro", "kv-pool-sizing", "--preset", PR, "--compare",
                             *([flag] if flag != "text" else [])]) == 0
        out[flag] = buffer.getvalue()
    return out["text"].splitlines(), json.loads(out["--json"])


@pytest.fixture(scope="module")
def summary():
    from kvlab.report import compute_summary

    return compute_summary()[0]


def _cli_row(lines: list[str], key: str) -> list[str]:
    """A compare row's cells, split on the column gaps (two or more spaces)."""
    import re

    row = next(line for line in lines if line.split() and line.split()[0] == key)
    return re.split(r"\s{2,}", row.strip())


def test_every_surface_orders_bug_fix_difference(panel, pool_arms, simulate_cli, pool_cli, summary):
    from kvlab.report import headlines

    nb02, nb01 = panel.summary_frame(), kv_pool_sizing.summary_frame(*pool_arms)
    for frame in (nb02, nb01):
        assert _header_order(" | ".join(frame.columns)) == sorted(_header_order(" | ".join(frame.columns)))
        assert frame.columns[2] == DIFFERENCE_HEADER
    for lines, data in (simulate_cli, pool_cli):
        order = _header_order(lines[1])
        assert order == sorted(order), lines[1]
        keys = list(data)
        assert keys[2] == "difference" and data["difference"]["of"] == f"{keys[1]} - {keys[0]}"
    assert list(summary["finding1_kv_pool_sizing"])[-3:] == ["without_gc", "with_gc", "difference"]
    assert list(summary["finding2_shortfall_eviction"])[-3:] == ["full", "shortfall", "difference"]
    for table in [t for t in headlines(summary) if t.title.startswith("Finding")]:  # (HiCache's: without | with)
        assert "(the bug)" in table.arms[0] and "(the fix)" in table.arms[1]


def test_finding2_signs_agree_on_every_surface(panel, simulate_cli, summary):
    """The bug's extra prefill is −17,792 (fix − bug) in the notebook, the CLI (text and JSON), summary.json and
    the report's headline table; the hit rate +5.33 points in each."""
    from kvlab.report import headlines

    lines, data = simulate_cli
    f2 = summary["finding2_shortfall_eviction"]
    f2_table = next(t for t in headlines(summary) if t.title.startswith("Finding 2"))
    table = {row[0]: row for row in f2_table.rows}
    nb = panel.summary_frame()[DIFFERENCE_HEADER]
    fix, bug = panel.shortfall.totals(), panel.full.totals()
    for key, nb_row, report_row in (
            ("prefill_tokens_computed", "= tokens prefilled in all (computed)", "prefill tokens computed"),
            ("over_evicted_tokens", "evicted earlier than needed (over-eviction)",
             "tokens evicted beyond the shortfall (over-evicted)"),
            ("evicted_tokens", "tokens evicted from the cache", "tokens evicted"),
            ("reprefill_tokens", "+ tokens prefilled again after a retraction",
             "… of them prefilled again after a retraction"),
            ("pressure_events", "pressure events (allocations that had to evict)", "memory-pressure events")):
        expected = fix[key] - bug[key]
        assert expected != 0, key
        shown = (nb[nb_row], _cli_row(lines, key)[3], table[report_row][3])
        assert [_sign(s) for s in shown] == [1 if expected > 0 else -1] * 3, (key, shown)
        assert [_value(s) for s in shown] == [expected] * 3, (key, shown)
        assert data["difference"][key] == f2["difference"][key] == expected
    points = 100 * (fix["hit_rate"] - bug["hit_rate"])
    hit = (nb["hit rate (prompt tokens served from the cache)"], _cli_row(lines, "hit_rate")[3],
           table["prefix-cache hit rate"][3])
    assert [s.split()[0] for s in hit] == [f"+{points:.2f}"] * 3
    assert data["difference"]["hit_rate"] == f2["difference"]["hit_rate"] == pytest.approx(points / 100, abs=1e-6)


def test_finding1_signs_and_units_agree_on_every_surface(pool_arms, pool_cli, summary):
    """The pool's growth is + on every surface, the memory left idle − (it is what the fix puts to use), and
    bytes are shown by one formatter: 81.00 KiB and 149.56 MiB everywhere, never 82,944 B or 0.15 GiB."""
    from kvlab.report import headlines
    from kvlab.units import fmt_bytes

    lines, data = pool_cli
    no_gc, with_gc = (a.to_json() for a in pool_arms)
    nb = kv_pool_sizing.summary_frame(*pool_arms)
    f1 = summary["finding1_kv_pool_sizing"]
    table = {row[0]: row for row in headlines(summary)[0].rows}
    growth = with_gc["max_total_num_tokens"] - no_gc["max_total_num_tokens"]
    shown = (nb.loc["KV pool (max_total_num_tokens)", DIFFERENCE_HEADER], _cli_row(lines, "max_total_num_tokens")[3],
             table["KV pool size (max_total_num_tokens)"][3])
    assert [_sign(s) for s in shown] == [1, 1, 1] and [_value(s) for s in shown] == [growth] * 3
    assert data["difference"]["max_total_num_tokens"] == f1["difference"]["max_total_num_tokens"] == growth
    idle = (nb.loc["memory left idle once gc has run", DIFFERENCE_HEADER], _cli_row(lines, "idle_bytes")[3])
    assert [_sign(s) for s in idle] == [-1, -1] and idle[0] == idle[1]
    free = fmt_bytes(with_gc["available_bytes"] - no_gc["available_bytes"])
    assert (nb.loc["free memory read after loading", DIFFERENCE_HEADER] == _cli_row(lines, "available_bytes")[3]
            == table["free memory measured after loading (min over ranks)"][3] == "+" + free)
    cell, rest = fmt_bytes(no_gc["cell_size_bytes"]), fmt_bytes(no_gc["rest_bytes"])
    assert (cell, rest) == ("81.00 KiB", "149.56 MiB")
    assert nb.loc["KV cell, per token per rank"].iloc[0] == _cli_row(lines, "cell_size_bytes")[1] == cell
    assert nb.loc["KV budget (rest = free − slack)"].iloc[0] == _cli_row(lines, "rest_bytes")[1] == rest
