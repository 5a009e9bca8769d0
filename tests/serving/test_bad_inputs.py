"""Every input explain-log cannot use: exit 2, ``kvlab: error:`` naming the file (and line) and what is missing,
no traceback, nothing on stdout. Never a silent number."""

import json
import re

import pytest

from kvlab.model.hf_config import get_model_config
from kvlab.serving.pool import sglang_tokens
from kvlab.serving.sglang_formats import default_server_args, render_sglang_log
from tests.serving.logs import run_cli, write_log

CELL = get_model_config("llama-3-8b").cell_size_bytes(1)


def _good(version="0.4.3.post3", server_args=True, **kw):
    args = dict(before_gib=70.0, after_gib=54.0, pool_end_gib=4.0, tokens=sglang_tokens(70.0, 54.0, 0.85, CELL),
                context_len=8192, cell_size_bytes=CELL)
    args.update(kw)
    return render_sglang_log(version, server_args=default_server_args(version, tp_size=1, mem_fraction_static=0.85)
                             if server_args else None, **args)


def _fails(capsys, *args, match: str):
    code, out, err = run_cli(capsys, *args)
    assert code == 2, (out, err)
    assert out == "" and err.startswith("kvlab: error: ") and "Traceback" not in err
    assert match in err, err
    return err


@pytest.mark.parametrize("text,match", [
    ("", "not an SGLang or vLLM start-up log"),
    ("hello\nworld\n", "not an SGLang or vLLM start-up log: none of 'Load weight begin'"),
    (json.dumps({"hidden_size": 4096}), "not an SGLang or vLLM start-up log"),
])
def test_not_a_startup_log(tmp_path, capsys, text, match):
    path = write_log(tmp_path, text)
    err = _fails(capsys, path, "--model-config", "llama-3-8b", match=match)
    assert str(path) in err


def test_truncated_after_load_begin(tmp_path, capsys):
    lines = _good().splitlines()
    cut = next(i for i, line in enumerate(lines) if "Load weight begin" in line) + 1
    path = write_log(tmp_path, "\n".join(lines[:cut]))
    _fails(capsys, path, "--model-config", "llama-3-8b",
           match=f"{path}:{cut}: truncated: 'Load weight begin' on TP0 has no 'Load weight end'")


def test_no_readings(tmp_path, capsys):
    only_pool = "\n".join(line for line in _good().splitlines() if "max_total_num_tokens" in line)
    path = write_log(tmp_path, only_pool)
    _fails(capsys, path, "--model-config", "llama-3-8b", match=f"{path}:1: no memory readings")
    old = render_sglang_log("0.1.14", before_gib=1, after_gib=1, pool_end_gib=1, tokens=5, context_len=9,
                            cell_size_bytes=1, version_line=False)
    _fails(capsys, write_log(tmp_path, "sglang==0.1.14\n" + old, "old.log"), "--model-config", "llama-3-8b",
           match="(SGLang before 0.1.17 printed none)")


def test_unreadable_number_names_the_line(tmp_path, capsys):
    text = _good().replace("Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=54.00 GB",
                           "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=?? GB")
    path = write_log(tmp_path, text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "avail mem=??" in t)
    _fails(capsys, path, match=f"{path}:{line}: 'Load weight end.' line without a readable number")


@pytest.mark.parametrize("field", ["context_len", "chunked_prefill_size"])
def test_unreadable_setting_on_the_tokens_line_names_the_line(tmp_path, capsys, field):
    # was: a value that is not an integer silently became the config's context length, or no chunked size
    text = _good("0.5.10.post1", server_args=False, chunked_prefill_size=8192)
    assert f"{field}=" in text
    text = re.sub(rf"{field}=\d+", f"{field}=8k", text)
    path = write_log(tmp_path, text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "max_total_num_tokens=" in t)
    _fails(capsys, path, "--model-config", "llama-3-8b", "--sglang-version", "0.5.10.post1",
           match=f"{path}:{line}: {field}=8k is not an integer")


def test_unreadable_speculative_setting_names_it(tmp_path, capsys):
    text = _good("0.5.10.post1").replace("mem_fraction_static=0.85,",
                                         "mem_fraction_static=0.85, speculative_num_steps=3x,")
    assert "speculative_num_steps=3x" in text
    path = write_log(tmp_path, text)
    _fails(capsys, path, "--model-config", "llama-3-8b",
           match="server_args speculative_num_steps=3x (line 1): speculative_num_steps=3x is not an integer")


def test_missing_and_unreadable_files(tmp_path, capsys):
    _fails(capsys, tmp_path / "nope.log", match="nope.log: cannot read the log")
    _fails(capsys, tmp_path, match=f"{tmp_path}: is a folder, not a file")


def test_no_cell_size_without_config(tmp_path, capsys):
    path = write_log(tmp_path, _good("0.4.0"))  # 0.4.0 prints no K/V sizes
    _fails(capsys, path, match="no cell size: the log prints no 'KV Cache is allocated' sizes")


def test_no_fraction_and_no_version(tmp_path, capsys):
    text = _good("0.1.17", server_args=False, version_line=False)
    _fails(capsys, write_log(tmp_path, text), "--model-config", "llama-3-8b", match="no mem_fraction_static in the log")


@pytest.mark.parametrize("change,match", [
    ({"num_hidden_layers": None}, "field 'num_hidden_layers' / 'n_layer' / 'num_layers' / 'n_layers' is missing"),
    ({"kv_lora_rank": 512}, "field 'qk_rope_head_dim' is missing"),
    ({"num_key_value_heads": "eight"}, "field 'num_key_value_heads' must be an integer"),
])
def test_config_without_needed_fields(tmp_path, capsys, change, match):
    data = json.loads(open(get_model_config("llama-3-8b").source).read())
    data = {k: v for k, v in {**data, **change}.items() if v is not None}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    err = _fails(capsys, write_log(tmp_path, _good()), "--model-config", tmp_path, match=match)
    assert str(config) in err


@pytest.mark.parametrize("args,match", [
    (["--what-if", "foo=1"], "unknown key 'foo'"),
    (["--what-if", "mem_fraction_static"], "expected KEY=VALUE"),
    (["--what-if", "mem_fraction_static=1.5"], "must be in (0, 1)"),
    (["--what-if", "kv_cache_dtype=int3"], "kv_cache_dtype must be one of"),
    (["--what-if", "tp=zero"], "tp must be a positive integer"),
    (["--what-if", "gpu=h200"], "the current GPU is unknown"),
    (["--what-if", "gpu=tpu-v5", "--gpu", "h100-80g"], "not a kvlab GPU preset"),
    (["--gpu", "h300"], "--gpu 'h300': not a kvlab GPU preset"),
    (["--sglang-version", "latest"], "not an SGLang version"),
    (["--kv-cache-dtype", "int8"], "kv_cache_dtype must be auto or one of"),
])
def test_bad_options(tmp_path, capsys, args, match):
    _fails(capsys, write_log(tmp_path, _good()), "--model-config", "llama-3-8b", *args, match=match)


def test_tp_what_if_needs_a_config(tmp_path, capsys):
    _fails(capsys, write_log(tmp_path, _good()), "--what-if", "tp=8", match="needs --model-config")


def test_vllm_log_without_kv_memory(tmp_path, capsys):
    text = "INFO 01-02 03:04:05 [api_server.py:1805] vLLM API server version 0.10.1.1\n"
    _fails(capsys, write_log(tmp_path, text), match="no 'Available KV cache memory: X GiB' line")
