"""Model presets: parameter counts against the published sizes, and KV bytes per token worked by hand."""

import pytest

from kvlab.model.hf_config import MODEL_PRESETS, get_model_config


@pytest.mark.parametrize(
    "name,published",
    [("llama-3.1-8b", 8.03e9), ("llama-3.1-70b", 70.6e9), ("qwen3-235b-a22b", 235e9), ("deepseek-v3", 671e9)],
)
def test_parameter_counts_match_published(name, published):
    assert abs(get_model_config(name).num_parameters() / published - 1) < 0.01


def test_cell_sizes_worked():
    llama8 = get_model_config("llama-3.1-8b")
    assert llama8.cell_size_bytes(1) == 8 * (128 + 128) * 32 * 2 == 131_072
    assert llama8.cell_size_bytes(8) == 1 * 256 * 32 * 2  # one kv head per rank
    assert llama8.cell_size_bytes(16) == 1 * 256 * 32 * 2  # max(1, 8 // 16): kv heads replicated
    llama70 = get_model_config("llama-3.1-70b")
    # TP4 + 1 EAGLE draft layer: 2 heads × 256 × 80 × 2 = 81,920; + int(81,920 × 1/80) = 1,024
    assert llama70.cell_size_bytes(4, draft_layers=1) == 82_944
    ds = get_model_config("deepseek-v3")
    assert ds.cell_size_bytes(1) == ds.cell_size_bytes(8) == (512 + 64) * 61 * 2 == 70_272  # MLA: not split by TP


def test_tp_shards_sum_to_full():
    cfg = get_model_config("llama-3.1-70b")
    full = cfg.weight_bytes_per_rank(1)
    per_rank = cfg.weight_bytes_per_rank(4)
    replicated = sum(s.shard_bytes for s in cfg.weight_specs(4) if s.shard_dim is None)
    assert per_rank * 4 == full + 3 * replicated


def test_unknown_preset_names_choices():
    with pytest.raises(ValueError, match="unknown model preset 'llama-9'.*tiny"):
        get_model_config("llama-9")


@pytest.mark.parametrize("tp", [0, -1, 1.5])
def test_bad_tp(tp):
    with pytest.raises(ValueError, match="tp_size"):
        MODEL_PRESETS["tiny"].cell_size_bytes(tp)
