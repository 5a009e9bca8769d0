"""Findings, what-ifs and the output of ``kvlab explain-log`` on logs kvlab writes, numbers worked by hand."""

import pytest

from kvlab.model.hf_config import get_model_config
from kvlab.serving.pool import sglang_tokens
from kvlab.serving.sglang_formats import default_server_args, render_sglang_log
from kvlab.units import GiB
from tests.serving.logs import run_cli, run_json, write_log

LLAMA8 = get_model_config("llama-3-8b")  # 14.96 GiB of bf16 weights, cell 131,072 B at TP1
ISSUE_FIELDS = ["engine", "version", "tp_size", "mem_fraction_static", "mem_fraction_static_source",
                "avail_before_load_gib", "avail_after_load_gib", "cell_size_bytes", "cell_size_source",
                "max_total_num_tokens_logged", "max_total_num_tokens_computed", "computed_range", "consistent",
                "terms", "findings", "what_if"]


def _log(before=70.0, after=54.8, f=0.85, tp=1, tokens=None, version="0.5.4", cell=None, gpu_line=None, ctx=8192):
    cell = cell or LLAMA8.cell_size_bytes(tp)
    tokens = sglang_tokens(min(before if isinstance(before, list) else [before]),
                           min(after if isinstance(after, list) else [after]), f, LLAMA8.cell_size_bytes(tp)) \
        if tokens is None else tokens
    text = render_sglang_log(version, before_gib=before, after_gib=after, pool_end_gib=4.0, tokens=tokens,
                             context_len=ctx, cell_size_bytes=cell, tp_size=tp,
                             server_args=default_server_args(version, tp_size=tp, mem_fraction_static=f))
    return text + (f"{gpu_line}\n" if gpu_line else "")


def _findings(j, fid):
    return [f for f in j["findings"] if f["id"] == fid]


def test_json_has_the_issue_fields(tmp_path, capsys):
    j = run_json(capsys, write_log(tmp_path, _log()), "--model-config", "llama-3-8b")
    assert all(key in j for key in ISSUE_FIELDS)
    assert j["consistent"] is True and j["findings"] == [] and j["what_if"] == []
    names = [t["name"] for t in j["terms"]]
    assert names[:4] == ["free before load", "weights and other memory loaded",
                         "kept for activations and CUDA graphs", "KV pool budget (rest)"]
    # before 70.00 − 15.20 loaded (the 14.96 GiB of weights and a little more) − 70 × 0.15 = 10.50 slack = 44.30
    assert [t["gib"] for t in j["terms"][:4]] == [70.0, -15.2, -10.5, 44.3]


def test_resident_after_load_is_the_finding_1_signature(tmp_path, capsys):
    """Loading took 70 − 50 = 20 GiB; the config's weights are 14.96 GiB: 5.04 GiB more stayed resident."""
    j = run_json(capsys, write_log(tmp_path, _log(after=50.0)), "--model-config", "llama-3-8b")
    [f] = _findings(j, "resident_after_load")
    expected = LLAMA8.weight_bytes_per_rank(1) / GiB
    assert f["extra_gib"] == pytest.approx(20.0 - expected, abs=1e-3)
    assert f["tokens_lost"] == int((20.0 - expected) * GiB) // 131_072
    assert "finding-1 signature" in f["message"] and "notebooks/01_kv_pool_sizing.ipynb" in f["message"]


def test_no_room_for_pool(tmp_path, capsys):
    """before 40, after 10, f 0.7: slack 12 GiB > 10 GiB free; minimum viable f = 1 − 10/40 = 0.75."""
    text = "\n".join(line for line in _log(before=40.0, after=10.0, f=0.7, tokens=1).splitlines()
                     if "max_total_num_tokens" not in line and "KV Cache" not in line and "pool end" not in line)
    j = run_json(capsys, write_log(tmp_path, text), "--model-config", "llama-3-8b")
    [f] = _findings(j, "no_room_for_pool")
    assert f["severity"] == "error" and f["min_viable_fraction"] == 0.75
    assert j["max_total_num_tokens_computed"] == 0 and j["max_total_num_tokens_logged"] is None
    assert _findings(j, "no_logged_pool")


def test_pool_below_context_gives_sglangs_refusal(tmp_path, capsys):
    """Llama-3.1-8B, context 131,072; before 24, after 8, f 0.9: rest = 8 − 2.4 = 5.6 GiB -> 45,875 tokens.
    max_req_input_len = min(131,071, 45,874) − 5 = 45,869."""
    text = _log(before=24.0, after=8.0, f=0.9, ctx=131_072)
    j = run_json(capsys, write_log(tmp_path, text), "--model-config", "llama-3.1-8b")
    assert j["max_total_num_tokens_computed"] == 45_875
    [f] = _findings(j, "pool_below_context")
    assert f["max_req_input_len"] == 45_869
    assert "Input length (45875 tokens) exceeds the maximum allowed length (45869 tokens)" in f["message"]


def test_ranks_disagree_and_sglang_takes_the_minimum(tmp_path, capsys):
    j = run_json(capsys, write_log(tmp_path, _log(before=[70.0, 69.5], after=[62.0, 61.9], tp=2)),
                 "--model-config", "llama-3-8b")
    assert (j["avail_before_load_gib"], j["avail_after_load_gib"]) == (69.5, 61.9)
    found = _findings(j, "ranks_disagree")
    assert {tuple(sorted(f["values"])) for f in found} == {("TP0", "TP1")} and len(found) == 2


def test_a_rank_that_never_finished_loading(tmp_path, capsys):
    text = "\n".join(line for line in _log(before=[70.0, 70.0], after=[54.8, 54.8], tp=2).splitlines()
                     if "TP1] Load weight end" not in line)
    j = run_json(capsys, write_log(tmp_path, text), "--model-config", "llama-3-8b")
    [f] = _findings(j, "incomplete_ranks")
    assert f["ranks"] == ["TP1"] and "1 rank(s) with both readings" in f["message"]


def test_outside_interval(tmp_path, capsys):
    computed = sglang_tokens(70.0, 54.8, 0.85, 131_072)
    j = run_json(capsys, write_log(tmp_path, _log(tokens=computed - 500)), "--model-config", "llama-3-8b")
    assert j["consistent"] is False
    [f] = _findings(j, "outside_interval")
    assert "less than the readings give" in f["message"]
    # the config agrees with the log's K/V sizes: the readings are what disagree, and their causes are listed
    assert not _findings(j, "cell_mismatch") and "another process on the card" in f["message"]


def test_cell_mismatch_between_config_and_logged_kv(tmp_path, capsys):
    text = _log(cell=65_536)  # the log's K/V sizes are for half the cell: a different model or KV dtype
    j = run_json(capsys, write_log(tmp_path, text), "--model-config", "llama-3-8b")
    [f] = _findings(j, "cell_mismatch")
    lo, hi = f["logged_cell_range"]
    assert lo <= 65_536 <= hi
    assert f["severity"] == "error" and "contradicts the log" in f["message"]


def test_a_config_that_contradicts_the_log_is_blamed_not_another_process(tmp_path, capsys):
    """The log's pool and K/V sizes are for a 65,536-byte cell; llama-3-8b's is 131,072: the pool computed with it
    is half the logged one. The gap is the config's, so outside_interval says so and blames no other process."""
    tokens = sglang_tokens(70.0, 54.8, 0.85, 65_536)
    j = run_json(capsys, write_log(tmp_path, _log(cell=65_536, tokens=tokens)), "--model-config", "llama-3-8b")
    assert j["consistent"] is False
    assert [f["id"] for f in j["findings"]][:2] == ["cell_mismatch", "outside_interval"]
    [gap] = _findings(j, "outside_interval")
    assert "contradicts the log (cell_mismatch)" in gap["message"]
    assert "another process" not in gap["message"] and len(gap["message"]) < 400


def test_shared_gpu_and_gpu_what_if(tmp_path, capsys):
    """An H100 (CUDA's total 79.19 GiB; nvidia-smi's 81,559 MiB = 79.65 GiB is not the free reading's scale) with
    60 GiB free before load: 19.19 GiB held by someone else.
    gpu=h200 (143,771 MiB): free memory moves by (143,771 − 81,559) / 1024 = 60.75 GiB."""
    text = _log(before=60.0, after=44.0, gpu_line="GPU 0: NVIDIA H100 80GB HBM3")
    j = run_json(capsys, write_log(tmp_path, text), "--model-config", "llama-3-8b", "--what-if", "gpu=h200")
    [shared] = _findings(j, "shared_gpu")
    assert shared["held_gib"] == pytest.approx(79.19 - 60.0, abs=0.01)
    assert "of the 79.19 GiB" in shared["message"]
    [w] = j["what_if"]
    shift = (143_771 - 81_559) / 1024
    assert w["max_total_num_tokens"] == sglang_tokens(60.0 + shift, 44.0 + shift, 0.85, 131_072)


def test_what_ifs_worked(tmp_path, capsys):
    j = run_json(capsys, write_log(tmp_path, _log()), "--model-config", "llama-3-8b", "--what-if",
                 "mem_fraction_static=0.9", "kv_cache_dtype=fp8_e4m3", "tp=8")
    f9, fp8, tp8 = j["what_if"]
    # rest at 0.9: 54.8 − 70 × 0.1 = 47.8 GiB -> 47.8 × 2^30 / 131,072 = 47.8 × 8,192 = 391,577.6 -> 391,577
    assert f9["max_total_num_tokens"] == 391_577
    # fp8 halves the cell: 44.3 GiB × 2^30 / 65,536 = 44.3 × 16,384 = 725,811.2 -> 725,811
    assert fp8["max_total_num_tokens"] == 725_811 and fp8["cell_size_bytes"] == 65_536
    # TP8: 1 KV head per rank (cell 16,384 B); loading scales with the per-rank weights
    loaded = 15.2 * LLAMA8.weight_bytes_per_rank(8) / LLAMA8.weight_bytes_per_rank(1)
    assert tp8["cell_size_bytes"] == 16_384
    assert tp8["max_total_num_tokens"] == sglang_tokens(70.0, 70.0 - loaded, 0.85, 16_384)
    assert all(w["change"] == w["max_total_num_tokens"] - j["max_total_num_tokens_computed"] for w in j["what_if"])


def test_default_fraction_is_rederived_for_another_gpu(tmp_path, capsys):
    """No server_args: 0.4.7.post1's default on an H100 at TP1 is 0.874; on an H200 (143,771 MiB) it is
    (143,771 − 12.5 × 1024) / 143,771 = 0.911."""
    text = render_sglang_log("0.4.7.post1", before_gib=75.0, after_gib=60.0, pool_end_gib=5.0, tokens=100,
                             context_len=8192, cell_size_bytes=131_072) + "GPU 0: NVIDIA H100 80GB HBM3\n"
    j = run_json(capsys, write_log(tmp_path, text), "--model-config", "llama-3-8b", "--what-if", "gpu=h200")
    assert j["mem_fraction_static"] == 0.874 and j["mem_fraction_static_source"].startswith("default: sglang 0.4.7")
    assert j["what_if"][0]["mem_fraction_static"] == 0.911
    assert any(f["id"] == "default_fraction" for f in j["findings"])


def test_text_output(tmp_path, capsys):
    code, out, err = run_cli(capsys, write_log(tmp_path, _log(after=50.0)), "--model-config", "llama-3-8b",
                             "--what-if", "mem_fraction_static=0.9")
    assert code == 0 and err == ""
    for text in ("SGLang 0.5.4", "mem_fraction_static 0.85", "waterfall:", "free before load", "print-rounding range",
                 "findings:", "resident_after_load", "what if:", "mem_fraction_static=0.9"):
        assert text in out, text


def test_findings_are_dataclasses_keyed_by_id(tmp_path, capsys):
    """The Explanation holds ``Finding`` objects (code reads ``f.id``); the JSON is each one's ``as_dict``, its
    figures beside id, severity and message, in that order."""
    from kvlab.serving.explain import explain_log
    from kvlab.serving.result import Finding
    text = "\n".join(line for line in _log(before=40.0, after=10.0, f=0.7, tokens=1).splitlines()
                     if "max_total_num_tokens" not in line and "KV Cache" not in line and "pool end" not in line)
    path = write_log(tmp_path, text)
    exp = explain_log(path, model_config=get_model_config("llama-3-8b"))
    assert exp.findings and all(isinstance(f, Finding) for f in exp.findings)
    room = next(f for f in exp.findings if f.id == "no_room_for_pool")
    assert room.severity == "error" and room.values["min_viable_fraction"] == 0.75
    j = run_json(capsys, path, "--model-config", "llama-3-8b")
    assert j["findings"] == [f.as_dict() for f in exp.findings]
    assert list(j["findings"][0])[:3] == ["id", "severity", "message"]


def test_waterfall_terms_are_dataclasses_keyed_by_key(tmp_path, capsys):
    """``Explanation.terms()`` gives ``WaterfallTerm`` objects found by their stable key; the JSON is their as_dict."""
    from kvlab.serving.explain import explain_log
    from kvlab.serving.result import WaterfallTerm
    path = write_log(tmp_path, _log())
    exp = explain_log(path, model_config=get_model_config("llama-3-8b"))
    terms = exp.terms()
    assert all(isinstance(t, WaterfallTerm) for t in terms)
    by_key = {t.key: t for t in terms}
    assert {"free_before_load", "loaded", "kept_out", "pool_budget", "kv_pool", "rounding"} <= set(by_key)
    assert by_key["free_before_load"].gib == 70.0
    j = run_json(capsys, path, "--model-config", "llama-3-8b")
    assert j["terms"] == [t.as_dict() for t in terms]


# The JSON keys of one what-if, in order: scripts read them (docs/architecture.md's public contracts). Renaming a
# WhatIfResult field must not rename one of these; change this list only on purpose.
WHAT_IF_JSON_KEYS = ["what_if", "key", "value", "max_total_num_tokens", "change", "mem_fraction_static",
                     "avail_before_load_gib", "avail_after_load_gib", "cell_size_bytes", "note"]


def test_what_ifs_are_dataclasses_with_stable_json_keys(tmp_path, capsys):
    """``apply_what_ifs`` gives frozen ``WhatIfResult`` objects whose ``key`` is the setting changed whatever alias
    was typed (``f``, ``kv_dtype``, ``tp_size``); the JSON is each one's ``as_dict``, with the keys above."""
    import dataclasses

    from kvlab.serving.explain import explain_log
    from kvlab.serving.result import WhatIfResult
    from kvlab.serving.whatif import apply_what_ifs
    path = write_log(tmp_path, _log(gpu_line="GPU 0: NVIDIA H100 80GB HBM3"))
    items = ["f=0.9", "kv_dtype=fp8_e4m3", "tp_size=8", "gpu=h200"]
    exp = explain_log(path, model_config=get_model_config("llama-3-8b"), what_if=items)
    assert all(isinstance(w, WhatIfResult) for w in exp.what_if)
    assert [(w.label, w.key) for w in exp.what_if] == [
        ("f=0.9", "mem_fraction_static"), ("kv_dtype=fp8_e4m3", "kv_cache_dtype"), ("tp_size=8", "tp"),
        ("gpu=h200", "gpu")]
    f9 = exp.what_if[0]
    assert (f9.max_total_num_tokens, f9.change, f9.note) == (391_577, 391_577 - exp.max_total_num_tokens_computed, "")
    # 0.2 keeps 70 × 0.8 = 56 GiB out of the 54.8 left after loading: no pool, and the note says SGLang refuses
    [none] = apply_what_ifs(exp, ["mem_fraction_static=0.2"])
    assert none.max_total_num_tokens == 0 and none.note == "SGLang refuses to start: no room for the pool"
    with pytest.raises(dataclasses.FrozenInstanceError):
        f9.max_total_num_tokens = 1
    assert apply_what_ifs(exp, items) == exp.what_if
    j = run_json(capsys, path, "--model-config", "llama-3-8b", "--what-if", *items)
    assert j["what_if"] == [w.as_dict() for w in exp.what_if]
    assert all(list(w) == WHAT_IF_JSON_KEYS for w in j["what_if"])
    assert j["what_if"][1]["what_if"] == "kv_dtype=fp8_e4m3" and j["what_if"][1]["key"] == "kv_cache_dtype"
