"""Per-version fixtures: kvlab writes a start-up log in each read version's format (its own strings, from that
version's f-strings), parses it back and recomputes the pool exactly."""

import re

import pytest

from kvlab.model.hf_config import get_model_config
from kvlab.serving import LogError, explain_sglang, parse_sglang_log
from kvlab.serving.pool import sglang_tokens
from kvlab.serving.sglang_formats import FORMATS, default_server_args, render_sglang_log
from kvlab.serving.sglang_versions import expert_map_segment_bytes, rope_reserve_for_config
from kvlab.units import GiB

LLAMA8 = get_model_config("llama-3-8b")
VERSIONS = [v for v in FORMATS if v != "0.1.14"]


def _log(version, tp=4, before=(70.11, 70.12, 70.10, 70.13), after=(54.61, 54.60, 54.62, 54.63), f=0.85,
         version_line=True, **kw):
    before, after = list(before[:tp]), list(after[:tp])
    cell = LLAMA8.cell_size_bytes(tp)
    # 0.5.8+ grows the RoPE cache between 'Load weight end' and its reading (sglang_versions.rope_reserve_bytes)
    # 0.4.7.post1/0.4.9 at TP1: a 2 MiB expert-map segment after SGLang's own before reading
    used_before = min(before) + expert_map_segment_bytes(version, tp) / GiB
    tokens = sglang_tokens(used_before, min(after) - rope_reserve_for_config(version, LLAMA8, 8192) / GiB, f, cell)
    fields = default_server_args(version, tp_size=tp, mem_fraction_static=f)
    text = render_sglang_log(version, before_gib=before, after_gib=after, pool_end_gib=[a - 50 for a in after],
                             tokens=tokens, context_len=8192, cell_size_bytes=cell, tp_size=tp, server_args=fields,
                             version_line=version_line, **kw)
    return text, tokens


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("tp", [1, 4])
def test_each_version_round_trips(version, tp):
    text, tokens = _log(version, tp)
    log = parse_sglang_log(text, "fixture.log")
    assert log.version == version and log.version_source.startswith("version line")
    exp = explain_sglang(log, model_config=LLAMA8)
    fmt = FORMATS[version]
    seen = 1 if fmt.rank0_runner else tp
    assert len([r for r in log.ranks.values() if r.before_gib is not None]) == seen
    assert exp.avail_before_load_gib == min([70.11, 70.12, 70.10, 70.13][:seen])
    assert exp.avail_after_load_gib == min([54.61, 54.60, 54.62, 54.63][:seen])
    assert exp.max_total_num_tokens_logged == tokens
    if seen == tp:  # a rank-0-only log hides the other ranks' (lower) readings
        assert exp.max_total_num_tokens_computed == tokens and exp.consistent
    assert exp.tp_size == tp and exp.mem_fraction_static == 0.85


@pytest.mark.parametrize("version,first_line", [
    ("0.1.17", r"^\[gpu_id=0\] Load weight begin\. avail mem=70\.11 GB$"),
    ("0.2.0", r"^\[gpu_id=0\] Load weight begin"),
    ("0.2.9", r"^\[gpu=0\] Load weight begin"),
    ("0.2.15", r"^\[\d\d:\d\d:\d\d TP0\] Load weight begin"),
    ("0.3.6", r"^\[2025-01-02 \d\d:\d\d:\d\d TP0\] Load weight begin"),
    ("0.4.7.post1", r"^\[2025-01-02 \d\d:\d\d:\d\d TP0\] Load weight begin"),
])
def test_prefixes_as_each_version_prints_them(version, first_line):
    text, _ = _log(version, 4)
    begin = next(line for line in text.splitlines() if "Load weight begin" in line)
    assert re.match(first_line, begin), begin


def test_tp1_drops_the_rank_tag_from_047():
    text, _ = _log("0.4.7.post1", 1)
    assert "TP0" not in text and re.search(r"^\[2025-01-02 \d\d:\d\d:\d\d\] Load weight begin", text, re.M)
    text, _ = _log("0.4.5", 1)
    assert re.search(r"\d TP0\] Load weight begin", text)


def test_kv_lines_by_version():
    assert "KV Cache is allocated" not in _log("0.4.0")[0]
    assert "KV Cache is allocated. K size:" in _log("0.4.2.post3")[0]
    assert "KV Cache is allocated. #tokens:" in _log("0.4.3.post3")[0]
    assert "KV Cache is allocated. dtype: torch.bfloat16, #tokens:" in _log("0.5.16")[0]
    assert "Using KV cache dtype: torch.bfloat16" in _log("0.5.4")[0]


@pytest.mark.parametrize("version,floor", [("0.2.9", "0.2.9"), ("0.3.6", "0.3.6"), ("0.4.3.post3", "0.4.3.post3"),
                                          ("0.4.7.post1", "0.4.7.post1"), ("0.5.10.post1", "0.5.10.post1"),
                                          ("0.5.16", "0.5.16")])
def test_without_a_version_line_the_format_bounds_the_version(version, floor):
    text, tokens = _log(version, 4, version_line=False)
    exp = explain_sglang(parse_sglang_log(text), model_config=LLAMA8)
    assert exp.version is None and exp.rules_version == floor
    assert any(f.id == "version_assumed" for f in exp.findings)
    assert exp.max_total_num_tokens_logged == tokens


def test_014_prints_no_readings():
    text = render_sglang_log("0.1.14", before_gib=70.0, after_gib=54.0, pool_end_gib=4.0, tokens=1234,
                             context_len=8192, cell_size_bytes=131_072, version_line=False)
    assert "avail mem" not in text and "Rank 0: max_total_num_token=1234" in text
    with pytest.raises(LogError, match=r"fixture.log:1: no memory readings"):
        explain_sglang(parse_sglang_log(text, "fixture.log"), model_config=LLAMA8)


def test_mla_kv_line_gives_the_latent_cell():
    ds = get_model_config("deepseek-v2-lite")
    cell = ds.cell_size_bytes(1)
    tokens = sglang_tokens(43.85, 14.34, 0.88, cell)
    text = render_sglang_log("0.5.4", before_gib=43.85, after_gib=14.34, pool_end_gib=3.97, tokens=tokens,
                             context_len=163840, cell_size_bytes=cell, mla=True,
                             server_args=default_server_args("0.5.4", tp_size=1, mem_fraction_static=0.88))
    assert "KV size:" in text
    exp = explain_sglang(parse_sglang_log(text))  # no config: the cell comes from the KV size line
    lo, hi = exp.cell_range
    assert lo <= cell <= hi and "from the log's K/V sizes" in exp.cell_size_source
    assert exp.consistent
