"""The GPU an explanation is about: a ``--gpu`` preset or product name, else the name the log prints."""

from __future__ import annotations

from kvlab.device.spec import DEVICE_PRESETS, DeviceSpec, find_device_spec
from kvlab.serving.sglang_log import LogError


def resolve_gpu(name: str | None, log_gpu_name: str | None) -> tuple[DeviceSpec | None, str | None]:
    if name:
        spec = DEVICE_PRESETS.get(name) or find_device_spec(name)
        if spec is None:
            raise LogError(f"--gpu {name[:60]!r}: not a kvlab GPU preset or a known product name; presets: "
                           f"{', '.join(sorted(DEVICE_PRESETS))}")
        return spec, f"--gpu {name}"
    if log_gpu_name:
        spec = find_device_spec(log_gpu_name)
        return spec, (f"log: {log_gpu_name!r}" if spec else None)
    return None, None
