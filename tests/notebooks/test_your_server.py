"""Notebook 05 headless: the report's default, then pointed at a user's own log and config. The numbers it draws are
the ones ``kvlab explain-log --compare-engines`` computes for the same files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest

from kvlab import cli
from kvlab.serving.examples import DATA_DIR, LOG_DIR, QWEN_FP8
from kvlab.serving.pool import sglang_tokens
from kvlab.serving.sglang_formats import default_server_args, render_sglang_log

from .nbrun import error_outputs, execute_notebook, find_output, iter_outputs

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "05_your_server.ipynb"
PLOTLY = "application/vnd.plotly.v1+json"


def _cli_json(capsys, *args) -> dict:
    assert cli.main(["explain-log", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _figures(nb) -> list[go.Figure]:
    return [go.Figure(out["data"][PLOTLY]) for _, _, out in iter_outputs(nb) if PLOTLY in out.get("data", {})]


@pytest.mark.slow
def test_notebook_05_default_is_the_report(first_run, capsys):
    run = first_run(NOTEBOOK)
    assert run.error is None, run.error
    nb = run.notebook
    assert not error_outputs(nb)
    data = _cli_json(capsys, LOG_DIR / "qwen3-235b-fp8-4xh100-sglang-0.4.9.log", "--model-config",
                     DATA_DIR / QWEN_FP8, "--gpu", "h100-80g", "--compare-engines", "--vllm-log",
                     LOG_DIR / "qwen3-235b-fp8-4xh100-vllm-0.10.1.1.log")
    comp = data["engine_comparison"]
    figures = _figures(nb)
    waterfall, engines, gap, what_ifs = figures[:4]
    # section 1: SGLang's waterfall ends in the budget the CLI computes
    budget = next(t for t in data["terms"] if t["name"] == "KV pool budget (rest)")  # after any version terms
    assert waterfall.data[0].y[-1] == pytest.approx(budget["gib"])
    # section 2: each engine's waterfall ends in its budget; the titles carry the tokens, computed and logged
    assert [t.y[-1] for t in engines.data] == pytest.approx([comp["sglang"]["budget_gib"], comp["vllm"]["budget_gib"]],
                                                           abs=1e-4)
    titles = " ".join(a.text for a in engines.layout.annotations)
    assert f"{comp['sglang']['tokens']:,} tokens (log 367,404)" in titles
    assert f"{comp['vllm']['tokens']:,} tokens (log 178,880)" in titles
    assert list(gap.data[0].x) == [row["tokens"] for row in comp["gap"]]
    # section 3: one bar per what-if, as the CLI computes them
    what_if = _cli_json(capsys, LOG_DIR / "qwen3-235b-fp8-4xh100-sglang-0.4.9.log", "--model-config",
                        DATA_DIR / QWEN_FP8, "--gpu", "h100-80g", "--what-if", "mem_fraction_static=0.9",
                        "kv_cache_dtype=fp8_e4m3", "tp=8", "gpu=h200")["what_if"]
    assert list(what_ifs.data[0].y) == [data["max_total_num_tokens_computed"]] + [
        w["max_total_num_tokens"] for w in what_if]
    line = find_output(nb, "panel:")
    assert f"SGLang {comp['sglang']['tokens']:,} vs vLLM {comp['vllm']['tokens']:,}" in line


@pytest.mark.slow
def test_notebook_05_reads_the_users_files(tmp_path, capsys):
    """A user's SGLang 0.5.16 log of Llama 3.1 8B on an A100, their own config.json copy, no vLLM log."""
    config = tmp_path / "my-model" / "config.json"
    config.parent.mkdir()
    config.write_text((ROOT / "kvlab" / "model" / "presets" / "llama-3.1-8b.json").read_text())
    cell = 32 * 8 * 256 * 2
    tokens = sglang_tokens(78.5, 63.2, 0.85, cell)
    log = tmp_path / "my_server.log"
    log.write_text(render_sglang_log("0.5.16", before_gib=78.5, after_gib=63.2, pool_end_gib=8.1, tokens=tokens,
                                     context_len=131072, cell_size_bytes=cell,
                                     server_args=default_server_args("0.5.16", tp_size=1, mem_fraction_static=0.85)))
    nb = execute_notebook(NOTEBOOK, timeout=300, parameters={
        "LOG_PATH": str(log), "MODEL_CONFIG": str(config), "GPU": "a100-80g", "WHAT_IFS": ["mem_fraction_static=0.9"]})
    assert not error_outputs(nb)
    text = find_output(nb, "explain-log ·")
    data = _cli_json(capsys, log, "--model-config", config, "--gpu", "a100-80g", "--compare-engines")
    # the notebook prints the CLI's number (which takes 0.5.16's RoPE-cache term off the printed reading)
    assert str(log) in text and f"computed {data['max_total_num_tokens_computed']:,}" in text and "consistent" in text
    assert abs(data["max_total_num_tokens_computed"] - tokens) <= 8
    comp = data["engine_comparison"]
    engines = _figures(nb)[1]
    titles = " ".join(a.text for a in engines.layout.annotations)
    assert re.search(rf"SGLang</b>: {comp['sglang']['tokens']:,} tokens \(log {tokens:,}\)", titles)
    assert f"vLLM</b>: {comp['vllm']['tokens']:,} tokens" in titles and "(log" not in titles.split("vLLM")[1]
    assert "kvlab estimate" in comp["inputs"]["activation"]["source"]
