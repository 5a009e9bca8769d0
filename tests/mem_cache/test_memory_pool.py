"""ReqToTokenPool and MHATokenToKVPool: rows, buffers, bytes, devices."""

from __future__ import annotations

import pytest
import torch

from kvlab.mem_cache import DoubleFreeError, MHATokenToKVPool, ReqToTokenPool, SimpleReq
from kvlab.units import GiB, KiB


def test_req_rows_come_from_the_tail_and_row_zero_is_padding():
    pool = ReqToTokenPool(size=4, max_context_len=8)
    assert pool.req_to_token.shape == (5, 8) and pool.req_to_token.dtype == torch.int32
    a, b = SimpleReq("a", [1]), SimpleReq("b", [2])
    assert pool.alloc([a, b]) == [3, 4]
    assert pool.alloc([a, SimpleReq("c", [3])]) == [3, 2]  # a keeps its row (chunked prefill)
    assert pool.alloc([SimpleReq(i, [0]) for i in range(2)]) is None
    pool.free(b)
    assert b.req_pool_idx is None and pool.available_size() == 2
    with pytest.raises(DoubleFreeError, match="holds no row"):
        pool.free(b)
    with pytest.raises(DoubleFreeError, match="row 4 is not allocated"):
        pool.free_rows([4])
    pool.write((a.req_pool_idx, slice(0, 3)), torch.tensor([7, 8, 9], dtype=torch.int32))
    assert pool.req_to_token[3, :4].tolist() == [7, 8, 9, 0]
    pool.check_invariants()


def test_kv_buffers_have_size_plus_a_padding_page_of_rows():
    pool = MHATokenToKVPool(size=16, page_size=4, dtype=torch.float16, head_num=2, head_dim=8,
                            layer_num=3, v_head_dim=4)
    assert len(pool.k_buffer) == len(pool.v_buffer) == 3
    assert pool.get_key_buffer(0).shape == (20, 2, 8) and pool.get_value_buffer(2).shape == (20, 2, 4)
    assert pool.cell_size_bytes == 2 * (8 + 4) * 3 * 2
    k, v = pool.get_kv_size_bytes()
    assert (k, v) == (3 * 20 * 2 * 8 * 2, 3 * 20 * 2 * 4 * 2)
    loc = torch.tensor([4, 5])
    pool.set_kv_buffer(1, loc, torch.ones(2, 2, 8), torch.full((2, 2, 4), 2.0))
    assert pool.get_kv_buffer(1)[0][5].eq(1).all() and pool.get_kv_buffer(1)[1][4].eq(2).all()
    pool.check_invariants()


def test_meta_device_pool_at_model_scale_costs_nothing():
    """Llama-3-8B bf16 (32 layers, 8 KV heads, head_dim 128): 128 KiB per token; the 446,627-token
    pool of docs/semantics.md#worked-example-llama-3-8b is ~54.5 GiB of meta tensors, no memory."""
    tokens = 446_627
    pool = MHATokenToKVPool(size=tokens, page_size=1, dtype=torch.bfloat16, head_num=8, head_dim=128,
                            layer_num=32, device="meta")
    assert pool.cell_size_bytes == 128 * KiB
    k, v = pool.get_kv_size_bytes()
    assert k + v == 128 * KiB * (tokens + 1)
    assert 54 * GiB < k + v < 55 * GiB
    assert pool.k_buffer[0].device.type == "meta"
    pool.check_invariants()


def test_a_device_object_allocates_the_buffers():
    class FakeGPU:
        def __init__(self):
            self.calls = []

        def empty(self, shape, dtype, label):
            self.calls.append((shape, dtype, label))
            return torch.empty(shape, dtype=dtype, device="meta")

    gpu = FakeGPU()
    MHATokenToKVPool(size=8, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=4, layer_num=2, device=gpu)
    assert [c[2] for c in gpu.calls] == ["k_buffer[0]", "k_buffer[1]", "v_buffer[0]", "v_buffer[1]"]
    assert gpu.calls[0][:2] == ((9, 1, 4), torch.bfloat16)
    rows = ReqToTokenPool(size=2, max_context_len=4, device=gpu)
    assert gpu.calls[-1] == ((3, 4), torch.int32, "req_to_token") and rows.req_to_token.device.type == "meta"


def test_fp8_kv_is_stored_as_uint8():
    pool = MHATokenToKVPool(size=4, page_size=1, dtype=torch.float8_e4m3fn, head_num=1, head_dim=2, layer_num=1)
    assert pool.store_dtype == torch.uint8 and pool.cell_size_bytes == 4
    pool.check_invariants()


def test_bad_pool_sizes_are_rejected():
    with pytest.raises(ValueError):
        ReqToTokenPool(size=0, max_context_len=4)
    with pytest.raises(ValueError):
        MHATokenToKVPool(size=4, page_size=1, dtype=torch.float16, head_num=0, head_dim=2, layer_num=1)
