"""Checkpoints the loader reads: real safetensors files, or a shape-only stand-in for big presets.

Both give the loader the same three things per tensor: shape, dtype, and (for real files) the
rows or columns of one tensor-parallel shard. Checkpoint names are Hugging Face's (``q_proj``,
``gate_proj``, ...); the runtime parameters in :mod:`kvlab.model.config` fuse some of them.
Norm weights are stored in float32, as many released checkpoints do, so loading them converts.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kvlab.model.config import ModelConfig

SAFETENSORS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


_SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F8_E4M3": torch.float8_e4m3fn}


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or does not match the model config."""


def checkpoint_tensors(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Checkpoint tensor name -> (full shape, stored dtype) for a model config."""
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for spec in config.weight_specs(1):
        if spec.pieces:
            prefix = spec.name.rsplit(".", 2)[0]  # ...self_attn / ...mlp
            for piece, rows in spec.pieces:
                out[f"{prefix}.{piece}.weight"] = ((rows, *spec.full_shape[1:]), spec.dtype)
        else:
            dtype = torch.float32 if spec.name.endswith("norm.weight") else spec.dtype
            out[spec.name] = (spec.full_shape, dtype)
    return out


class MetaCheckpoint:
    """A checkpoint with shapes and dtypes but no bytes: big presets load as meta tensors."""

    path = None

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self._tensors = checkpoint_tensors(config)

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        return self._tensors[name]

    def read_shard(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor | None:
        return None  # no data: the device copy stays uninitialised

    def __repr__(self) -> str:
        return f"<MetaCheckpoint {self.config.name}>"


class SafetensorsCheckpoint:
    """A directory with ``model.safetensors`` (and ``config.json``), read lazily by shard."""

    def __init__(self, directory: str | Path, config: ModelConfig) -> None:
        from safetensors import safe_open

        self.path = Path(directory) / SAFETENSORS_FILE
        if not self.path.is_file():
            raise FileNotFoundError(f"checkpoint file not found: {self.path}")
        try:
            self._file = safe_open(str(self.path), framework="pt")
            names = set(self._file.keys())
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise CheckpointError(f"{self.path}: not a readable safetensors file ({exc})") from None
        expected = checkpoint_tensors(config)
        missing = sorted(set(expected) - names)
        if missing:
            raise CheckpointError(
                f"{self.path}: {len(missing)} tensor(s) of model {config.name!r} missing, first: {missing[0]!r}"
            )
        for name, (shape, _) in expected.items():
            got = tuple(self._file.get_slice(name).get_shape())
            if got != shape:
                raise CheckpointError(f"{self.path}: tensor {name!r} has shape {got}, model {config.name!r} expects {shape}")
        self.config = config
        self._expected = expected

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        shape, _ = self._expected[name]
        stored = self._file.get_slice(name).get_dtype()
        if stored not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{self.path}: tensor {name!r} has unsupported dtype {stored!r}")
        return shape, _SAFETENSORS_DTYPES[stored]

    def read_shard(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        sl = self._file.get_slice(name)
        try:
            if dim is None:
                return sl[:]
            if dim == 0:
                return sl[start:stop]
            return sl[:, start:stop]
        except Exception as exc:
            raise CheckpointError(f"{self.path}: tensor {name!r} could not be read ({exc})") from None

    def __repr__(self) -> str:
        return f"<SafetensorsCheckpoint {self.path}>"


MIN_SEED, MAX_SEED = -(2 ** 63), 2 ** 64 - 1  # what torch.Generator.manual_seed takes


def write_checkpoint(directory: str | Path, config: ModelConfig, *, seed: int = 0) -> Path:
    """Write a random-weight safetensors checkpoint for ``config`` (small configs only) + config.json. ``seed``: an
    int in [:data:`MIN_SEED`, :data:`MAX_SEED`], the range torch's generator takes (checked before anything is
    written)."""
    from safetensors.torch import save_file

    if type(seed) is not int or not MIN_SEED <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer from {MIN_SEED} to {MAX_SEED} (torch's generator), got {seed!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (shape, dtype) in checkpoint_tensors(config).items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=dtype)
        else:
            tensors[name] = (torch.randn(shape, generator=generator) * 0.02).to(dtype)
    save_file(tensors, str(directory / SAFETENSORS_FILE), metadata={"format": "pt"})
    fields = {f: getattr(config, f) for f in ("name", "num_layers", "hidden_size", "num_attention_heads",
                                               "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
                                               "context_len", "weight_dtype")}
    fields["generated_by"] = f"kvlab.model.checkpoint.write_checkpoint(seed={seed})"
    (directory / CONFIG_FILE).write_text(json.dumps(fields, indent=2) + "\n")
    return directory / SAFETENSORS_FILE
