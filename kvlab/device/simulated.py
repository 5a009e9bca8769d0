"""SimulatedGPU: a GPU whose allocator is kvlab's CPU model of PyTorch's caching allocator.

Tensors are real torch tensors. Small ones get CPU storage (so arithmetic on them works, e.g. the
tiny checkpoint's weights); large ones get ``meta`` storage, so a 70B model "fits" on a laptop.
Either way the allocator block is freed exactly when the tensor's storage dies, so views, reference
cycles and ``gc.collect()`` behave as they do on a real GPU.

What it does not see: tensors that torch ops create from device tensors (``a + b`` allocates on
the CPU, not here). Code that wants its bytes counted allocates through :meth:`SimulatedGPU.empty`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvlab.device.base import Device, nbytes_of
from kvlab.device.caching_allocator import AllocatorConfig, CachingAllocatorModel
from kvlab.device.events import EventRecorder
from kvlab.device.spec import DeviceSpec
from kvlab.units import MiB

DEFAULT_REAL_STORAGE_LIMIT_BYTES = 4 * MiB


class SimulatedGPU(Device):
    kind = "sim"

    def __init__(
        self,
        spec: DeviceSpec,
        index: int = 0,
        *,
        allocator_config: AllocatorConfig | None = None,
        recorder: EventRecorder | None = None,
        real_storage_limit_bytes: int = DEFAULT_REAL_STORAGE_LIMIT_BYTES,
    ) -> None:
        self.spec = spec
        self.index = index
        self.recorder = recorder or EventRecorder()
        self.real_storage_limit_bytes = real_storage_limit_bytes
        self.allocator = CachingAllocatorModel(
            spec.total_bytes,
            non_pytorch_bytes=spec.non_pytorch_bytes,
            config=allocator_config or AllocatorConfig(),
            recorder=self.recorder,
            device_index=index,
        )

    @property
    def name(self) -> str:
        return f"sim:{self.spec.name}:{self.index}"

    @property
    def non_pytorch_bytes(self) -> int:
        return self.allocator.non_pytorch_bytes

    def empty(self, shape: Sequence[int], dtype: torch.dtype = torch.bfloat16, *, label: str | None = None) -> torch.Tensor:
        shape = tuple(shape)
        size_bytes = nbytes_of(shape, dtype)
        block = self.allocator.malloc(size_bytes) if size_bytes > 0 else None
        storage = "cpu" if size_bytes <= self.real_storage_limit_bytes else "meta"
        tensor = torch.empty(shape, dtype=dtype, device=storage)
        if block is not None:
            self._on_storage_death(tensor, self.allocator.free, block)
        return tensor

    def empty_cache(self) -> None:
        self.allocator.empty_cache()

    def mem_get_info(self) -> tuple[int, int]:
        return self.allocator.mem_get_info()

    def memory_allocated(self) -> int:
        return self.allocator.memory_allocated()

    def memory_reserved(self) -> int:
        return self.allocator.memory_reserved()

    def memory_stats(self) -> dict[str, int]:
        return self.allocator.memory_stats()

    def snapshot(self) -> dict:
        return self.allocator.snapshot()

    def check_invariants(self) -> None:
        self.allocator.check_invariants()
