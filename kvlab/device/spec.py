"""DeviceSpec presets: how much memory a GPU has and how much of it never reaches PyTorch.

Capacities are what ``torch.cuda.mem_get_info()`` reports as *total* on each card (the driver
keeps a little of the marketing size for itself). ``context_bytes`` is the CUDA context plus
cuBLAS/NCCL workspaces a serving process creates before any weight is loaded; it is the main
"non-PyTorch memory" in torch's OOM message. ``other_process_bytes`` models memory held by other
processes on the same card (another server, a notebook kernel).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvlab.units import GB, MiB


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    capacity_bytes: int  # physical memory the driver reports as total
    context_bytes: int = 512 * MiB  # CUDA context + library workspaces (non-PyTorch memory)
    other_process_bytes: int = 0
    cap_bytes: int | None = None  # a visible-memory cap (the PR ran H200s capped to 80 GB)
    description: str = ""

    def __post_init__(self) -> None:
        for field in ("capacity_bytes", "context_bytes", "other_process_bytes"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"DeviceSpec {self.name!r}: {field} must be a non-negative int, got {value!r}")
        if self.capacity_bytes == 0:
            raise ValueError(f"DeviceSpec {self.name!r}: capacity_bytes must be positive")
        if self.cap_bytes is not None and not 0 < self.cap_bytes <= self.capacity_bytes:
            raise ValueError(
                f"DeviceSpec {self.name!r}: cap_bytes={self.cap_bytes} must be in (0, capacity_bytes={self.capacity_bytes}]"
            )
        if self.context_bytes + self.other_process_bytes >= self.total_bytes:
            raise ValueError(
                f"DeviceSpec {self.name!r}: context_bytes + other_process_bytes "
                f"({self.context_bytes + self.other_process_bytes}) leave no memory of total {self.total_bytes}"
            )

    @property
    def total_bytes(self) -> int:
        """What ``mem_get_info`` reports as total: the cap when one is set."""
        return self.cap_bytes if self.cap_bytes is not None else self.capacity_bytes

    @property
    def non_pytorch_bytes(self) -> int:
        return self.context_bytes + self.other_process_bytes

    def replace(self, **changes) -> "DeviceSpec":
        return dataclasses.replace(self, **changes)


DEVICE_PRESETS: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        DeviceSpec("h200", 143_771 * MiB, description="NVIDIA H200 141 GB HBM3e"),
        DeviceSpec("h100-80g", 81_559 * MiB, description="NVIDIA H100 80 GB HBM3"),
        DeviceSpec("a100-80g", 81_050 * MiB, description="NVIDIA A100 80 GB"),
        DeviceSpec("a100-40g", 40_370 * MiB, context_bytes=448 * MiB, description="NVIDIA A100 40 GB"),
        DeviceSpec("l4", 22_491 * MiB, context_bytes=384 * MiB, description="NVIDIA L4 24 GB"),
        DeviceSpec("rtx4090", 24_564 * MiB, context_bytes=384 * MiB, description="NVIDIA GeForce RTX 4090 24 GB"),
        DeviceSpec(
            "h200-80gb-cap",
            143_771 * MiB,
            cap_bytes=80 * GB,
            description="H200 capped to 80 GB visible memory, as in the KV-budget PR",
        ),
    )
}


def get_device_spec(name: str) -> DeviceSpec:
    try:
        return DEVICE_PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown device preset {name!r}; choose one of: {', '.join(sorted(DEVICE_PRESETS))}"
        ) from None
