"""SGLang vs vLLM on vllm-project/vllm#21348 (Qwen3-235B-A22B-FP8, 4×H100: 367,404 vs 178,880 tokens), through
``kvlab explain-log --compare-engines``; the shipped example logs and config are what kvlab writes now."""

import json

import pytest

from kvlab.model.hf_config import load_model_config
from kvlab.serving.examples import DATA_DIR, EXAMPLES, LOG_DIR, QWEN_FP8, render_example
from tests.serving.logs import run_cli, run_json

CONFIG = DATA_DIR / QWEN_FP8
SGLANG_LOG = LOG_DIR / "qwen3-235b-fp8-4xh100-sglang-0.4.9.log"
VLLM_LOG = LOG_DIR / "qwen3-235b-fp8-4xh100-vllm-0.10.1.1.log"


def test_shipped_config_has_the_published_geometry():
    c = load_model_config(CONFIG)
    assert (c.num_layers, c.num_attention_heads, c.num_kv_heads, c.head_dim, c.hidden_size) == (94, 64, 4, 128, 4096)
    assert (c.num_experts, c.num_experts_per_tok, c.weight_dtype, c.kv_dtype) == (128, 8, "fp8", "bfloat16")
    # 94 layers × 1 KV head per rank × (128 + 128) × 2 B: the report's 8.23 GB K over 367,405 slots
    assert c.cell_size_bytes(4) == 48_128
    assert abs(367_405 * 48_128 / 2 / 2**30 - 8.23) < 0.005


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_shipped_logs_are_what_the_generator_writes(example):
    assert (LOG_DIR / example.filename).read_text(encoding="utf-8") == render_example(example)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_every_example_explains_consistently(capsys, example):
    data = run_json(capsys, LOG_DIR / example.filename, "--model-config", example.model_source, "--gpu", example.gpu,
                    "--compare-engines")
    assert data["consistent"] is True
    comp = data["engine_comparison"]
    assert sum(row["tokens"] for row in comp["gap"]) == comp["sglang"]["tokens"] - comp["vllm"]["tokens"]


def test_the_report_both_logs(capsys):
    data = run_json(capsys, SGLANG_LOG, "--model-config", CONFIG, "--gpu", "h100-80g", "--compare-engines",
                    "--vllm-log", VLLM_LOG)
    comp = data["engine_comparison"]
    assert comp["logged"] == {"sglang": 367_404, "vllm": 178_880}
    sglang, vllm = comp["sglang"], comp["vllm"]
    # each engine's own rule lands within print rounding of what it logged
    assert abs(sglang["tokens"] - 367_404) < 200 and abs(vllm["tokens"] - 178_880) < 200
    assert 2.0 < comp["ratio"] < 2.1
    assert "0.10.1.1" in vllm["rule"] and "determine_available_memory" in vllm["rule"]
    assert sglang["cell_size_bytes"] == vllm["cell_size_bytes"] == 48_128
    assert comp["kv_heads_per_rank"] == 1 and comp["kv_heads_replicated"] is False
    gap = {row["kind"]: row for row in comp["gap"]}
    total = sglang["tokens"] - vllm["tokens"]
    assert sum(row["tokens"] for row in comp["gap"]) == total
    # same cell, same dtype: the whole gap is in the budget, and vLLM's activation reservation is most of it
    assert gap["cell"]["tokens"] == 0
    assert gap["activation"]["tokens"] > 0.85 * total
    assert abs(gap["base"]["tokens"]) < 0.1 * total  # 0.93 of free memory ≈ 0.9 of the total
    # the activation vLLM reserved is what its log implies: 0.9 × 79.19 − 55.15 − 0.5 − 8.02 (0.10's rule)
    assert gap["activation"]["gib"] == pytest.approx(0.9 * 81_090 / 1024 - 55.15 - 0.5 - 8.02, abs=1e-3)


def test_the_report_text(capsys):
    code, out, err = run_cli(capsys, SGLANG_LOG, "--model-config", CONFIG, "--gpu", "h100-80g", "--compare-engines",
                             "--vllm-log", VLLM_LOG)
    assert code == 0, err
    assert "SGLang vs vLLM" in out and "peak activation    " in out and "profile run: implied by" in out and "(log: 178,880)" in out


def test_estimates_alone_also_favour_sglang(capsys):
    """Without vLLM's log the activation comes from kvlab's estimate (8,192 tokens, 1,024 sequences)."""
    data = run_json(capsys, SGLANG_LOG, "--model-config", CONFIG, "--gpu", "h100-80g", "--compare-engines",
                    "--vllm-version", "0.10.1.1")
    comp = data["engine_comparison"]
    assert comp["ratio"] > 1 and comp["inputs"]["activation"]["source"].startswith("kvlab estimate")
    bigger = run_json(capsys, SGLANG_LOG, "--model-config", CONFIG, "--gpu", "h100-80g", "--compare-engines",
                      "--vllm-version", "0.10.1.1", "--max-num-batched-tokens", "65536")["engine_comparison"]
    assert bigger["vllm"]["tokens"] < comp["vllm"]["tokens"]
    assert bigger["sglang"]["tokens"] == comp["sglang"]["tokens"]  # SGLang never subtracts activations


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.engine == "vllm"], ids=lambda e: e.name)
def test_vllm_side_gives_back_what_the_log_printed(capsys, example):
    """From a vLLM log, the implied activation peak makes vLLM's rule give the printed available memory back."""
    from kvlab.serving.vllm_log import parse_vllm_log

    log = parse_vllm_log((LOG_DIR / example.filename).read_text(), example.filename)
    comp = run_json(capsys, LOG_DIR / example.filename, "--model-config", example.model_source, "--gpu", example.gpu,
                    "--compare-engines")["engine_comparison"]
    assert comp["vllm"]["budget_gib"] == pytest.approx(min(log.available_gib.values()), abs=1e-3)
    assert comp["inputs"]["activation"]["gib"] > 0


def test_from_the_vllm_side(capsys):
    data = run_json(capsys, VLLM_LOG, "--model-config", CONFIG, "--gpu", "h100-80g", "--compare-engines")
    comp = data["engine_comparison"]
    assert comp["logged"] == {"vllm": 178_880}
    assert comp["inputs"]["weights"]["source"].endswith("'Model loading took'")


@pytest.mark.parametrize("args,match", [
    (["--compare-engines"], "needs the GPU"),
    (["--gpu", "h100-80g", "--compare-engines", "--vllm-log", "/nonexistent/vllm.log"], "--vllm-log /nonexistent"),
    (["--gpu", "h100-80g", "--compare-engines", "--vllm-version", "new"], "--vllm-version 'new': not a vLLM version"),
])
def test_bad_comparison_input(capsys, args, match):
    code, out, err = run_cli(capsys, SGLANG_LOG, "--model-config", CONFIG, *args)
    assert code == 2 and out == "" and match in err and "Traceback" not in err


def test_comparison_needs_a_config(capsys):
    code, out, err = run_cli(capsys, SGLANG_LOG, "--gpu", "h100-80g", "--compare-engines")
    assert code == 2 and "needs the model's config" in err


def test_json_without_the_flag_has_no_comparison(capsys):
    data = run_json(capsys, SGLANG_LOG, "--model-config", CONFIG, "--gpu", "h100-80g")
    assert "engine_comparison" not in data and json.dumps(data)


def test_readme_quotes_the_cli(capsys):
    """README's vllm#21348 table is what the CLI computes now (paste the CLI's figures when the rules change)."""
    readme = (DATA_DIR.parent / "README.md").read_text(encoding="utf-8")
    comp = run_json(capsys, SGLANG_LOG, "--model-config", CONFIG, "--gpu", "h100-80g", "--compare-engines",
                    "--vllm-log", VLLM_LOG)["engine_comparison"]
    assert f"kvlab gets {comp['sglang']['tokens']:,}\nand {comp['vllm']['tokens']:,}" in readme
    assert f"gap of {comp['sglang']['tokens'] - comp['vllm']['tokens']:,} tokens" in readme
    table = readme.split("| term | GiB | tokens |")[1].split("\n\n")[0].replace("−", "-")  # README: U+2212
    for row in comp["gap"]:
        tokens = f"{row['tokens']:+,}" if row["tokens"] else "0"
        assert f"| {tokens} |" in table, (row, table)
