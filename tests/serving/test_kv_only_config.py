"""A config.json holding only the KV geometry (layers, KV heads and head_dim — or MLA's ranks — and the dtype)
explains every example log with the same pool as the full config; what needs a field it lacks (the weights
check, the context-length check, the RoPE term, the TP what-if, the engine comparison) names the field and what
it would have shown; a config lacking a KV field is refused naming the file and the field.

Shipped logs: data/examples/server_logs/ with their configs (kvlab.serving.examples); shared logs:
../shared/real-data/sglang_logs_examples.jsonl (skipped where ../shared is absent).
"""

import json

import pytest

from kvlab.model.hf_config import resolve_config_path
from kvlab.serving.examples import EXAMPLES, LOG_DIR
from tests.serving.logs import run_cli, run_json, write_log
from tests.serving.test_real_logs import PRESET, RECORDS

KV_FIELDS = ("num_hidden_layers", "num_key_value_heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim",
             "torch_dtype")


def kv_only(source: str, tmp_path, name: str = "kv-config.json"):
    """The config.json at ``source`` (a preset, a file or a folder) stripped to the KV fields; where it has no
    head_dim (or no num_key_value_heads), the fields SGLang derives it from stay too."""
    data = json.loads(resolve_config_path(source).read_text())
    kept = {k: data[k] for k in KV_FIELDS if k in data}
    if "kv_lora_rank" in data:  # MLA: one latent per token and layer, whatever the heads
        kept.pop("num_key_value_heads", None)
    else:
        if "head_dim" not in data:
            kept.update(hidden_size=data["hidden_size"], num_attention_heads=data["num_attention_heads"])
        elif "num_key_value_heads" not in data:
            kept["num_attention_heads"] = data["num_attention_heads"]
    path = tmp_path / name
    path.write_text(json.dumps(kept))
    return path, kept


def _pool(j: dict) -> dict:
    return {"tokens": j["max_total_num_tokens_computed"], "range": j["computed_range"],
            "cell": j["cell_size_bytes"], "cell_range": j["cell_size_range"], "consistent": j["consistent"],
            "terms": [(t["name"], t["gib"]) for t in j["terms"]]}


def _same_pool(capsys, log, full, tmp_path) -> tuple[dict, dict]:
    path, kept = kv_only(full, tmp_path)
    assert not {"vocab_size", "max_position_embeddings", "intermediate_size"} & set(kept)
    with_full = run_json(capsys, log, "--model-config", full)
    with_kv = run_json(capsys, log, "--model-config", path)
    assert _pool(with_kv) == _pool(with_full)
    assert with_full["model_config_missing_fields"] == []
    assert "vocab_size" in with_kv["model_config_missing_fields"]
    return with_full, with_kv


@pytest.mark.parametrize("ex", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_shipped_logs_same_pool_from_kv_fields(tmp_path, capsys, ex):
    with_full, with_kv = _same_pool(capsys, LOG_DIR / ex.filename, ex.model_source, tmp_path)
    if ex.engine == "sglang":  # the weights check says which fields it lacks, and what it would have shown
        unchecked = next(f for f in with_kv["findings"] if f["id"] == "weights_unchecked")
        assert "'vocab_size'" in unchecked["message"] and "resident_after_load" in unchecked["message"]
        assert "vocab_size" in unchecked["missing_fields"]
        assert not any(f["id"] == "weights_unchecked" for f in with_full["findings"])


@pytest.mark.parametrize("record_id", sorted(PRESET))
def test_shared_logs_same_pool_from_kv_fields(tmp_path, capsys, record_id):
    record = next((r for r in RECORDS if r["id"] == record_id), None)
    if record is None:
        pytest.skip("../shared/real-data/sglang_logs_examples.jsonl is absent (or lacks this record)")
    log = write_log(tmp_path, "\n".join(record["lines"]))
    with_full, with_kv = _same_pool(capsys, log, PRESET[record_id], tmp_path)
    if record_id == "repo-willxxy-sglang-play":  # the RoPE cache's rows: the log's context_len, said so
        how = next(t["how"] for t in with_kv["terms"] if t["name"] == "RoPE cache expansion before profiling")
        assert "32,768 rows (the log's context_len" in how


def test_the_text_names_the_missing_fields(tmp_path, capsys):
    ex = EXAMPLES[0]
    path, _ = kv_only(ex.model_source, tmp_path)
    code, out, err = run_cli(capsys, LOG_DIR / ex.filename, "--model-config", path)
    assert code == 0, err
    # a finding wraps over lines indented under it: join them back
    line = " ".join(out.split("weights_unchecked", 1)[1].split("\n    [", 1)[0].split())
    assert "'vocab_size'" in line and "'intermediate_size'" in line and "cannot estimate the weights" in line


def test_no_context_length_anywhere_is_named(tmp_path, capsys):
    """A 0.5.23 log without its context_len field, a config without max_position_embeddings: both the
    context-length check and the RoPE term name the field (the full config counts the term)."""
    text = (LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log").read_text().replace("context_len=131072, ", "")
    log = write_log(tmp_path, text)
    path, _ = kv_only("llama-3.1-8b", tmp_path)
    with_kv = run_json(capsys, log, "--model-config", path)
    by_id = {f["id"]: f for f in with_kv["findings"]}
    assert by_id["context_unchecked"]["missing_fields"] == ["max_position_embeddings"]
    assert "pool_below_context" in by_id["context_unchecked"]["message"]
    assert by_id["term_not_counted"]["term"] == "RoPE cache expansion before profiling"
    assert "'max_position_embeddings'" in by_id["term_not_counted"]["message"]
    with_full = run_json(capsys, log, "--model-config", "llama-3.1-8b")
    assert [t["name"] for t in with_full["post_load_terms"]] == ["RoPE cache expansion before profiling"]
    assert not {"context_unchecked", "term_not_counted"} & {f["id"] for f in with_full["findings"]}


@pytest.mark.parametrize("args,match", [
    (["--what-if", "tp=8"], "--what-if 'tp=8': the config ("),
    (["--compare-engines", "--gpu", "h100-80g"], "the engine comparison (the weights per rank and vLLM's activation"),
])
def test_parts_that_need_the_weights_name_the_fields(tmp_path, capsys, args, match):
    path, _ = kv_only("llama-3.1-8b", tmp_path)
    code, _, err = run_cli(capsys, LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log", "--model-config", path, *args)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("kvlab: error:") and match in err and "'vocab_size'" in err


@pytest.mark.parametrize("drop,field", [
    ("num_hidden_layers", "'num_hidden_layers'"),
    ("num_key_value_heads", "'num_key_value_heads' is missing"),
    ("head_dim", "'head_dim' is missing"),
])
def test_a_missing_kv_field_names_the_file_and_the_field(tmp_path, capsys, drop, field):
    path, kept = kv_only("qwen3-0.6b", tmp_path)  # has head_dim: the KV-only config is four fields
    assert set(kept) == {"num_hidden_layers", "num_key_value_heads", "head_dim", "torch_dtype"}
    path.write_text(json.dumps({k: v for k, v in kept.items() if k != drop}))
    code, _, err = run_cli(capsys, LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log", "--model-config", path)
    assert code == 2 and "Traceback" not in err
    assert str(path) in err and field in err and "needed for the KV cell size" in err


def test_a_missing_mla_rank_names_the_file_and_the_field(tmp_path, capsys):
    path, kept = kv_only("deepseek-v2-lite", tmp_path)
    assert set(kept) == {"num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "torch_dtype"}
    path.write_text(json.dumps({k: v for k, v in kept.items() if k != "qk_rope_head_dim"}))
    code, _, err = run_cli(capsys, LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log", "--model-config", path)
    assert code == 2 and str(path) in err and "field 'qk_rope_head_dim' is missing" in err
