"""vLLM's KV budget and SGLang's from the same inputs, worked by hand; each read version's rule; bad input."""

import pytest

from kvlab.model.hf_config import get_model_config
from kvlab.serving.engine_compare import MemoryInputs, compare_engines, kv_cell, sglang_budget
from kvlab.serving.vllm_budget import (
    Amount,
    BudgetError,
    estimate_activation_peak,
    tokens_in,
    vllm_budget,
    vllm_rule,
)
from kvlab.units import GiB

LLAMA = get_model_config("llama-3.1-8b")  # 32 layers x 8 KV heads x (128 + 128) x 2 B = 131,072 B per token at TP 1
CELL = 131_072


def _mem(total=80.0, startup=1.0, weights=50.0, activation=3.0, non_torch=1.0, cuda_graph=0.5) -> MemoryInputs:
    return MemoryInputs(*(Amount(v, name) for v, name in ((total, "total"), (startup, "startup"), (weights, "weights"),
                                                          (activation, "activation"), (non_torch, "non_torch"),
                                                          (cuda_graph, "cuda_graph"))))


def _vllm(version, mem=None, util=None, block=16, cell=CELL, extensible=None):
    m = mem or _mem()
    return vllm_budget(total=m.total, startup=m.startup, weights=m.weights, activation=m.activation,
                       non_torch=m.non_torch, cuda_graph=m.cuda_graph, cell_size_bytes=cell,
                       rule=vllm_rule(version, extensible=extensible), gpu_memory_utilization=util, block_size=block)


def test_cell_is_worked_by_hand():
    assert kv_cell(LLAMA, 1, 2) == (32 * 8 * 256 * 2, 8) == (CELL, 8)
    # 16 ranks share 8 KV heads: each rank keeps one (replicated), the same cell as TP 8
    assert kv_cell(LLAMA, 16, 2) == kv_cell(LLAMA, 8, 2) == (32 * 1 * 256 * 2, 1)


@pytest.mark.parametrize("version", ["0.6.3", "0.9.2", "0.10.1.1"])
def test_profiled_budget_by_hand(version):
    """0.9 × 80 − (50 weights + 3 activation + 1 non-torch) = 18 GiB; a 16-token block of 131,072-B cells is 2 MiB:
    18 GiB = 9,216 blocks = 147,456 tokens. CUDA graphs are not subtracted (captured later, from the headroom)."""
    b = _vllm(version)
    assert b.budget_gib == pytest.approx(18.0)
    assert b.tokens == 9_216 * 16 == 147_456
    assert any("captured after sizing" in n for n in b.notes)
    assert any("reserved (cached) peak" in n for n in b.notes) == (version == "0.6.3")
    assert sum(t.gib for t in b.terms[:-1]) == pytest.approx(b.terms[-1].gib)


def test_cuda_graph_estimate_from_0_21():
    b = _vllm("0.25.0")
    assert b.budget_gib == pytest.approx(17.5)  # 18 − 0.5 GiB of CUDA graphs
    assert b.tokens == int(17.5 * 512) * 16 == 143_360
    assert any("not read" in n for n in b.notes)  # the 0.21 rule comes from 0.34.0's log message


def test_extensible_cache_today():
    """0.34.0, util 1.0 (its default): used = 50 + 1 + 0.5 = 51.5; margin = max(1, 0.75 × 3) = 2.25;
    min(80 − 51.5, 79 − 51.5 − 2.25) − 3 = 22.25 GiB = 11,392 blocks."""
    b = _vllm("0.34.0")
    assert b.budget_gib == pytest.approx(22.25)
    assert b.tokens == 11_392 * 16
    # an explicit 0.9 caps it at the utilization instead: min(72 − 51.5, 25.25) − 3 = 17.5
    assert _vllm("0.34.0", util=0.9).budget_gib == pytest.approx(17.5)
    # the estimate path (extensible cache off) uses 0.92 and subtracts the estimate: 73.6 − 54 − 0.5 = 19.1
    assert _vllm("0.34.0", extensible=False).budget_gib == pytest.approx(0.92 * 80 - 54.5)


def test_rule_names_the_version_read():
    assert vllm_rule("0.7.3").read == "0.6.3"
    assert vllm_rule("0.8.0").read == vllm_rule("0.20.2").read == "0.10.1.1"
    assert vllm_rule(None).read == "0.34.0" and vllm_rule("0.34.0").default_utilization == 1.0
    assert "determine_available_memory" in _vllm("0.9.2").rule and "0.10.1.1" in _vllm("0.9.2").rule


def test_v1_refuses_when_free_memory_is_below_the_request():
    b = _vllm("0.10.1.1", mem=_mem(startup=9.0))  # 71 GiB free < 0.9 × 80 = 72 GiB requested
    assert any("refuses to start" in n for n in b.notes)


def test_sglang_budget_by_hand():
    """before 79, after 29, f 0.9: rest = 29 − 79 × 0.1 = 21.1 GiB; int(21.1 × 2^30) // 131,072 tokens."""
    s = sglang_budget(_mem(), mem_fraction_static=0.9, cell_size_bytes=CELL)
    assert s.budget_gib == pytest.approx(21.1)
    assert s.tokens == int((29 - 79 * (1 - 0.9)) * GiB) // CELL == 172_851


def test_gap_adds_up_term_by_term():
    comp = compare_engines(LLAMA, None, 1, mem_fraction_static=0.9, vllm_version="0.10.1.1", inputs=_mem())
    assert comp.sglang.tokens == 172_851 and comp.vllm.tokens == 147_456
    gap = {row["kind"]: row for row in comp.gap}
    assert gap["base"]["gib"] == pytest.approx(79 * 0.9 - 80 * 0.9)  # 0.9 of free memory vs 0.9 of the total
    assert gap["activation"]["gib"] == pytest.approx(3.0) and gap["non_torch"]["gib"] == pytest.approx(1.0)
    assert gap["weights"]["gib"] == 0 and gap["cuda_graph"]["gib"] == 0 and gap["cell"]["tokens"] == 0
    assert sum(row["tokens"] for row in comp.gap) == comp.sglang.tokens - comp.vllm.tokens
    assert abs(gap["rounding"]["tokens"]) < 16  # at most one block


def test_dtype_and_replication_enter_through_the_cell():
    comp = compare_engines(LLAMA, None, 16, mem_fraction_static=0.9, vllm_version="0.10.1.1", inputs=_mem(),
                           kv_dtype_bytes=(2, 1))  # vLLM with an fp8 KV cache
    assert comp.to_json()["kv_heads_replicated"] is True and comp.heads_per_rank == 1
    cell = {row["kind"]: row for row in comp.gap}["cell"]
    assert "replicated 2×" in cell["what"] and cell["tokens"] < 0  # vLLM's 1-byte cells hold twice the tokens
    assert comp.vllm.cell_size_bytes * 2 == comp.sglang.cell_size_bytes
    assert sum(row["tokens"] for row in comp.gap) == comp.sglang.tokens - comp.vllm.tokens


def test_activation_estimate_grows_with_its_inputs():
    small = estimate_activation_peak(LLAMA, 1, 2048, 256)
    assert estimate_activation_peak(LLAMA, 1, 16384, 256).forward_gib > small.forward_gib
    assert estimate_activation_peak(LLAMA, 1, 2048, 1024).sampler_gib > small.sampler_gib
    # the sampler: 256 requests × 128,256 vocab × 22 B + their hidden states
    assert small.sampler_gib == pytest.approx((256 * 128_256 * 22 + 256 * 4096 * 2) / GiB)


@pytest.mark.parametrize("call,match", [
    (lambda: _vllm("0.10.1.1", util=0.0), "gpu_memory_utilization must be in (0, 1]"),
    (lambda: _vllm("0.10.1.1", util=1.5), "gpu_memory_utilization must be in (0, 1]"),
    (lambda: vllm_rule("latest"), "--vllm-version 'latest': not a vLLM version"),
    (lambda: Amount(-1.0, "weights from the log"), "weights from the log: a memory amount"),
    (lambda: Amount(float("nan"), "activation"), "activation: a memory amount"),
    (lambda: tokens_in(1.0, 0, 16), "cell size and block size must be positive"),
    (lambda: estimate_activation_peak(LLAMA, 0, 8192, 256), "tp_size must be a positive integer"),
    (lambda: estimate_activation_peak(LLAMA, 1, 8192, 0), "max_num_seqs must be a positive integer"),
    (lambda: sglang_budget(_mem(), mem_fraction_static=1.0, cell_size_bytes=CELL), "mem_fraction_static must be"),
    (lambda: sglang_budget(_mem(startup=90.0), mem_fraction_static=0.9, cell_size_bytes=CELL), "startup:"),
    (lambda: compare_engines(LLAMA, None, 0, mem_fraction_static=0.9, inputs=_mem()), "tp_size must be"),
])
def test_bad_input_names_it(call, match):
    with pytest.raises(BudgetError, match=match.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        call()
