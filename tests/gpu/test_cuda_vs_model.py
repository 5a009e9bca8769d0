"""On a real GPU: kvlab's allocator model against PyTorch's own caching allocator. Skipped without CUDA."""

import gc

import pytest
import torch

from kvlab.device import get_device
from kvlab.device.alloc_scripts import ALLOCATION_SCRIPTS, replay
from kvlab.device.spec import DeviceSpec
from kvlab.experiments import kv_pool_sizing

pytestmark = pytest.mark.gpu


def _model_like_this_gpu():
    cuda = get_device("cuda")
    free, total = cuda.mem_get_info()
    spec = DeviceSpec("this-gpu", total, context_bytes=total - free - cuda.memory_reserved())
    return cuda, get_device("sim:this-gpu", spec=spec)


@pytest.mark.parametrize("name", sorted(ALLOCATION_SCRIPTS))
def test_model_matches_torch_cuda(name):
    gc.collect()
    torch.cuda.empty_cache()
    cuda, model = _model_like_this_gpu()
    base_alloc, base_res = cuda.memory_allocated(), cuda.memory_reserved()
    real = [(a - base_alloc, r - base_res) for a, r in replay(cuda, ALLOCATION_SCRIPTS[name])]
    assert replay(model, ALLOCATION_SCRIPTS[name]) == real


def test_finding_on_a_real_gpu():
    no_gc, with_gc = kv_pool_sizing.compare("llama-8b-l4", device="cuda")
    held = sum(w.kept_staging_bytes for w in no_gc.weights)
    assert with_gc.reading.free_bytes - no_gc.reading.free_bytes >= 0.95 * held
    assert with_gc.max_total_num_tokens > no_gc.max_total_num_tokens
