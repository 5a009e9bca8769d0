"""The one device interface every layer above ``kvlab.device`` is written against.

Two backends implement it: :class:`~kvlab.device.simulated.SimulatedGPU` (a CPU model of PyTorch's
caching allocator whose frees are driven by real tensor lifetimes) and
:class:`~kvlab.device.cuda.CudaDevice` (``torch.cuda`` itself). Tensors are always real torch
tensors; a device only decides where their storage lives and who counts the bytes.

Every tensor a device hands out has a ``weakref.finalize`` on its *storage* (not on the tensor):
a view keeps the storage, and so the allocator block, alive; a reference cycle keeps it until the
garbage collector runs. That is the mechanism finding 1 is about, so it is never faked.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

import torch

from kvlab.device.events import EventRecorder
from kvlab.units import GiB


def nbytes_of(shape: Sequence[int], dtype: torch.dtype) -> int:
    for dim in shape:
        if not isinstance(dim, int) or dim < 0:
            raise ValueError(f"tensor shape must be non-negative ints, got {tuple(shape)!r}")
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


class Device(ABC):
    """A GPU (real or simulated) seen through the few calls serving code makes."""

    kind: str  # "sim" or "cuda"
    index: int
    recorder: EventRecorder

    # ---- allocation -------------------------------------------------------------------------
    @abstractmethod
    def empty(self, shape: Sequence[int], dtype: torch.dtype = torch.bfloat16, *, label: str | None = None) -> torch.Tensor:
        """An uninitialised tensor whose bytes are counted by this device's allocator."""

    # ---- what serving code reads ------------------------------------------------------------
    @abstractmethod
    def empty_cache(self) -> None: ...

    @abstractmethod
    def mem_get_info(self) -> tuple[int, int]:
        """(free_bytes, total_bytes) as the driver reports them."""

    @abstractmethod
    def memory_allocated(self) -> int: ...

    @abstractmethod
    def memory_reserved(self) -> int: ...

    @abstractmethod
    def memory_stats(self) -> dict[str, int]: ...

    @property
    @abstractmethod
    def name(self) -> str: ...

    @property
    def total_bytes(self) -> int:
        return self.mem_get_info()[1]

    @property
    @abstractmethod
    def non_pytorch_bytes(self) -> int:
        """Memory in use on the card that PyTorch's allocator does not own (context, other processes)."""

    # ---- timeline ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """Label the events inside the block, with a marker row at its start and end."""
        self.mark(label)
        with self.recorder.phase(label):
            yield
        self.mark(label)

    def mark(self, label: str) -> None:
        self.recorder.mark(
            label, allocated_bytes=self.memory_allocated(), reserved_bytes=self.memory_reserved(), device=self.index
        )

    def timeline(self):
        """The recorded events as a DataFrame, with the driver's free bytes after each event."""
        frame = self.recorder.to_frame()
        frame["free_bytes"] = self.total_bytes - self.non_pytorch_bytes - frame["reserved_bytes"]
        frame["device_name"] = self.name
        return frame

    # ---- shared machinery -------------------------------------------------------------------
    @staticmethod
    def _on_storage_death(tensor: torch.Tensor, callback, *args) -> None:
        """Run ``callback(*args)`` when the tensor's storage is deallocated (not when ``tensor`` is)."""
        finalizer = weakref.finalize(tensor.untyped_storage(), callback, *args)
        finalizer.atexit = False

    def __repr__(self) -> str:
        free, total = self.mem_get_info()
        return f"<{type(self).__name__} {self.name}: {free / GiB:.2f} GiB free of {total / GiB:.2f} GiB>"
