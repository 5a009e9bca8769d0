"""Notebook 05's runtime section (issue 36), headless: the timeline figure it draws holds the numbers ``kvlab
explain-log --json`` prints for the same log, and its panel reads the example."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
import pytest

from kvlab import cli
from tests.viz.test_runtime_panel import plotted

from .nbrun import error_outputs, iter_outputs

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "05_your_server.ipynb"
LOG = ROOT / "data" / "examples" / "runtime_logs" / "multi-turn-chat-20k-sglang-0.5.23-rendered.log"
PLOTLY = "application/vnd.plotly.v1+json"


@pytest.mark.slow
def test_notebook_05_runtime_section_draws_the_clis_numbers(first_run, capsys):
    run = first_run(NOTEBOOK)
    assert run.error is None, run.error
    assert not error_outputs(run.notebook)
    figures = [go.Figure(out["data"][PLOTLY]) for _, _, out in iter_outputs(run.notebook)
               if PLOTLY in out.get("data", {})]
    runtime = next(f for f in figures if (f.layout.title.text or "").startswith(f"Runtime: {LOG.name}"))
    assert cli.main(["explain-log", str(LOG), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["runtime"]
    used = next(t for t in runtime.data if t.name == "tokens in use")
    assert max(plotted(used.y)) == data["used_tokens"]["max"]
    cumulative = next(t for t in runtime.data if t.name == "cumulative")
    assert plotted(cumulative.y)[-1] == pytest.approx(data["hit_rate"]["overall"], rel=1e-12)
    events = next(t for t in runtime.data if t.name == "retraction / preemption")
    assert sum(c[1] for c in events.customdata) == data["events"]["requests_retracted"]
    texts = "".join("".join(out.get("text", "")) for _, _, out in iter_outputs(run.notebook))
    assert f"Σ cached {data['hit_rate']['cached_tokens']:,}" in texts
