"""Where bytes live: one device interface over a real GPU and a faithful CPU model of one.

``get_device("auto" | "cuda" | "cuda:N" | "sim:<preset>")``; ``get_devices(name, count)`` for
tensor-parallel runs (one device per rank).
"""

from __future__ import annotations

import os

from kvlab.device.base import Device
from kvlab.device.events import EventRecorder, TraceEvent
from kvlab.device.spec import DEVICE_PRESETS, DeviceSpec, get_device_spec

DEFAULT_SIM_PRESET = "h200"


def resolve_device_name(name: str | None = None) -> str:
    """``auto`` (or None, or $KVLAB_DEVICE) -> ``cuda`` when a GPU is visible, else ``sim:h200``."""
    name = name or os.environ.get("KVLAB_DEVICE") or "auto"
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else f"sim:{DEFAULT_SIM_PRESET}"
    return name


def get_device(name: str | None = "auto", index: int = 0, **options) -> Device:
    """Build a device from its name. ``options`` go to the backend (e.g. ``allocator_config``,
    ``spec`` overrides for simulated devices)."""
    resolved = resolve_device_name(name)
    if resolved == "cuda" or resolved.startswith("cuda:"):
        from kvlab.device.cuda import CudaDevice

        if resolved.startswith("cuda:"):
            try:
                index = int(resolved.split(":", 1)[1])
            except ValueError:
                raise ValueError(f"bad device name {name!r}: expected cuda:<index>") from None
        return CudaDevice(index, **options)
    if resolved.startswith("sim:"):
        from kvlab.device.simulated import SimulatedGPU

        spec = options.pop("spec", None) or get_device_spec(resolved[4:])
        return SimulatedGPU(spec, index, **options)
    raise ValueError(
        f"unknown device {name!r}; expected 'auto', 'cuda', 'cuda:N' or 'sim:<preset>' "
        f"with a preset from: {', '.join(sorted(DEVICE_PRESETS))}"
    )


def get_devices(name: str | None, count: int, **options) -> list[Device]:
    """One device per tensor-parallel rank. Simulated ranks each get their own allocator."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"device count must be a positive int, got {count!r}")
    resolved = resolve_device_name(name)
    if resolved.startswith("cuda"):
        import torch

        if torch.cuda.device_count() < count:
            raise ValueError(f"{count} CUDA devices requested but only {torch.cuda.device_count()} visible")
        resolved = "cuda"
    return [get_device(resolved, index=i, **dict(options)) for i in range(count)]


__all__ = [
    "DEVICE_PRESETS",
    "Device",
    "DeviceSpec",
    "EventRecorder",
    "TraceEvent",
    "get_device",
    "get_device_spec",
    "get_devices",
    "resolve_device_name",
]
