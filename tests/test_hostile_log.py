"""Issue 37's explain-log items: a model config nested too deep or holding counts beyond any model, an SGLang version
kvlab does not know, and a key given twice on one log line. Each is one ``kvlab: error:`` line naming the file (and
line), the field or flag, and the value (exit 2), within seconds; never a traceback, a hang or a silent answer."""

from __future__ import annotations

import json
import time

import pytest

from kvlab.cli import main
from kvlab.model.hf_config import FIELD_LIMITS, MAX_JSON_DEPTH, PRESET_DIR
from kvlab.serving.sglang_versions import READ_VERSIONS
from tests.test_hostile_inputs import SGLANG_LOG, VLLM_LOG, _refused

LLAMA = json.loads((PRESET_DIR / "llama-3.1-8b.json").read_text())  # the model SGLANG_LOG was rendered for
MLA = json.loads((PRESET_DIR / "deepseek-v2-lite.json").read_text())  # read only where kv_lora_rank is set


def _config(tmp_path, text: str):
    path = tmp_path / "config.json"
    path.write_text(text)
    return path


def _with(field: str, value_json: str) -> str:
    """LLAMA with ``field`` set to the raw JSON ``value_json`` (written as text: a value json.dumps could not)."""
    return json.dumps({k: v for k, v in LLAMA.items() if k != field})[:-1] + f', "{field}": {value_json}}}'


def _explain(capsys, *argv: str) -> dict:
    code = main(["explain-log", *argv, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


# ---- item 3: nested too deep (the parse, and every later walk of what was read) --------------------------------

@pytest.mark.parametrize("field, depth", [
    ("quantization_config", 50_000),  # past json's own recursion limit: was "JSON nested too deeply", no field named
    ("rope_scaling", 900),  # read by json, then printed, compared, dumped: was accepted without a word
    ("torch_dtype", 500),  # was an error line holding all 500 brackets
    ("text_config", MAX_JSON_DEPTH),
])
def test_a_config_value_nested_too_deep_is_refused_naming_the_file_and_the_field(field, depth, tmp_path, capsys):
    path = _config(tmp_path, _with(field, "[" * depth + "]" * depth))
    err = _refused(capsys, ["explain-log", str(SGLANG_LOG), "--model-config", str(path)], f"{path}: field '{field}' "
                   f"is nested more than {MAX_JSON_DEPTH} levels deep (at {field}[0][0]")
    assert len(err) < 400, err


def test_a_config_nested_as_deep_as_real_ones_still_reads(tmp_path, capsys):
    nested = {"config_groups": {"group_0": {"weights": {"num_bits": 8, "strategy": "channel"}}}}
    path = _config(tmp_path, json.dumps({**LLAMA, "quantization_config": nested}))
    assert _explain(capsys, str(SGLANG_LOG), "--model-config", str(path))["cell_size_bytes"] == 131_072


@pytest.mark.parametrize("field, value, needle", [
    ("vocab_size", "9" * 5000, "field 'vocab_size' holds a number of more than 4,300 digits"),
    ("shared_expert_intermediate_size", '"x"', "field 'shared_expert_intermediate_size' must be an integer >= 0, "
                                               "got 'x'"),  # was exit 3 (TypeError)
    ("shared_expert_intermediate_size", "Infinity", "field 'shared_expert_intermediate_size' must be an integer >= 0, "
                                                    "got inf"),  # was exit 3 (OverflowError)
])
def test_a_config_value_python_cannot_use_is_named(field, value, needle, tmp_path, capsys):
    path = _config(tmp_path, _with(field, value)[:-1] + ', "num_experts": 8}')
    _refused(capsys, ["explain-log", str(SGLANG_LOG), "--model-config", str(path)], f"{path}: {needle}")


def test_layer_types_that_are_no_list_are_left_unread(tmp_path, capsys):
    path = _config(tmp_path, json.dumps({**LLAMA, "sliding_window": 4096, "layer_types": 5}))  # was exit 3
    data = _explain(capsys, str(SGLANG_LOG), "--model-config", str(path))
    assert data["cell_size_bytes"] == 131_072


# ---- item 4: counts and sizes beyond any model, refused before any loop over the layers --------------------------

@pytest.mark.parametrize("field", sorted(FIELD_LIMITS))
def test_a_structural_field_beyond_any_model_is_refused_naming_field_value_and_bound(field, tmp_path, capsys):
    limit = FIELD_LIMITS[field]
    base = MLA if field in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") else LLAMA
    path = _config(tmp_path, json.dumps({**base, field: limit + 1}))
    _refused(capsys, ["explain-log", str(SGLANG_LOG), "--model-config", str(path)],
             f"{path}: field '{field}' must be at most {limit:,}", f"got {limit + 1:,}", seconds=10)


def test_the_largest_layer_count_is_refused_at_once(tmp_path, capsys):
    """10^12 layers (the old bound) ran past 60 s in the weights' per-layer loop; now it never reaches it."""
    path = _config(tmp_path, json.dumps({**LLAMA, "num_hidden_layers": 10 ** 12}))
    _refused(capsys, ["explain-log", str(SGLANG_LOG), "--model-config", str(path)],
             "field 'num_hidden_layers' must be at most 1,024", "got 1,000,000,000,000", seconds=5)


def test_the_bound_itself_is_explained_within_seconds(tmp_path, capsys):
    path = _config(tmp_path, json.dumps({**LLAMA, "num_hidden_layers": FIELD_LIMITS["num_hidden_layers"]}))
    start = time.perf_counter()
    data = _explain(capsys, str(SGLANG_LOG), "--model-config", str(path), "--what-if", "tp=2")
    assert time.perf_counter() - start < 10
    assert data["cell_size_bytes"] == 131_072 // 32 * FIELD_LIMITS["num_hidden_layers"]


# ---- item 5: an SGLang version kvlab does not know -------------------------------------------------------------

@pytest.mark.parametrize("version", ["0.0.0", "0.1.14"])
def test_a_given_sglang_version_older_than_the_known_range_is_refused(version, capsys):
    _refused(capsys, ["explain-log", str(SGLANG_LOG), "--sglang-version", version],
             f"--sglang-version {version}: older than any SGLang version kvlab knows, 0.1.17 to {READ_VERSIONS[-1]}")


@pytest.mark.parametrize("version", ["0.5.24", "99.0.0"])
def test_a_given_sglang_version_newer_than_kvlab_read_is_explained_with_the_newest_rules_and_says_so(version, capsys):
    data = _explain(capsys, str(SGLANG_LOG), "--sglang-version", version)
    found = {f["id"]: f for f in data["findings"]}
    assert data["version"] == version
    assert f"the rules of sglang {READ_VERSIONS[-1]} were applied" in found["version_unknown"]["message"]


@pytest.mark.parametrize("version", ["0.1.17", "0.4.8", READ_VERSIONS[-1], READ_VERSIONS[-1] + ".post1"])
def test_a_given_sglang_version_in_the_range_is_used(version, capsys):
    assert _explain(capsys, str(SGLANG_LOG), "--sglang-version", version)["version"] == version


def test_a_printed_version_outside_the_range_is_a_warning_naming_it(tmp_path, capsys):
    path = tmp_path / "server.log"
    path.write_text("sglang==0.0.0\n" + SGLANG_LOG.read_text())
    found = {f["id"]: f for f in _explain(capsys, str(path))["findings"]}
    assert "version_unknown" in found, found
    assert "SGLang 0.0.0 (version line at line 1) is outside the versions kvlab knows" in found["version_unknown"][
        "message"]


# ---- item 8: a key given twice on one line ---------------------------------------------------------------------

@pytest.mark.parametrize("old, new, line, needle", [
    ("tp_size=1,", "tp_size=1, tp_size=2,", 1, "server_args gives 'tp_size' twice (tp_size=1, then tp_size=2)"),
    ("mem_fraction_static=0.835,", "mem_fraction_static=0.835, mem_fraction_static=0.9,", 1,
     "server_args gives 'mem_fraction_static' twice (mem_fraction_static=0.835, then mem_fraction_static=0.9)"),
    ("context_len=131072,", "context_len=131072, context_len=5,", 6,
     "the max_total_num_tokens line gives 'context_len' twice (context_len=131072, then context_len=5)"),
])
def test_a_key_given_twice_on_one_log_line_is_refused_naming_the_line(old, new, line, needle, tmp_path, capsys):
    text = SGLANG_LOG.read_text()
    assert text.count(old) == 1
    path = tmp_path / "server.log"
    path.write_text(text.replace(old, new))
    _refused(capsys, ["explain-log", str(path)], f"{path}:{line}: {needle}: which one the server ran with is unclear")


# ---- the rest of explain-log, probed: numbers on log lines, long flag values --------------------------------------

@pytest.mark.parametrize("value, needle", [
    ("9" * 400, "context_len must be from 1 to 1,000,000,000,000"),  # was exit 3 (OverflowError in the RoPE term)
    ("99999999999999999999", "context_len must be from 1 to 1,000,000,000,000"),  # was taken as read
    ("0", "context_len=0: context_len must be from 1"),
    ("-1", "context_len=-1: context_len must be from 1"),
])
def test_a_context_len_on_the_pool_line_beyond_reason_is_named(value, needle, tmp_path, capsys):
    path = tmp_path / "server.log"
    path.write_text(SGLANG_LOG.read_text().replace("context_len=131072", f"context_len={value}"))
    _refused(capsys, ["explain-log", str(path), "--model-config", "llama-3.1-8b"], f"{path}:6: ", needle)


@pytest.mark.parametrize("old, new, needle", [
    ("Model loading took 32.86 GiB", "Model loading took -1 GiB", ":3: 'Model loading took' line without a readable"),
    ("Available KV cache memory: 39.6 GiB", "Available KV cache memory: nan GiB",
     ":4: 'Available KV cache memory' line without a readable number"),
    ("GPU KV cache size: 518,992 tokens", "GPU KV cache size: 5,18,,992 tokens",
     ":11: 'GPU KV cache size' line without a readable number"),  # was read as 518,992 with the commas dropped
])
def test_a_vllm_reading_line_without_a_readable_number_is_named_not_skipped(old, new, needle, tmp_path, capsys):
    """Rank 0's line edited: it was skipped, and the other workers' readings explained the log without a word."""
    text = VLLM_LOG.read_text()
    assert old in text
    path = tmp_path / "vllm.log"
    path.write_text(text.replace(old, new, 1))
    _refused(capsys, ["explain-log", str(path), "--model-config", "llama-3.1-70b"], f"{path}{needle}")


@pytest.mark.parametrize("argv, needle", [
    (["--gpu", "x" * 100_000], "--gpu 'xxxxxxxx"),
    (["--gpu", "h100-80g", "--what-if", "gpu=" + "x" * 100_000], "--what-if 'gpu=xxxx"),
    (["--what-if", "kv_cache_dtype=" + "y" * 100_000], "--what-if 'kv_cache_dtype=yyy"),
    (["--what-if", "z" * 100_000 + "=1"], "unknown key 'zzz"),
    (["--sglang-version", "0." * 50_000], "--sglang-version 0.0."),
    (["--gpu", "h100-80g", "--compare-engines", "--vllm-version", "v" * 100_000], "--vllm-version 'vvv"),
])
def test_a_huge_flag_value_is_named_and_cut(argv, needle, capsys):
    err = _refused(capsys, ["explain-log", str(SGLANG_LOG), "--model-config", "llama-3.1-8b", *argv], needle)
    assert len(err) < 500, err[:600]
