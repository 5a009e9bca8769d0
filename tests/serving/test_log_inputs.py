"""What a start-up log implies about its own inputs (kvlab.serving.log_inputs): the model config from the name the log
gives, else from its architecture and its own numbers; the GPU from the product name it prints; what it leaves for
the user to choose. On the shipped example logs, on the five real logs in ../shared, and on logs written here."""

from __future__ import annotations

import json

import pytest

from kvlab.serving.examples import EXAMPLES, LOG_DIR
from kvlab.serving.explain import explain_text
from kvlab.serving.log_inputs import log_inputs, match_name, normalized_name
from kvlab.serving.sglang_log import LogError
from tests.shared_data import real_data

REAL = real_data("sglang_logs_examples.jsonl")
RECORDS = [json.loads(line) for line in REAL.read_text().splitlines() if line.strip()] if REAL else []
# each real log's model as kvlab ships it (tests/serving/test_real_logs.py checks their geometry against the record)
# and the GPU the log prints (None: it prints none)
REAL_INPUTS = {"sglang-issue-565": ("llama-3-8b", None), "sglang-issue-3451": ("deepseek-v2-lite", "a40"),
               "sglang-issue-4127": ("qwq-32b", None), "sglang-issue-7495": ("qwen3-0.6b", "h100-80g"),
               "repo-willxxy-sglang-play": ("qwen2.5-0.5b", None)}
LLAMA = (LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log").read_text()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_a_shipped_log_implies_its_example_model(example):
    """The shipped logs name no model ('org/model') and no GPU: the architecture and the log's numbers (cell size
    from the K/V sizes or vLLM's available memory, the context length, what loading took) find the example's model;
    the GPU is left to choose."""
    li = log_inputs((LOG_DIR / example.filename).read_text(), example.name)
    assert (li.engine, li.model, li.tp_size) == (example.engine, example.model, example.tp_size)
    assert li.gpu is None and li.missing == ("GPU",) and "names no GPU" in li.gpu_source
    assert "fit only" in li.model_source


@pytest.mark.skipif(not RECORDS, reason="../shared/real-data/sglang_logs_examples.jsonl is absent (only CI and the "
                    "project's machines have ../shared; a user's clone does not)")
@pytest.mark.parametrize("record_id", sorted(REAL_INPUTS))
def test_a_real_log_names_its_model_and_gpu(record_id):
    record = next((r for r in RECORDS if r["id"] == record_id), None)
    if record is None:
        pytest.skip(f"record {record_id} absent")
    li = log_inputs("\n".join(record["lines"]) + "\n")
    assert (li.model, li.gpu) == REAL_INPUTS[record_id]
    assert li.tp_size == record["tp"] and li.engine == "sglang"
    assert li.model_source.startswith("the log names") and normalized_name(li.named).startswith(li.model)


@pytest.mark.parametrize("name,expected", [
    ("/mnt/ebs_volume/models/llama/llama-3-8b-instruct", "llama-3-8b"), ("meta-llama/Meta-Llama-3.1-8B-Instruct/",
                                                                         "llama-3.1-8b"),
    ("'Qwen/QwQ-32B'", "qwq-32b"), ("Qwen/Qwen3-0.6B-FP8", "qwen3-0.6b-fp8"), ("deepseek-ai/DeepSeek-V2-Lite-Chat",
                                                                               "deepseek-v2-lite"),
])
def test_normalized_name(name, expected):
    assert normalized_name(name) == expected


def test_a_quantized_name_maps_to_the_same_geometry_and_an_unknown_one_to_none():
    model, how = match_name("Qwen/Qwen3-0.6B-FP8")
    assert model == "qwen3-0.6b" and "quantized checkpoint" in how
    assert match_name("Qwen3-235B-A22B-FP8")[0] == "examples/models/qwen3-235b-a22b-fp8"  # exact beats unquantized
    assert match_name("org/model") == (None, "the log names 'org/model', not a model kvlab ships")


def test_a_named_model_beats_the_architecture():
    text = LLAMA.replace("model_path='org/model'", "model_path='/models/Meta-Llama-3-8B-Instruct'")
    li = log_inputs(text)
    assert li.model == "llama-3-8b" and li.named == "/models/Meta-Llama-3-8B-Instruct"


def test_several_models_fit_then_the_user_is_asked():
    """Without the K/V sizes and the context length, Llama 3 8B and Llama 3.1 8B (same cell, same weights) both
    fit a LlamaForCausalLM log: kvlab names both and chooses neither."""
    text = "\n".join(line for line in LLAMA.splitlines() if "KV Cache is allocated" not in line)
    text = text.replace(", context_len=131072", "")
    li = log_inputs(text)
    assert li.model is None and li.missing == ("model config", "GPU")
    assert {"llama-3-8b", "llama-3.1-8b"} <= set(li.candidates)
    assert "fit several models" in li.model_source and "llama-3-8b" in li.model_source


def test_an_architecture_kvlab_does_not_ship_asks():
    li = log_inputs(LLAMA.replace("type=LlamaForCausalLM", "type=MistralForCausalLM"))
    assert li.model is None and li.candidates == () and "MistralForCausalLM" in li.model_source


def test_a_log_of_another_cell_fits_no_model():
    """The K/V sizes of a 4× larger cell: no LlamaForCausalLM kvlab ships fits, so none is chosen."""
    text = LLAMA.replace("K size: 25.33 GB, V size: 25.33 GB", "K size: 101.32 GB, V size: 101.32 GB")
    li = log_inputs(text)
    assert li.model is None and "fit no model" in li.model_source


def test_gpu_from_the_product_name_or_the_vllm_total():
    assert log_inputs(LLAMA + "GPU 0: NVIDIA H100 80GB HBM3\n").gpu == "h100-80g"
    li = log_inputs(LLAMA + "GPU 0: NVIDIA Z9000\n")
    assert li.gpu is None and "'NVIDIA Z9000', not a GPU kvlab knows" in li.gpu_source
    vllm = (LOG_DIR / "qwen3-235b-fp8-4xh100-vllm-0.10.1.1.log").read_text()
    profile = "INFO total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.90) = 71.27GiB\n"
    assert log_inputs(profile + vllm).gpu == "h100-80g"
    assert log_inputs("INFO non-default args: {'model': 'Qwen/Qwen3-235B-A22B-FP8'}\n" + vllm).model == \
        "examples/models/qwen3-235b-a22b-fp8"


@pytest.mark.parametrize("text", ["hello\n", "Load weight begin. avail mem=70.00 GB\n"])
def test_not_a_log_is_the_explanations_error(text):
    with pytest.raises(LogError) as implied:
        log_inputs(text, "the log")
    with pytest.raises(LogError) as explained:
        explain_text(text, "the log")
    assert str(implied.value) == str(explained.value)


def test_the_signature_tells_servers_apart():
    a, b = log_inputs(LLAMA), log_inputs(LLAMA.replace("avail mem=63.65", "avail mem=63.60"))
    assert a.signature == b.signature  # the same server's log, edited
    other = log_inputs((LOG_DIR / "qwq-32b-4xl4-sglang-0.4.3.post3.log").read_text())
    assert other.signature != a.signature
