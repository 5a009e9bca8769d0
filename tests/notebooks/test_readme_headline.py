"""The README's finding-2 command reproduces the headline (issue 25 item 6): the figure the README states, the
CLI's output for the command the README gives, notebook 02's displayed table and the report's headline are one
number, and the command runs notebook 02's setting."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from kvlab import cli
from kvlab.experiments import shortfall_eviction as se

ROOT = Path(__file__).resolve().parents[2]
HIT_ROW = "hit rate (prompt tokens served from the cache)"


def readme_headline() -> tuple[str, list[str]]:
    """(the figure the README states, e.g. "+5.33", the command's arguments after ``kvlab``)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("# finding 2's headline"))
    figure = re.search(r"([+−-]\d+\.\d\d) points", lines[at])
    assert figure, f"README.md:{at + 1}: no '<+x.xx> points' figure in {lines[at]!r}"
    command = shlex.split(lines[at + 1])
    assert command[:2] == ["kvlab", "simulate"], f"README.md:{at + 2}: not a kvlab simulate command"
    return figure.group(1), command[1:]


def cli_hit_rate_difference(args: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(args) == 0
    row = next(line for line in out.getvalue().splitlines() if line.split() and line.split()[0] == "hit_rate")
    return re.split(r"\s{2,}", row.strip())[3].removesuffix(" points")


def test_the_readme_command_is_notebook_02s_setting():
    _, args = readme_headline()
    assert args == ["simulate", *se.PANEL_DEFAULTS.cli_args(), "--compare"]


def test_readme_figure_equals_the_cli_and_the_report():
    from kvlab.report import compute_summary, headlines

    figure, args = readme_headline()
    assert cli_hit_rate_difference(args) == figure
    report = next(h for h in headlines(compute_summary()[0]) if h.title.startswith("Finding 2"))
    assert report.rows[0][3] == f"{figure} percentage points"


@pytest.mark.slow
def test_readme_figure_equals_the_table_notebook_02_displays(first_run):
    figure, _ = readme_headline()
    run = first_run(ROOT / "notebooks" / "02_shortfall_eviction.ipynb")
    assert run.error is None, run.error
    html = [out["data"]["text/html"] for cell in run.notebook.cells if cell.cell_type == "code"
            and "comparison.summary_frame()" in cell.source for out in cell.outputs if "text/html" in out.get("data", {})]
    assert len(html) == 1, "notebook 02 section 2 displays its summary table once"
    row = re.search(rf"<th>{re.escape(HIT_ROW)}</th>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>", html[0])
    assert row, "the hit-rate row of notebook 02's table"
    assert row.group(3) == f"{figure} points"
