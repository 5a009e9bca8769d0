"""Assumed vs read: readings a log marks as rebuilt (``# kvlab-reconstructed:``) make every number resting on them
show as assumed — findings, waterfall terms, the engine comparison's terms and gap rows, and their text."""

import pytest

from kvlab.model.hf_config import load_model_config
from kvlab.serving import explain_log
from kvlab.serving.engine_compare import compare_explanation
from kvlab.serving.examples import DATA_DIR, LOG_DIR, QWEN_FP8
from kvlab.serving.explain import explain_text
from kvlab.serving.provenance import MARKER, MarkerError, parse_reconstructed
from kvlab.serving.text import format_comparison, format_explanation
from kvlab.serving.vllm_log import parse_vllm_log

SGLANG = LOG_DIR / "qwen3-235b-fp8-4xh100-sglang-0.4.9.log"
VLLM = LOG_DIR / "qwen3-235b-fp8-4xh100-vllm-0.10.1.1.log"


@pytest.fixture(scope="module")
def config():
    return load_model_config(DATA_DIR / QWEN_FP8)


def _unmarked(path) -> str:
    return "".join(line for line in path.read_text(encoding="utf-8").splitlines(True) if not line.startswith(MARKER))


def test_the_shipped_report_logs_name_their_rebuilt_readings():
    assert set(parse_reconstructed(SGLANG.read_text())) == {"free_before_load", "free_after_load"}
    assert set(parse_reconstructed(VLLM.read_text())) == {"model_loading", "available@1", "available@2",
                                                         "available@3"}


def test_an_unknown_reading_name_is_an_error_naming_the_line():
    with pytest.raises(MarkerError, match=r"my\.log:2: .*'free_befor_load'"):
        parse_reconstructed(f"x\n{MARKER} free_befor_load — typo\n", "my.log")


def test_shared_gpu_on_a_rebuilt_reading_is_assumed_and_says_so(config):
    exp = explain_log(SGLANG, model_config=config, gpu="h100-80g")
    shared = next(f for f in exp.findings if f.id == "shared_gpu")
    assert shared.basis == "assumed" and "77.03 GiB" in shared.assumed[0]
    assert "another process shares this GPU" not in shared.message and "rebuilt" in shared.message
    assert shared.as_dict()["basis"] == "assumed"
    assert all(t.basis == "assumed" for t in exp.terms() if t.key in ("free_before_load", "kv_pool", "kept_out"))
    text = format_explanation(exp)
    flat = " ".join(text.split())  # long lines wrap at 118 columns
    assert "[info · assumed] shared_gpu" in text and "consistent (assumed" in flat
    assert max(len(line) for line in text.splitlines() if "  [" in line[:8]) <= 118
    assert "+77.03 GiB*" in text


def test_the_same_log_without_the_marker_is_read(config):
    exp = explain_text(_unmarked(SGLANG), "user.log", model_config=config, gpu="h100-80g")
    shared = next(f for f in exp.findings if f.id == "shared_gpu")
    assert shared.basis == "read" and "another process shares this GPU" in shared.message
    assert all(t.basis == "read" for t in exp.terms())
    assert "assumed" not in format_explanation(exp)


def test_comparison_gap_rows_resting_on_rebuilt_values_are_assumed(config):
    exp = explain_log(SGLANG, model_config=config, gpu="h100-80g")
    comp = compare_explanation(exp, vllm_log=parse_vllm_log(VLLM.read_text(), str(VLLM)))
    rows = {r["kind"]: r for r in comp.gap}
    assert rows["base"]["tokens"] == 8197 and rows["base"]["basis"] == "assumed"  # the +8,197-token term
    assert round(rows["activation"]["gib"], 2) == 7.60 and rows["activation"]["basis"] == "assumed"
    assert any("non-torch" in a for a in rows["activation"]["assumed"])  # kvlab's own assumption, too
    assert rows["cell"]["basis"] == "read"
    peak = next(t for t in comp.vllm.terms if t.kind == "activation")
    assert peak.basis == "assumed" and any("available KV cache memory 8.02 GiB" in a for a in peak.assumed)
    assert "assumed" in comp.sglang.notes[0]
    assert "* rests on an assumed value" in format_comparison(comp)


def test_vllm_terms_on_rebuilt_readings_are_assumed(config):
    exp = explain_log(VLLM, model_config=config, gpu="h100-80g")
    assert {t.key: t.basis for t in exp.terms()} == {"weights": "assumed", "available": "assumed",
                                                    "kv_pool": "assumed"}
    read = explain_text(_unmarked(VLLM), "user.log", model_config=config, gpu="h100-80g")
    assert {t.basis for t in read.terms()} == {"read"}
    assert read.to_json()["consistent_basis"] == "read" and exp.to_json()["consistent_basis"] == "assumed"
