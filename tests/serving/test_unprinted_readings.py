"""The readings SGLang sizes the pool with are not the ones it prints: what each read version runs between them
(sglang_versions.reading_gaps), and the one step whose size the source gives — 0.5.8+'s RoPE cache expansion
after "Load weight end" (rope_reserve_bytes) — worked by hand."""

import pytest

from kvlab.model.hf_config import get_model_config
from kvlab.serving.pool import sglang_tokens, sglang_tokens_range
from kvlab.serving.sglang_versions import (
    expert_map_segment_bytes,
    reading_gaps,
    rope_reserve_bytes,
    rope_reserve_for_config,
)
from kvlab.units import GiB


def test_rope_reserve_worked_by_hand():
    """Qwen2.5-0.5B on 0.5.10.post1: the cache starts at max_position_embeddings = 32,768 rows of rotary dim 64.
    reserve = 32,768 + 0 × 0 × 2 + 256 = 33,024 (a multiple of 128); _ensure_cos_sin_cache_length(33,023):
    33,023 ≥ 32,768, new length ((33,023 + 128) // 128) × 128 = 258 × 128 = 33,024 rows, so 256 new rows
    × 64 × 4 B (FP32) = 65,536 B."""
    assert rope_reserve_bytes("0.5.10.post1", 32_768, 32_768, 64) == 65_536
    assert rope_reserve_for_config("0.5.10.post1", get_model_config("qwen2.5-0.5b")) == 65_536


def test_rope_reserve_other_cases():
    # speculative: 32,768 + 3 × 4 × 2 + 256 = 33,048 -> 33,152; new length (33,151 + 128) // 128 × 128 = 33,152:
    # 384 rows × 64 × 4 = 98,304 B
    assert rope_reserve_bytes("0.5.10.post1", 32_768, 32_768, 64, 3, 4) == 98_304
    # --context-length 4096 below the cache: 4,352 − 1 < 32,768 rows, nothing grows
    assert rope_reserve_bytes("0.5.10.post1", 32_768, 4_096, 64) == 0
    # 40,000 rows, head 128: 40,256 -> 40,320; (40,319 + 128) // 128 × 128 = 40,320: 320 rows × 128 × 4 = 163,840
    assert rope_reserve_bytes("0.5.23", 40_000, 40_000, 128) == 163_840
    # 0.5.4 has no reserve_rope_cache_for_long_sequences; MLA models are not counted
    assert rope_reserve_bytes("0.5.4", 32_768, 32_768, 64) == 0
    assert rope_reserve_bytes("0.4.7.post1", 32_768, 32_768, 64) == 0
    assert rope_reserve_for_config("0.5.10.post1", get_model_config("deepseek-v2-lite")) == 0


def test_the_term_moves_the_pool_of_the_willxxy_log():
    """0.5.10.post1, Qwen2.5-0.5B (cell 24 × 2 × 64 × 2 × 2 = 12,288 B), f = 0.86, before 36.54, after 35.57:
    rest = 35.57 − 65,536 / 2^30 − 36.54 × 0.14 = 30.454339 GiB -> × 2^30 // 12,288 = 2,661,140 (5 tokens fewer
    than without the term: 2,661,146); range [2,660,642, 2,661,638]."""
    after = 35.57 - 65_536 / GiB
    assert sglang_tokens(36.54, 35.57, 0.86, 12_288) == 2_661_146
    assert sglang_tokens(36.54, after, 0.86, 12_288) == 2_661_140
    assert sglang_tokens_range(36.54, after, 0.86, 12_288, 12_288) == (2_660_642, 2_661_638)


@pytest.mark.parametrize("version,total,before_step,after_step", [
    ("0.4.5", "min_per_gpu_memory", "Sampler", "monitored_barrier"),
    ("0.4.7.post1", "model_runner.py:483", "init_dummy", "monitored_barrier"),
    ("0.4.9", "model_runner.py:483", "init_dummy", "monitored_barrier"),
    ("0.5.1", "min_per_gpu_memory", "None for a model without experts", "monitored_barrier"),
    ("0.5.8", "min_per_gpu_memory", "None for a model without experts", "reserve_rope_cache_for_long_sequences"),
    ("0.5.10.post1", "model_runner.py:999", "None for a model without experts", "reserve_rope_cache_for_long"),
])
def test_reading_gaps_by_version(version, total, before_step, after_step):
    gaps = reading_gaps(version)
    assert total in gaps.total_reading
    assert "profile_max_num_token" in gaps.post_reading
    assert any(before_step in s for s in gaps.before_steps)
    assert any(after_step in s for s in gaps.after_steps)
    assert any("init_cublas" in s for s in gaps.after_steps)  # cuBLAS's workspace comes after the pool reading
    if not version.startswith("0.5.8") and version != "0.5.10.post1":
        assert not any("reserve_rope" in s for s in gaps.after_steps)


def test_expert_map_segment():
    """0.4.7.post1 and 0.4.9 give every model an expert-location map on the GPU after init_torch_distributed's
    reading; at world size 1 these are the process's first CUDA tensors: one 2 MiB small-pool segment
    (torch's kSmallBuffer). Not counted at TP > 1, before 0.4.7.post1, or from 0.5.0rc0 (None without experts)."""
    assert expert_map_segment_bytes("0.4.7.post1", 1) == 2 * 2**20
    assert expert_map_segment_bytes("0.4.9", 1) == 2 * 2**20
    assert expert_map_segment_bytes("0.4.8", 1) == 2 * 2**20  # nearest read at or below: 0.4.7.post1
    assert expert_map_segment_bytes("0.4.7.post1", 4) == 0
    assert expert_map_segment_bytes("0.4.6", 1) == 0
    assert expert_map_segment_bytes("0.5.0rc0", 1) == 0
    assert expert_map_segment_bytes("0.5.10.post1", 1) == 0
    assert expert_map_segment_bytes(None, 1) == 0
