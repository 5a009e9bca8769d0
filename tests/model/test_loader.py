"""The weight loader: real safetensors reads, and temporaries that only the cycle collector frees."""

import gc
import shutil

import pytest
import torch
from safetensors import safe_open

from kvlab.device import get_device
from kvlab.experiments.kv_pool_sizing import DATA_DIR
from kvlab.model import CheckpointError, get_model_config, load_weights, write_checkpoint
from kvlab.model.loader import FastPathUnsupported, WeightLoader

TINY_DIR = DATA_DIR / "tiny-llama"


@pytest.fixture
def no_auto_gc():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_tiny_checkpoint_loads_real_bytes():
    device = get_device("sim:h100-80g")
    loaded = load_weights(device, get_model_config("tiny"), checkpoint_dir=TINY_DIR)
    with safe_open(str(TINY_DIR / "model.safetensors"), "pt") as f:
        q = f.get_tensor("model.layers.1.self_attn.q_proj.weight")
        k = f.get_tensor("model.layers.1.self_attn.k_proj.weight")
        norm = f.get_tensor("model.norm.weight")
    qkv = loaded.params["model.layers.1.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv[: q.shape[0]], q) and torch.equal(qkv[q.shape[0]: q.shape[0] + k.shape[0]], k)
    assert loaded.params["model.norm.weight"].dtype == torch.bfloat16 and norm.dtype == torch.float32
    assert torch.equal(loaded.params["model.norm.weight"], norm.to(torch.bfloat16))
    assert "0 mismatches" in loaded.notes[0]


def test_tp_shard_rows_are_the_ranks_rows():
    cfg = get_model_config("tiny")
    with safe_open(str(TINY_DIR / "model.safetensors"), "pt") as f:
        gate = f.get_tensor("model.layers.0.mlp.gate_proj.weight")
        down = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    rank1 = load_weights(get_device("sim:l4"), cfg, tp_rank=1, tp_size=2, checkpoint_dir=TINY_DIR).params
    half = cfg.intermediate_size // 2
    assert torch.equal(rank1["model.layers.0.mlp.gate_up_proj.weight"][:half], gate[half:])
    assert torch.equal(rank1["model.layers.0.mlp.down_proj.weight"], down[:, half:])


def test_temporaries_are_held_only_by_a_cycle(no_auto_gc):
    """After `del` of everything the caller holds, the staging bytes stay allocated; gc.collect() frees them,
    and the objects it found include the loader — so it was garbage in a cycle, not a live reference."""
    device = get_device("sim:h100-80g")
    loaded = load_weights(device, get_model_config("tiny"), checkpoint_dir=TINY_DIR)
    kept, weights = loaded.kept_staging_bytes, loaded.weight_bytes
    assert kept > 0
    del loaded
    # the loader's frame (held by the cycle) still references the params and the staging shards
    assert device.memory_stats()["requested_bytes.all.current"] == kept + weights
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [o for o in gc.garbage if isinstance(o, WeightLoader)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert len(found) == 1
    del found
    gc.collect()
    assert device.memory_allocated() == 0


def test_without_the_cached_exception_there_is_no_leak(no_auto_gc):
    """The cycle runs through `fallback_reason`: break it and refcounting frees everything at once."""
    device = get_device("sim:h100-80g")
    loader = WeightLoader(device, get_model_config("tiny"), checkpoint_dir=TINY_DIR)
    loaded = loader.load()
    assert isinstance(loader.fallback_reason, FastPathUnsupported)
    loader.fallback_reason = None  # drop the exception -> traceback -> frame chain
    del loader, loaded
    assert device.memory_allocated() == 0


def test_verify_budget_limits_what_is_kept(no_auto_gc):
    device = get_device("sim:h100-80g")
    loaded = load_weights(device, get_model_config("llama-3.1-8b"), verify_budget_bytes=1 << 30)
    assert loaded.kept_staging_bytes <= 1 << 30
    assert loaded.staged_bytes > loaded.kept_staging_bytes


def test_missing_checkpoint_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_weights(get_device("sim:l4"), get_model_config("tiny"), checkpoint_dir=tmp_path)


def test_corrupt_checkpoint_names_file(tmp_path):
    shutil.copy(TINY_DIR / "model.safetensors", tmp_path / "model.safetensors")
    with open(tmp_path / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 64)  # clobber the header length and JSON
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_weights(get_device("sim:l4"), get_model_config("tiny"), checkpoint_dir=tmp_path)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    write_checkpoint(tmp_path, get_model_config("tiny").replace(intermediate_size=256))
    with pytest.raises(CheckpointError, match="gate_proj.weight' has shape \\(256, 128\\).*expects \\(384, 128\\)"):
        load_weights(get_device("sim:l4"), get_model_config("tiny"), checkpoint_dir=tmp_path)


def test_shipped_checkpoint_is_what_the_generator_writes(tmp_path):
    """data/README.md says how the file was made; the same command must give the same bytes."""
    write_checkpoint(tmp_path, get_model_config("tiny"), seed=0)
    assert (tmp_path / "model.safetensors").read_bytes() == (TINY_DIR / "model.safetensors").read_bytes()
