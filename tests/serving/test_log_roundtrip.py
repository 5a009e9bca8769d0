"""Property: a log rendered from random readings in a random version's format parses back to the same numbers,
and the recomputed pool is the one the readings give (and inside the print-rounding range)."""

import fuzz
from hypothesis import assume, given
from hypothesis import strategies as st

from kvlab.model.hf_config import get_model_config
from kvlab.serving import explain_sglang, parse_sglang_log
from kvlab.serving.pool import sglang_tokens
from kvlab.serving.sglang_formats import FORMATS, default_server_args, render_sglang_log
from kvlab.serving.sglang_log import LogError
from kvlab.serving.sglang_versions import expert_map_segment_bytes, parse_version, rope_reserve_for_config
from kvlab.units import GiB

VERSIONS = [v for v in FORMATS if v != "0.1.14"]
MODELS = [get_model_config(name) for name in ("llama-3-8b", "qwen2.5-0.5b", "qwq-32b", "qwen3-0.6b")]
centi = st.integers(min_value=100, max_value=19_000).map(lambda n: n / 100)  # 1.00 .. 190.00 GiB, as printed


@st.composite
def startups(draw):
    version = draw(st.sampled_from(VERSIONS))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    model = draw(st.sampled_from(MODELS))
    before = [draw(centi) for _ in range(tp)]
    after = [round((round(b * 100) - draw(st.integers(min_value=1, max_value=round(b * 100) - 1))) / 100, 2)
             for b in before]
    fraction = draw(st.integers(min_value=50, max_value=95)) / 100
    page = draw(st.sampled_from([1, 16, 64])) if parse_version(version) >= parse_version("0.4.5") else 1
    return version, tp, model, before, after, fraction, page


@given(startups())
@fuzz.fuzz_settings("log_roundtrip")
def test_render_parse_recompute(case):
    fuzz.record("log_roundtrip")
    version, tp, model, before, after, fraction, page = case
    cell = model.cell_size_bytes(tp)
    rope = rope_reserve_for_config(version, model) / GiB  # 0.5.8+: RoPE cache grown before SGLang's reading
    used_before = min(before) + expert_map_segment_bytes(version, tp) / GiB  # 0.4.7.post1/0.4.9 at TP1
    tokens = sglang_tokens(used_before, min(after) - rope, fraction, cell, page)
    assume(tokens > 0)  # SGLang refuses to start otherwise: no pool line to read back
    text = render_sglang_log(version, before_gib=before, after_gib=after, pool_end_gib=[max(a - 1, 0) for a in after],
                             tokens=tokens, context_len=model.context_len, cell_size_bytes=cell, tp_size=tp,
                             page_size=page, server_args=default_server_args(version, tp_size=tp,
                                                                             mem_fraction_static=fraction,
                                                                             page_size=page))
    log = parse_sglang_log(text, "random.log")
    seen = [0] if FORMATS[version].rank0_runner else range(tp)
    readings = sorted((r.before_gib, r.after_gib) for r in log.ranks.values() if r.before_gib is not None)
    assert readings == sorted((before[r], after[r]) for r in seen)
    assert {r.max_total_num_tokens for r in log.ranks.values() if r.max_total_num_tokens is not None} == {tokens}
    try:
        exp = explain_sglang(log, model_config=model)
    except LogError as exc:  # old versions split KV heads without replicating them: fewer heads than ranks crashed
        assert "KV heads (it crashed on such a setup)" in str(exc) and model.num_kv_heads < tp, exc
        return
    assert (exp.tp_size, exp.mem_fraction_static, exp.page_size) == (tp, fraction, page)
    lo, hi = exp.computed_range
    assert lo <= exp.max_total_num_tokens_computed <= hi
    if len(seen) == tp:
        assert exp.max_total_num_tokens_computed == tokens and exp.consistent
