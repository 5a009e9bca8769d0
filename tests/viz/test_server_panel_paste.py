"""Notebook 05's panel, headless: a pasted or uploaded log is judged with its own inputs (issue 35, item 1) — the
model config and GPU the log implies (kvlab.serving.log_inputs) or a question, never an earlier example's; no vLLM
log of another server; a config that contradicts the log is an error at the top of the verdict. And the waterfall's
hovers and labels (item 4)."""

from __future__ import annotations

import datetime
import json
import re

import pytest

from kvlab.serving.examples import EXAMPLES, LOG_DIR
from kvlab.serving.explain import explain_text
from kvlab.serving.log_inputs import load_shipped
from kvlab.viz.server_panel import (
    CHOOSE,
    FROM_LOG,
    PASTED,
    TICK_ANGLE,
    ServerPanel,
    explanation_waterfall,
    slanted_labels,
)
from tests.shared_data import real_data

LLAMA = "llama-3.1-8b-h100-sglang-0.5.23"
REAL = real_data("sglang_logs_examples.jsonl")
REAL_MODELS = {"sglang-issue-565": ("llama-3-8b", None), "sglang-issue-3451": ("deepseek-v2-lite", "a40"),
               "sglang-issue-4127": ("qwq-32b", None), "sglang-issue-7495": ("qwen3-0.6b", "h100-80g"),
               "repo-willxxy-sglang-play": ("qwen2.5-0.5b", None)}


def _errors(panel) -> str:
    return "".join(o.get("text", "") for o in panel.errors.outputs)


def _cell(summary: str, row: int) -> str:
    """The text of one row of the summary table (kvlab-summary-<row>)."""
    return re.search(rf"<td class='kvlab-summary-{row}'>(.*?)</td>", summary).group(1)


def _logs() -> list[tuple[str, str, str, str | None]]:
    """(name, text, the model it implies, the GPU it names) for every shipped log and every real one in ../shared."""
    out = [(ex.name, (LOG_DIR / ex.filename).read_text(), ex.model, None) for ex in EXAMPLES]
    records = [json.loads(line) for line in REAL.read_text().splitlines() if line.strip()] if REAL else []
    out += [(r["id"], "\n".join(r["lines"]) + "\n", *REAL_MODELS[r["id"]]) for r in records if r["id"] in REAL_MODELS]
    return out


def test_the_issue_case_paste_llama_after_the_default_qwen3():
    """The text of the Llama 3.1 8B log pasted over the default Qwen3 example: the same verdict as picking that log
    from the menu (415,056, consistent), not Qwen3's config (282,351, NOT consistent) nor the Qwen3 vLLM log."""
    picked = ServerPanel(example=LLAMA)
    panel = ServerPanel()
    assert panel.vllm_text.value and panel.model.value != "llama-3.1-8b"
    panel.log_text.value = (LOG_DIR / f"{LLAMA}.log").read_text()
    assert not _errors(panel) and panel.example.value == PASTED
    assert panel.model.value == "llama-3.1-8b" and panel.gpu.value == FROM_LOG and panel.vllm_text.value == ""
    assert _cell(panel.summary.value, 4) == _cell(picked.summary.value, 4)
    assert "415,056 tokens" in _cell(panel.summary.value, 4) and _cell(panel.summary.value, 4).endswith(
        ": consistent with the log")
    # the log names no GPU: the comparison waits for one, and the panel asks for it (it does not keep h100-80g)
    assert panel.comparison is None and "Choose the GPU" in panel.asks.value
    assert "needs the GPU (choose it above)" in panel.engines.figure.layout.title.text
    assert "LlamaForCausalLM" in panel.summary.value  # where the model came from


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_logs_pasted_one_after_another_are_each_judged_alone(order):
    """Every shipped and real log pasted in turn, in both orders: each explained as with its own inputs alone."""
    default, *others = _logs()  # the default example's own text first would change nothing: it comes last
    logs = (others if order == "forward" else others[::-1]) + [default]
    panel = ServerPanel()
    for name, text, model, gpu in logs:
        panel.log_text.value = text
        assert not _errors(panel), name
        assert (panel.model.value, panel.gpu.value, panel.vllm_text.value) == (model, gpu or FROM_LOG, ""), name
        alone = explain_text(text, "the log", model_config=load_shipped(model), gpu=gpu)
        exp = panel.explanation
        assert (exp.max_total_num_tokens_computed, exp.consistent, exp.tp_size) == (
            alone.max_total_num_tokens_computed, alone.consistent, alone.tp_size), name
        assert panel.tp.value == alone.tp_size and panel.kv_dtype.value == "auto", name
        assert ("Choose the GPU" in panel.asks.value) == (gpu is None), name


def test_a_log_naming_no_model_kvlab_ships_asks_and_computes_nothing():
    text = (LOG_DIR / f"{LLAMA}.log").read_text().replace("type=LlamaForCausalLM", "type=MistralForCausalLM")
    panel = ServerPanel()
    panel.log_text.value = text
    assert not _errors(panel) and panel.model.value == CHOOSE
    assert panel.explanation is None and panel.shell.results.layout.display == "none"
    assert "Choose the model config" in panel.asks.value and "MistralForCausalLM" in panel.asks.value
    panel.model.value = "llama-3.1-8b"  # the user chooses: now it is computed, with that config
    assert panel.explanation.max_total_num_tokens_computed == 415_056 and panel.shell.results.layout.display is None
    assert "Choose the model config" not in panel.asks.value


def test_a_config_that_contradicts_the_log_is_the_error_at_the_top():
    """A config.json of another model pasted by the user for the Llama log: it stays (the user chose it), and its
    contradiction with the log's K/V sizes opens the verdict; the verdict is not given."""
    panel = ServerPanel()
    panel.config_text.value = json.dumps({"num_hidden_layers": 16, "num_key_value_heads": 8, "hidden_size": 4096,
                                          "num_attention_heads": 32, "torch_dtype": "bfloat16"})
    panel.model.value = PASTED
    panel.log_text.value = (LOG_DIR / f"{LLAMA}.log").read_text()
    assert not _errors(panel) and panel.model.value == PASTED
    summary = panel.summary.value
    assert summary.startswith("<div class='kvlab-contradiction'") and "contradicts the log" in summary[:400]
    assert "cell_mismatch" in summary and "not judged" in _cell(summary, 4)
    findings = panel.findings.value
    assert findings.index("cell_mismatch") < findings.index("outside_interval")  # errors first
    assert "another process on the card" not in findings


def test_choices_belong_to_the_log_they_were_made_for():
    """A model chosen while the example was shown carries to the next pasted log; one chosen for a pasted log does not
    carry to another server's log, but stays while that log is edited."""
    panel = ServerPanel()
    panel.model.value = "llama-3-8b"  # chosen before pasting: for the next log
    llama = (LOG_DIR / f"{LLAMA}.log").read_text()
    panel.log_text.value = llama
    assert panel.model.value == "llama-3-8b"
    panel.log_text.value = llama.replace("avail mem=12.98", "avail mem=12.97")  # the same server's log, edited
    assert panel.model.value == "llama-3-8b"
    panel.log_text.value = (LOG_DIR / "qwq-32b-4xl4-sglang-0.4.3.post3.log").read_text()  # another server
    assert panel.model.value == "qwq-32b" and not _errors(panel)


def test_an_uploaded_log_brings_its_own_inputs():
    panel = ServerPanel()
    text = (LOG_DIR / f"{LLAMA}.log").read_bytes()
    panel.log_upload.value = ({"name": "mine.log", "type": "text/plain", "size": len(text), "content": text,
                               "last_modified": datetime.datetime(2025, 1, 2, tzinfo=datetime.timezone.utc)},)
    assert not _errors(panel) and panel.example.value == PASTED
    assert panel.model.value == "llama-3.1-8b" and panel.vllm_text.value == ""
    assert panel.explanation.max_total_num_tokens_computed == 415_056 and panel.explanation.consistent


def test_not_a_log_is_one_line_and_no_question():
    panel = ServerPanel()
    panel.log_text.value = "hello\n"
    assert _errors(panel).startswith("kvlab: error: the log: not an SGLang or vLLM start-up log")
    assert panel.asks.value == ""


# ---- item 4: the waterfall ----------------------------------------------------------------------------------
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_waterfall_hover_is_each_bars_term(example):
    exp = explain_text((LOG_DIR / example.filename).read_text(), example.name, model_config=example.model_config(),
                       gpu=example.gpu)
    trace = explanation_waterfall(exp).data[0]
    terms = {t.name: t for t in exp.terms()}
    assert "%{y" not in trace.hovertemplate  # a waterfall's y in a hover is the running level, not the term
    for (name, value, how), text in zip(trace.customdata, trace.text):
        term = terms[name]
        assert value == text and float(value.rstrip("*")) == pytest.approx(term.gib, abs=0.005)
        assert value.endswith("*") == bool(term.assumed) == ("* assumed, not read" in how)
        assert all(len(line) <= 90 for line in how.split("<br>"))  # wrapped: no hover wider than the figure


def test_the_default_weights_hover_is_the_term_not_the_level():
    """The issue's case: "weights" hovered as 21.86 GiB (the level after it) on a −55.17 bar; the mark stays."""
    trace = ServerPanel().waterfall.data[0]
    row = next(c for c in trace.customdata if c[0] == "weights and other memory loaded")
    assert row[1] == "-55.17*" and "assumed, not read" in row[2]
    assert "%{customdata[1]} GiB" in trace.hovertemplate


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_slanted_labels_leave_room_for_the_footnote(example):
    """The x labels slant at one angle whatever the width, inside a bottom margin sized for them; the note under
    the figure starts below that margin (the labels ran into it at 1280 px)."""
    exp = explain_text((LOG_DIR / example.filename).read_text(), example.name, model_config=example.model_config(),
                       gpu=example.gpu)
    fig = explanation_waterfall(exp)
    shown = list(fig.data[0].x)
    labels, bottom = slanted_labels([row[0] for row in fig.data[0].customdata])
    assert shown == labels and all(len(line) <= 18 for label in shown for line in label.split("<br>")
                                   if " " in line)
    assert fig.layout.xaxis.tickangle == TICK_ANGLE
    lines = max(label.count("<br>") + 1 for label in shown)
    assert bottom >= 0.5 * max(len(line) for label in shown for line in label.split("<br>")) * 0.6 * 13 + lines * 13
    notes = fig.layout.annotations
    if not notes:
        assert fig.layout.margin.b == bottom
        return
    [note] = notes
    assert -note.yshift >= bottom and note.yanchor == "top"  # the note's top is below the labels' margin
    assert fig.layout.margin.b >= -note.yshift + 16 * (note.text.count("<br>") + 1)
