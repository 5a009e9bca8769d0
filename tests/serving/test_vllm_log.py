"""vLLM start-up logs (formats of 0.10.1.1 and 0.34.0, written by kvlab from vLLM's strings): parsed, and the
pool recomputed from "Available KV cache memory" and the config's cell size."""

import pytest

from kvlab.model.hf_config import get_model_config
from kvlab.serving.vllm_log import parse_vllm_log, render_vllm_log
from tests.serving.logs import run_json, write_log

QWEN235 = get_model_config("qwen3-235b-a22b")


def _tokens(available_gib, cell, block=16):
    return int(available_gib * 2**30 // (block * cell)) * block


def test_cell_of_the_235b_case():
    """Qwen3-235B-A22B on 4 GPUs: 4 KV heads / 4 ranks = 1 head × 128 × 2 × 94 layers × 2 B = 48,128 B."""
    assert QWEN235.cell_size_bytes(4) == 48_128


@pytest.mark.parametrize("version", ["0.10.1.1", "0.34.0"])
def test_parse_and_recompute(tmp_path, capsys, version):
    """8.42 GiB available, cell 48,128 B, 16-token blocks: floor(8.42 × 2^30 / (16 × 48,128)) × 16 = 187,840."""
    tokens = _tokens(8.42, 48_128)
    assert tokens == 187_840
    text = render_vllm_log(version, weights_gib=56.1234, available_gib=8.42, tokens=tokens, max_model_len=40_960,
                           tp_size=4)
    log = parse_vllm_log(text)
    assert (log.version, log.tp_size, log.gpu_memory_utilization) == (version, 4, 0.9)
    assert set(log.available_gib) == {0, 1, 2, 3} and log.tokens == tokens and log.max_model_len == 40_960
    j = run_json(capsys, write_log(tmp_path, text), "--model-config", "qwen3-235b-a22b")
    assert j["engine"] == "vllm" and j["version"] == version and j["tp_size"] == 4
    assert j["cell_size_bytes"] == 48_128 and j["max_total_num_tokens_logged"] == tokens
    assert j["max_total_num_tokens_computed"] == tokens and j["consistent"] is True
    assert j["gpu_memory_utilization"] == 0.9 and j["available_kv_cache_gib"] == 8.42
    assert [t["name"] for t in j["terms"]] == ["model weights (per worker)", "available KV cache memory", "KV pool"]


def test_wrong_config_is_flagged(tmp_path, capsys):
    text = render_vllm_log("0.10.1.1", weights_gib=14.9, available_gib=50.0, tokens=_tokens(50.0, 131_072),
                           max_model_len=8192)
    j = run_json(capsys, write_log(tmp_path, text), "--model-config", "qwen3-0.6b")  # a different model
    assert j["consistent"] is False and [f["id"] for f in j["findings"]] == ["cell_mismatch", "outside_interval"]
    # the config contradicts the log's own numbers (50 GiB over its tokens: 131,072 B per token): an error
    [mismatch] = j["findings"][:1]
    assert mismatch["severity"] == "error" and mismatch["logged_cell_range"][0] <= 131_072 <= \
        mismatch["logged_cell_range"][1]


def test_without_config_only_a_consistency_check(tmp_path, capsys):
    text = render_vllm_log("0.34.0", weights_gib=14.9, available_gib=50.0, tokens=_tokens(50.0, 131_072),
                           max_model_len=8192)
    j = run_json(capsys, write_log(tmp_path, text))
    lo, hi = j["cell_size_range"]
    assert lo <= 131_072 <= hi and "consistency check" in j["cell_size_source"]


def test_restarted_server_explains_the_last_start(tmp_path, capsys):
    """Two `vllm serve` starts appended to one file (the first at gpu_memory_utilization 0.9 with 8.42 GiB, the second
    with 20 GiB): every reading comes from the last start, and the earlier one is named, not mixed in (before,
    "Available KV cache memory" came from the first start and the token count from the last: a false mismatch)."""
    first = render_vllm_log("0.10.1.1", weights_gib=56.1234, available_gib=8.42, tokens=_tokens(8.42, 48_128),
                            max_model_len=40_960, tp_size=4)
    second = render_vllm_log("0.34.0", weights_gib=56.1234, available_gib=20.0, tokens=_tokens(20.0, 48_128),
                             max_model_len=40_960, tp_size=4)
    n_first = len(first.splitlines())
    path = write_log(tmp_path, first.rstrip("\n") + "\n" + second)
    log = parse_vllm_log(path.read_text())
    assert log.version == "0.34.0" and set(log.available_gib.values()) == {20.0}
    assert log.earlier_starts == [(1, n_first)] and log.start_line == n_first + 1
    j = run_json(capsys, path, "--model-config", "qwen3-235b-a22b")
    assert j["available_kv_cache_gib"] == 20.0 and j["max_total_num_tokens_logged"] == _tokens(20.0, 48_128)
    assert j["consistent"] is True
    restarted = [f for f in j["findings"] if f["id"] == "restarted"]
    assert restarted and f"from line {n_first + 1}" in restarted[0]["message"]


def test_repeated_reading_keeps_the_first_and_says_so(tmp_path, capsys):
    """The pool line printed twice in one start with another value (lines pasted twice, edited): the first is used,
    and a finding names both lines."""
    tokens = _tokens(8.42, 48_128)
    text = render_vllm_log("0.10.1.1", weights_gib=56.1234, available_gib=8.42, tokens=tokens, max_model_len=40_960,
                           tp_size=4)
    lines = text.splitlines()
    pool = next(i for i, line in enumerate(lines) if "GPU KV cache size" in line)
    lines.append(lines[pool].replace(f"{tokens:,}", f"{tokens * 2:,}"))
    j = run_json(capsys, write_log(tmp_path, "\n".join(lines) + "\n"), "--model-config", "qwen3-235b-a22b")
    assert j["max_total_num_tokens_logged"] == tokens and j["consistent"] is True
    (rep,) = [f for f in j["findings"] if f["id"] == "repeated_reading"]
    assert (rep["line_used"], rep["line_set_aside"]) == (pool + 1, len(lines))
