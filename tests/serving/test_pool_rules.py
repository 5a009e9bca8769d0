"""Pool arithmetic on printed readings, worked by hand, and the version rules (defaults, cell size)."""

import pytest

from kvlab.model.hf_config import get_model_config
from kvlab.serving.cell import config_cell
from kvlab.serving.pool import Pool, cell_from_logged_sizes, sglang_tokens, sglang_tokens_range
from kvlab.serving.sglang_log import LogError
from kvlab.serving.sglang_versions import (
    READ_VERSIONS,
    cell_rule,
    default_mem_fraction,
    nearest_read,
    parse_version,
)


def test_issue_565_worked_by_hand():
    """Llama-3-8B, TP4 on A10Gs, sglang 0.1.17, f = 0.75: before 21.52, after 17.76 GiB.
    cell = 8 // 4 = 2 KV heads × 128 × 2 (K, V) × 32 layers × 2 B = 32,768 B = 2^15, so tokens = rest × 2^15.
    rest = 17.76 − 21.52 × 0.25 = 12.38 GiB -> 12.38 × 32,768 = 405,667.84 -> 405,667 (the log: 405,784).
    Lowest: 17.755 − 21.525 × 0.25 = 12.37375 -> 405,463.04 -> 405,463.
    Highest: 17.765 − 21.515 × 0.25 = 12.38625 -> 405,872.64 -> 405,872."""
    assert sglang_tokens(21.52, 17.76, 0.75, 32_768) == 405_667
    assert sglang_tokens_range(21.52, 17.76, 0.75, 32_768, 32_768) == (405_463, 405_872)


def test_cap_page_and_no_room():
    assert sglang_tokens(21.52, 17.76, 0.75, 32_768, page_size=64) == 405_667 // 64 * 64
    assert sglang_tokens(21.52, 17.76, 0.75, 32_768, max_total_tokens=100_000) == 100_000
    assert sglang_tokens(40.0, 10.0, 0.7, 1024) == 0  # slack 12 GiB > 10 GiB free: SGLang refuses to start
    with pytest.raises(ValueError, match="cell size must be positive"):
        sglang_tokens(1.0, 1.0, 0.5, 0)


def test_cell_from_logged_kv_sizes():
    """Issue 4127: #tokens 46,611, K 1.42 GB, V 1.42 GB (GiB), page 1 -> 46,612 slots.
    (2.84 ± 0.01) × 2^30 / 46,612: 65,191.14 .. 65,651.85 -> [65,192, 65,651]; the config's 65,536 B is inside."""
    est, lo, hi = cell_from_logged_sizes(2.84, 46_612, 2)
    assert (lo, hi) == (65_192, 65_651) and lo <= est <= hi
    assert lo <= get_model_config("qwq-32b").cell_size_bytes(4) <= hi


def test_versions_order_and_nearest():
    assert parse_version("0.4.2.post3") > parse_version("0.4.2") > parse_version("0.4.2rc1")
    assert parse_version("0.5.0rc0") < parse_version("0.5.0")
    assert nearest_read("0.4.6") == "0.4.5" and nearest_read("0.5.10.post1") == "0.5.10.post1"
    assert nearest_read("0.9.0") == READ_VERSIONS[-1]
    with pytest.raises(ValueError, match="not an SGLang version"):
        parse_version("latest")


@pytest.mark.parametrize("version,tp,gpu_mib,expected", [
    ("0.1.17", 4, None, 0.82), ("0.1.17", 1, None, 0.90), ("0.2.0", 1, None, 0.89), ("0.2.0", 16, None, 0.80),
    ("0.2.15", 8, None, 0.83), ("0.3.6", 8, None, 0.82), ("0.4.3.post3", 4, None, 0.85), ("0.4.5", 8, None, 0.81),
    # 0.4.7.post1 on an H100 (nvidia-smi 81,559 MiB), TP1: reserved (9.5 + 1/2) GiB = 10,240 MiB
    # -> (81,559 − 10,240) / 81,559 = 0.87445 -> 0.874, as issue 7495's server_args print
    ("0.4.7.post1", 1, 81_559, 0.874),
    # A10G (23,028 MiB), TP4: reserved (2.8 + 0.4) × 1024 = 3,276.8 -> 0.858
    ("0.5.1", 4, 23_028, 0.858),
    ("0.4.7.post1", 1, None, 0.88),  # GPU unknown: SGLang's own fallback
    # 0.5.10.post1 on an H100 NVL (95,830 MiB), TP1: 512 + 8192 × 1.5 + 256 × 2 + 128 = 13,440 MiB
    # -> (95,830 − 13,440) / 95,830 = 0.8597 -> 0.86, as the willxxy/sglang-play log prints
    ("0.5.10.post1", 1, 95_830, 0.86),
])
def test_default_mem_fraction(version, tp, gpu_mib, expected):
    default = default_mem_fraction(version, tp, gpu_mib)
    assert default.value == expected
    assert "sglang" in default.rule


def test_cell_rules_by_version():
    llama, ds = get_model_config("llama-3-8b"), get_model_config("deepseek-v2-lite")
    assert config_cell(llama, cell_rule("0.1.17"), 4, 2, False, "x") == 2 * 128 * 2 * 32 * 2
    with pytest.raises(LogError, match="8 // 16 = 0 KV heads"):
        config_cell(llama, cell_rule("0.1.17"), 16, 2, False, "x")  # 0.1.x had no max(1, ...)
    assert config_cell(llama, cell_rule("0.4.7"), 16, 2, False, "x") == 1 * 256 * 32 * 2  # replicated
    with pytest.raises(LogError, match="needs --enable-mla"):
        config_cell(ds, cell_rule("0.3.0"), 1, 2, False, "x")
    assert config_cell(ds, cell_rule("0.4.2.post3"), 8, 2, True, "x") == (512 + 64) * 27 * 2
    assert cell_rule("0.1.17").kv_dtype == "fp16" and cell_rule("0.2.9").kv_dtype == "model"
    assert cell_rule("0.4.2.post3").attn_tp and not cell_rule("0.4.0").attn_tp


def test_the_pool_is_the_device_layers_formula():
    """serving's pool on printed readings and kvlab.device.budget's pool on byte readings are one formula: the
    same tokens for the same readings, with and without a page and a --max-total-tokens cap."""
    import random

    from kvlab.device.budget import kv_budget

    rng = random.Random(20)
    for _ in range(2000):
        pre = rng.randrange(8 * 2**30, 192 * 2**30)
        avail = rng.randrange(pre // 10, pre)
        fraction = rng.choice((0.7, 0.8, 0.85, 0.874, 0.88, 0.9, 0.93))
        cell, page = rng.choice((114_688, 131_072, 48_128, 31_104)), rng.choice((1, 16, 64))
        cap = rng.choice((None, rng.randrange(1, 2_000_000)))
        tokens = sglang_tokens(pre / 2**30, avail / 2**30, fraction, cell, page, cap)
        if tokens == 0:
            continue
        budget = kv_budget(pre_model_load_bytes=pre, available_bytes=avail, mem_fraction_static=fraction,
                           cell_size_bytes=cell, context_len=8192, page_size=page, max_total_tokens=cap)
        assert budget.max_total_num_tokens == tokens
        assert Pool(pre / 2**30, avail / 2**30, fraction, cell).rest_gib * 2**30 == pytest.approx(budget.rest_bytes,
                                                                                                  abs=1)
