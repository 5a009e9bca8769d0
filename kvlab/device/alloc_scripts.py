"""Short allocation scripts replayed on any device: the same script on ``CudaDevice`` and on the model
must give the same allocated/reserved bytes after every step (tests/gpu, benchmarks/gpu_validation).

A script is a list of steps: ``("alloc", name, nbytes)``, ``("free", name)``, ``("empty_cache",)``.
"""

from __future__ import annotations

import torch

from kvlab.device.base import Device
from kvlab.units import KiB, MiB

ALLOCATION_SCRIPTS: dict[str, list[tuple]] = {
    "rounding-and-pools": [
        ("alloc", "a", 1), ("alloc", "b", 1000), ("alloc", "c", 600 * KiB), ("alloc", "d", 1 * MiB + 1),
        ("alloc", "e", 12 * MiB), ("free", "b"), ("alloc", "f", 800), ("free", "a"), ("free", "c"),
        ("empty_cache",), ("free", "d"), ("free", "e"), ("free", "f"), ("empty_cache",),
    ],
    "split-and-pin": [
        ("alloc", "big", 8 * MiB), ("alloc", "pin", 2 * MiB), ("free", "big"), ("alloc", "reuse", 3 * MiB),
        ("empty_cache",), ("free", "reuse"), ("empty_cache",), ("free", "pin"), ("empty_cache",),
    ],
    "fragmentation-order": [
        *[("alloc", f"x{i}", 6 * MiB) for i in range(6)],
        *[("free", f"x{i}") for i in range(0, 6, 2)],
        ("alloc", "y", 14 * MiB), ("empty_cache",),
        *[("free", f"x{i}") for i in range(1, 6, 2)], ("free", "y"), ("empty_cache",),
    ],
    "large-segments": [
        ("alloc", "w0", 100 * MiB), ("alloc", "w1", 37 * MiB + 5), ("free", "w0"), ("alloc", "w2", 50 * MiB),
        ("alloc", "w3", 49 * MiB), ("empty_cache",), ("free", "w1"), ("free", "w2"), ("free", "w3"), ("empty_cache",),
    ],
}


def replay(device: Device, script: list[tuple]) -> list[tuple[int, int]]:
    """Run ``script`` on ``device``; (allocated, reserved) bytes after each step."""
    live: dict[str, torch.Tensor] = {}
    readings = []
    for line, step in enumerate(script, 1):
        op = step[0]
        if op == "alloc":
            _, name, nbytes = step
            live[name] = device.empty((nbytes,), torch.uint8, label=name)
        elif op == "free":
            try:
                del live[step[1]]
            except KeyError:
                raise ValueError(f"allocation script step {line}: free of unknown tensor {step[1]!r}") from None
        elif op == "empty_cache":
            device.empty_cache()
        else:
            raise ValueError(f"allocation script step {line}: unknown op {op!r}")
        readings.append((device.memory_allocated(), device.memory_reserved()))
    return readings
