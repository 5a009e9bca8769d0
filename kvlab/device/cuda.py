"""CudaDevice: the kvlab device interface over ``torch.cuda`` (real readings on a real GPU).

Allocations go through PyTorch's own caching allocator; kvlab only records them (same event rows
as the simulated backend, with wall-clock time) so the notebooks draw the same timeline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from kvlab.device.base import Device, nbytes_of
from kvlab.device.events import EventRecorder
from kvlab.errors import require


class CudaDevice(Device):
    kind = "cuda"

    def __init__(self, index: int = 0, *, recorder: EventRecorder | None = None) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False on this machine")
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device 'cuda:{index}' does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
        self.index = index
        self.torch_device = torch.device("cuda", index)
        start = time.perf_counter_ns()
        self.recorder = recorder or EventRecorder(clock=lambda: (time.perf_counter_ns() - start) // 1000)
        free, total = torch.cuda.mem_get_info(index)
        self._non_pytorch_bytes = total - free - torch.cuda.memory_reserved(index)

    @property
    def name(self) -> str:
        return f"cuda:{self.index} ({torch.cuda.get_device_name(self.index)})"

    @property
    def non_pytorch_bytes(self) -> int:
        return self._non_pytorch_bytes

    def _record(self, action: str, size_bytes: int, addr: int = 0) -> None:
        self.recorder.record(
            action,
            addr,
            size_bytes,
            allocated_bytes=self.memory_allocated(),
            reserved_bytes=self.memory_reserved(),
            device=self.index,
        )

    def empty(self, shape: Sequence[int], dtype: torch.dtype = torch.bfloat16, *, label: str | None = None) -> torch.Tensor:
        shape = tuple(shape)
        size_bytes = nbytes_of(shape, dtype)
        tensor = torch.empty(shape, dtype=dtype, device=self.torch_device)
        if size_bytes > 0:
            self._record("alloc", size_bytes, tensor.data_ptr())
            self._on_storage_death(tensor, self._record, "free_completed", size_bytes, tensor.data_ptr())
        return tensor

    def empty_cache(self) -> None:
        with torch.cuda.device(self.index):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self._record("snapshot", 0)

    def mem_get_info(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.index)
        self._non_pytorch_bytes = total - free - torch.cuda.memory_reserved(self.index)
        return free, total

    def memory_allocated(self) -> int:
        return torch.cuda.memory_allocated(self.index)

    def memory_reserved(self) -> int:
        return torch.cuda.memory_reserved(self.index)

    def memory_stats(self) -> dict[str, int]:
        return dict(torch.cuda.memory_stats(self.index))

    def snapshot(self) -> dict:
        return torch.cuda.memory._snapshot(self.index)

    def check_invariants(self) -> None:
        allocated, reserved = self.memory_allocated(), self.memory_reserved()
        require(allocated <= reserved, "allocated <= reserved", allocated=allocated, reserved=reserved)
