"""A real weight loader whose staging temporaries outlive loading through a reference cycle.

Shape of the loader (after SGLang's ``model_loader/loader.py::DefaultModelLoader`` and the
``weight_loader`` methods of its parallel linear layers): for each runtime parameter, allocate it
on the device; for each checkpoint tensor that feeds it, *stage* this rank's shard on the device
(``narrow`` of the full tensor), then copy the staged shard into its rows of the (possibly fused)
parameter. A fast path copies raw bytes; it cannot convert dtypes, so it raises
:class:`FastPathUnsupported` for the float32 norm weights and the loader falls back to a
converting copy, keeping the first such exception as ``fallback_reason`` for its load report.

The cycle, as in the PR: ``loader.fallback_reason`` → exception → ``__traceback__`` → the frame of
:meth:`WeightLoader.load` → its locals ``self`` (the loader) and ``staged`` (the staging buffers
kept for the post-load verification). When the caller drops the loader, reference counting cannot
free any of it; only the cycle collector can. Nothing here is simulated: the references are real,
and so is the ``gc.collect()`` that frees them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvlab.device.base import Device
from kvlab.model.checkpoint import MetaCheckpoint, SafetensorsCheckpoint
from kvlab.model.config import ModelConfig, WeightSpec


class FastPathUnsupported(RuntimeError):
    """The raw-byte copy path cannot take this tensor (dtype conversion needed)."""


@dataclass
class LoadedWeights:
    """What :func:`load_weights` returns: the parameters and a report of what loading did."""

    params: dict[str, torch.Tensor]
    weight_bytes: int
    staged_bytes: int  # all staging buffers allocated while loading
    kept_staging_bytes: int  # staging buffers kept for verification (the cycle holds them)
    fallbacks: int
    checkpoint: str
    notes: list[str] = field(default_factory=list)


class WeightLoader:
    def __init__(
        self,
        device: Device,
        config: ModelConfig,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        checkpoint_dir: str | Path | None = None,
        verify_budget_bytes: int | None = None,
    ) -> None:
        if not 0 <= tp_rank < tp_size:
            raise ValueError(f"tp_rank must be in [0, tp_size={tp_size}), got {tp_rank!r}")
        self.device = device
        self.config = config
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.checkpoint = (
            SafetensorsCheckpoint(checkpoint_dir, config) if checkpoint_dir is not None else MetaCheckpoint(config)
        )
        # None: keep every staging buffer for verification; else keep them until this many bytes
        self.verify_budget_bytes = verify_budget_bytes
        self.fallback_reason: FastPathUnsupported | None = None

    # ---- the load loop ----------------------------------------------------------------------
    def load(self) -> LoadedWeights:
        params: dict[str, torch.Tensor] = {}
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []  # (staging shard, destination view)
        staged_bytes = kept_bytes = fallbacks = 0
        for spec in self.config.weight_specs(self.tp_size):
            param = self.device.empty(spec.shard_shape, spec.dtype, label=spec.name)
            for ckpt_name, row_start, row_stop in self._pieces(spec):
                staging = self._stage(spec, ckpt_name)
                dst = param[row_start:row_stop] if spec.pieces else param
                try:
                    self._copy_fast(dst, staging)
                except FastPathUnsupported as exc:
                    if self.fallback_reason is None:
                        self.fallback_reason = exc  # kept for the load report
                    fallbacks += 1
                    self._copy_converting(dst, staging)
                nbytes = staging.numel() * staging.element_size()
                staged_bytes += nbytes
                if self.verify_budget_bytes is None or kept_bytes + nbytes <= self.verify_budget_bytes:
                    staged.append((staging, dst))
                    kept_bytes += nbytes
                del staging, dst  # the loop's own names; `staged` keeps what verification needs
            params[spec.name] = param
        mismatches = self._verify(staged)
        notes = [f"verified {len(staged)} staged shards against their parameters: {mismatches} mismatches"]
        return LoadedWeights(
            params=params,
            weight_bytes=sum(p.numel() * p.element_size() for p in params.values()),
            staged_bytes=staged_bytes,
            kept_staging_bytes=kept_bytes,
            fallbacks=fallbacks,
            checkpoint=repr(self.checkpoint),
            notes=notes,
        )

    # ---- steps ------------------------------------------------------------------------------
    def _pieces(self, spec: WeightSpec):
        """(checkpoint name, first row, end row) of each checkpoint tensor within this rank's shard."""
        if not spec.pieces:
            yield spec.name, 0, None
            return
        prefix = spec.name.rsplit(".", 2)[0]
        row = 0
        for piece, rows in spec.pieces:
            shard_rows = rows // self.tp_size if spec.shard_dim == 0 else rows
            yield f"{prefix}.{piece}.weight", row, row + shard_rows
            row += shard_rows

    def _stage(self, spec: WeightSpec, ckpt_name: str) -> torch.Tensor:
        """This rank's shard of one checkpoint tensor, on the device in the checkpoint's dtype."""
        full_shape, dtype = self.checkpoint.shape_dtype(ckpt_name)
        shape = list(full_shape)
        start = stop = 0
        if spec.shard_dim is not None:
            size = full_shape[spec.shard_dim] // self.tp_size
            start, stop = self.tp_rank * size, (self.tp_rank + 1) * size
            shape[spec.shard_dim] = size
        staging = self.device.empty(tuple(shape), dtype, label=f"staging:{ckpt_name}")
        data = self.checkpoint.read_shard(ckpt_name, spec.shard_dim, start, stop)
        if data is not None and staging.device.type != "meta":
            staging.copy_(data)
        return staging

    @staticmethod
    def _copy_fast(dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.dtype != src.dtype:
            raise FastPathUnsupported(f"fast copy needs equal dtypes, got {src.dtype} -> {dst.dtype}")
        if dst.device.type != "meta" and src.device.type != "meta":
            dst.copy_(src)

    @staticmethod
    def _copy_converting(dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.device.type != "meta" and src.device.type != "meta":
            dst.copy_(src.to(dst.dtype))

    @staticmethod
    def _verify(staged: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Count staged shards whose parameter rows differ (real tensors only)."""
        mismatches = 0
        for staging, dst in staged:
            if staging.device.type == "meta" or dst.device.type == "meta":
                continue
            if not torch.equal(staging.to(dst.dtype), dst):
                mismatches += 1
        return mismatches


def load_weights(device: Device, config: ModelConfig, **options) -> LoadedWeights:
    """Load one rank's weights (``options``: :class:`WeightLoader`'s keywords, ``tp_rank``, ``tp_size``,
    ``checkpoint_dir``, ``verify_budget_bytes``). The loader object is dropped on return, as in a serving engine;
    whatever its reference cycle holds stays allocated until ``gc.collect()``."""
    loader = WeightLoader(device, config, **options)
    return loader.load()
