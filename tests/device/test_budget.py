"""KV-budget arithmetic, term by term, against numbers worked by hand (SGLang's formulas)."""

import pytest

from kvlab.device.budget import NoKVMemoryError, kv_budget

GIB = 1 << 30


def test_budget_terms_worked_example():
    """The Llama-3-8B example of docs/semantics.md#worked-example-llama-3-8b:
    pre 79.0 GiB, 64.0 GiB free after load, f = 0.88.
    slack = 79.0 × 0.12 = 9.48 GiB; rest = 64.0 − 9.48 = 54.52 GiB (int of the float bytes);
    cell = 8 kv heads × 256 × 32 layers × 2 B = 131,072 B -> 446,627 tokens (floor)."""
    b = kv_budget(pre_model_load_bytes=79 * GIB, available_bytes=64 * GIB, mem_fraction_static=0.88,
                  cell_size_bytes=131_072, context_len=131_072)
    assert b.slack_bytes == int(79 * (1 - 0.88) * GIB)
    assert b.rest_bytes == int((64 - 79 * (1 - 0.88)) * GIB)
    assert abs(b.rest_bytes / GIB - 54.52) < 1e-9
    assert b.max_total_num_tokens == b.rest_bytes // 131_072 == 446_627
    # serving limit: min(context − 1, tokens − 1) − 5
    assert b.max_req_len == 131_071
    assert b.max_req_input_len == 131_066
    assert b.kv_pool_bytes == 446_627 * 131_072


def test_serving_limit_from_pool_pr_numbers():
    """The PR: a 1,741-token pool gives max_req_input_len 1,735 and refuses 3,034 tokens in SGLang's words."""
    cell = 82_944
    pre = 70 * GIB
    available = 1741 * cell + 100 + int(pre * 0.2)  # a few bytes over 1,741 cells of rest
    b = kv_budget(pre_model_load_bytes=pre, available_bytes=available, mem_fraction_static=0.8,
                  cell_size_bytes=cell, context_len=65_536)
    assert b.max_total_num_tokens == 1741
    assert b.max_req_len == 1740 and b.max_req_input_len == 1735
    assert b.validate_input_length(3034) == (
        "Input length (3034 tokens) exceeds the maximum allowed length (1735 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    assert b.validate_input_length(1735) is not None  # SGLang refuses N == M too (>=)
    assert b.validate_input_length(1734) is None


def test_page_floor():
    b = kv_budget(pre_model_load_bytes=10 * GIB, available_bytes=5 * GIB, mem_fraction_static=0.9,
                  cell_size_bytes=1000, context_len=1 << 20, page_size=64)
    raw = b.rest_bytes // 1000
    assert b.max_total_num_tokens == raw - raw % 64


def test_no_memory_left_error_suggests_fraction():
    """available 10 GiB, pre 40 GiB, f 0.7: slack 12 GiB > available. minimum viable f = 1 − 10/40 = 0.75."""
    with pytest.raises(NoKVMemoryError) as err:
        kv_budget(pre_model_load_bytes=40 * GIB, available_bytes=10 * GIB, mem_fraction_static=0.7,
                  cell_size_bytes=1024, context_len=4096)
    msg = str(err.value)
    assert "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7" in msg
    assert "Raise --mem-fraction-static above 0.750" in msg and "0.7500" in msg


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, "0.8"])
def test_bad_fraction_names_value(fraction):
    with pytest.raises(ValueError, match="mem_fraction_static must be in \\(0, 1\\)"):
        kv_budget(pre_model_load_bytes=GIB, available_bytes=GIB, mem_fraction_static=fraction,
                  cell_size_bytes=1, context_len=1)


@pytest.mark.parametrize("prompt", [0, -3])
def test_bad_prompt_length(prompt):
    b = kv_budget(pre_model_load_bytes=GIB, available_bytes=GIB, mem_fraction_static=0.5,
                  cell_size_bytes=1024, context_len=4096)
    with pytest.raises(ValueError, match=f"got {prompt}"):
        b.validate_input_length(prompt)
