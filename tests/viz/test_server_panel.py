"""Notebook 05's panel headless: set a control, assert on the drawn figures and the summary (no browser)."""

from __future__ import annotations

import datetime
import json

import pytest

from kvlab.serving.examples import EXAMPLES, LOG_DIR
from kvlab.serving.explain import explain_text
from kvlab.serving.whatif import apply_what_ifs
from kvlab.viz.server_panel import PASTED, ServerPanel


@pytest.fixture(scope="module")
def panel() -> ServerPanel:
    return ServerPanel()


def _errors(panel) -> str:
    return "".join(o.get("text", "") for o in panel.errors.outputs)


def test_default_is_the_report(panel):
    assert not _errors(panel)
    assert panel.explanation.max_total_num_tokens_logged == 367_404
    assert panel.comparison.logged == {"sglang": 367_404, "vllm": 178_880}
    # the engines' waterfalls end in the budgets; the gap bars add up to the token gap
    assert [t.y[-1] for t in panel.engines.data] == pytest.approx(
        [panel.comparison.sglang.budget_gib, panel.comparison.vllm.budget_gib], abs=1e-4)
    assert sum(panel.gap.data[0].x) == panel.comparison.sglang.tokens - panel.comparison.vllm.tokens
    assert panel.fraction.value == pytest.approx(0.93) and panel.tp.value == 4
    assert "367,404 tokens" in panel.summary.value and "consistent with the log" in panel.summary.value


def test_what_if_controls_match_the_what_if_module(panel):
    panel.fraction.value = 0.9
    panel.tp.value = 8
    assert not _errors(panel)
    expected = apply_what_ifs(panel.explanation, ["mem_fraction_static=0.9", "tp=8"])
    assert [w.key for w in panel.explanation.what_if] == ["mem_fraction_static", "tp"]
    assert panel.explanation.what_if == expected
    assert list(panel.what_ifs.data[0].y) == [panel.explanation.max_total_num_tokens_computed] + [
        w.max_total_num_tokens for w in expected]
    assert list(panel.what_ifs.data[0].x) == ["as explained", "mem_fraction_static=0.9", "tp=8"]
    panel.example.value = EXAMPLES[2].name  # another example: its own fraction and TP, no what-if
    assert panel.fraction.value == pytest.approx(round(panel.explanation.mem_fraction_static, 2))
    assert panel.tp.value == EXAMPLES[2].tp_size and list(panel.what_ifs.data[0].x) == ["as explained"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_every_example_draws(panel, example):
    panel.example.value = example.name
    assert not _errors(panel)
    assert panel.explanation.consistent is True
    assert panel.comparison is not None and len(panel.engines.data) == 2


def test_pasted_log_and_config(panel):
    text = (LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log").read_text()
    config = (LOG_DIR.parents[1] / ".." / "kvlab" / "model" / "presets" / "llama-3.1-8b.json").resolve().read_text()
    panel.example.value = PASTED
    panel.config_text.value = config
    panel.model.value = PASTED
    panel.log_text.value = text
    assert not _errors(panel)
    assert panel.explanation.log_path == "the log"
    assert panel.explanation.max_total_num_tokens_computed == explain_text(
        text, "x", model_config=panel.model_config(), gpu="h100-80g").max_total_num_tokens_computed
    assert panel.explanation.model_config.name == json.loads(config).get("_name_or_path", "pasted config")


def test_uploaded_log(panel):
    text = (LOG_DIR / "qwq-32b-4xl4-sglang-0.4.3.post3.log").read_bytes()
    panel.model.value = "qwq-32b"
    panel.gpu.value = "l4"
    panel.log_upload.value = ({"name": "mine.log", "type": "text/plain", "size": len(text), "content": text,
                               "last_modified": datetime.datetime(2025, 1, 2, tzinfo=datetime.timezone.utc)},)
    assert not _errors(panel) and panel.example.value == PASTED
    assert panel.explanation.max_total_num_tokens_logged == 42_377


@pytest.mark.parametrize("field,value,match", [
    ("log_text", "hello\n", "kvlab: error: the log: not an SGLang or vLLM start-up log"),
    ("config_text", "{not json", "kvlab: error: pasted config.json:1:2: not valid JSON"),
    ("config_text", '{"a": ' + "[" * 5000 + "]" * 5000 + "}", "kvlab: error: pasted config.json: field 'a' is nested"),
])
def test_bad_input_shows_one_line(panel, field, value, match):
    panel.example.value = EXAMPLES[0].name
    if field == "config_text":
        panel.model.value = PASTED
    getattr(panel, field).value = value
    assert _errors(panel).startswith(match) and "Traceback" not in _errors(panel)
    panel.model.value = EXAMPLES[0].model
    panel.example.value = EXAMPLES[2].name
    assert not _errors(panel)


def test_a_tp_size_the_menu_lacks_is_offered(panel):
    from kvlab.serving.pool import sglang_tokens
    from kvlab.serving.sglang_formats import default_server_args, render_sglang_log

    cell = 32 * 2 * 256 * 2  # Llama 3.1 8B at TP 3: 8 // 3 = 2 KV heads per rank
    tokens = sglang_tokens(70.0, 50.0, 0.85, cell)
    panel.example.value = PASTED
    panel.model.value = "llama-3.1-8b"
    panel.log_text.value = render_sglang_log(
        "0.4.5", before_gib=70.0, after_gib=50.0, pool_end_gib=5.0, tokens=tokens, context_len=8192,
        cell_size_bytes=cell, tp_size=3, server_args=default_server_args("0.4.5", tp_size=3, mem_fraction_static=0.85))
    assert not _errors(panel)
    assert panel.tp.value == 3 and 3 in panel.tp.options and list(panel.what_ifs.data[0].x) == ["as explained"]
    assert panel.explanation.max_total_num_tokens_computed == tokens


def test_pasted_kv_only_config_explains_and_names_what_it_lacks(panel):
    """A config.json with only the KV geometry: the same pool as the preset; the findings name the absent
    fields, the comparison's place says what it needs, a TP what-if is not drawn (no weights to scale)."""
    text = (LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log").read_text()
    kv_only = {"num_hidden_layers": 32, "num_key_value_heads": 8, "hidden_size": 4096, "num_attention_heads": 32,
               "torch_dtype": "bfloat16"}
    panel.example.value = "llama-3.1-8b-h100-sglang-0.5.23"
    full_tokens = panel.explanation.max_total_num_tokens_computed
    panel.example.value = PASTED
    panel.config_text.value = json.dumps(kv_only)
    panel.model.value = PASTED
    panel.log_text.value = text
    panel.tp.value = 2
    assert not _errors(panel)
    assert panel.explanation.max_total_num_tokens_computed == full_tokens
    assert "weights_unchecked" in panel.findings.value and "&#x27;vocab_size&#x27;" in panel.findings.value
    assert panel.comparison is None and "'vocab_size'" in panel.engines.figure.layout.title.text
    assert list(panel.what_ifs.data[0].x) == ["as explained"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_waterfall_terms_have_stable_keys(example):
    """Every term carries a key that code finds it by (the label is only shown): SGLang's waterfall stops at the
    term keyed pool_budget, whatever its label says."""
    from kvlab.viz.server_panel import explanation_waterfall

    exp = explain_text((LOG_DIR / example.filename).read_text(), example.name, model_config=example.model_config(),
                       gpu=example.gpu)
    keys = [t.key for t in exp.terms()]
    assert len(keys) == len(set(keys))
    if example.engine == "vllm":
        assert keys == ["weights", "available", "kv_pool"]
        return
    assert keys[0] == "free_before_load" and keys[-4:] == ["kept_out", "pool_budget", "kv_pool", "rounding"]
    budget = next(t for t in exp.terms() if t.key == "pool_budget")
    bars = explanation_waterfall(exp).data[0]
    assert bars.customdata[-1][0] == budget.name and bars.y[-1] == budget.gib


def test_what_if_controls_are_off_for_a_vllm_log_and_say_why():
    panel = ServerPanel()
    assert not panel.fraction.disabled and not panel.what_if_note.value
    panel.example.value = "qwen3-235b-fp8-4xh100-vllm-0.10.1.1"
    assert not _errors(panel)
    assert all(w.disabled for w in (panel.fraction, panel.kv_dtype, panel.tp, panel.gpu_whatif))
    assert not panel.fraction.readout  # the last SGLang log's 0.93 is not shown beside a vLLM log
    assert "vLLM log has no mem_fraction_static" in panel.what_if_note.value
    assert "not for a vLLM log" in panel.what_ifs.figure.layout.title.text
    assert "move a what-if control" not in panel.what_ifs.figure.layout.title.text
    panel.example.value = "llama-3.1-8b-h100-sglang-0.5.23"
    assert not panel.fraction.disabled and panel.fraction.readout and not panel.what_if_note.value


def test_assumed_findings_and_terms_are_marked_in_the_panel():
    panel = ServerPanel()  # vllm#21348's SGLang log: its readings were rebuilt (data/README.md)
    assert "kvlab-assumed" in panel.findings.value and "(assumed: rests on" in panel.findings.value
    assert all(text.endswith("*") for text in panel.waterfall.data[0].text)
    notes = [a.text for a in panel.waterfall.figure.layout.annotations]
    assert any("assumed, not read" in n and "77.03 GiB" in n for n in notes)
    assert "assumed inputs" in panel.summary.value and "(assumed: the readings were rebuilt" in panel.summary.value
    gap_text = dict(zip(panel.gap.data[0].y, panel.gap.data[0].text))
    assert any(t.endswith("*") for t in gap_text.values())


def test_static_pages_never_ask_to_move_a_control(monkeypatch):
    from kvlab.viz.server_panel import what_if_figure

    exp = explain_text((LOG_DIR / "llama-3.1-8b-h100-sglang-0.5.23.log").read_text(), "x.log")
    assert "move a what-if control" in what_if_figure(exp).layout.title.text
    monkeypatch.setenv("KVLAB_STATIC", "1")
    assert "move a what-if control" not in what_if_figure(exp).layout.title.text
