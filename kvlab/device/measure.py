"""The impure reading: how much device memory is free right now.

This is the only place kvlab's KV-budget path touches the allocator. It mirrors SGLang's
``utils/common.py::get_available_gpu_memory`` (optional ``empty_cache``, then the driver's free
bytes, then the MIN across tensor-parallel ranks) with the collect-before-measure step of
``mem_cache/kv_cache_configurator.py::_profile_available_bytes`` (PR #36583) folded in as
``gc_collect``: upstream calls ``gc.collect()`` just before ``get_available_gpu_memory``.

Why the order matters: ``empty_cache`` can only return blocks nothing references. Loader
temporaries held by a reference cycle are still referenced until the cycle collector runs, so
without ``gc.collect()`` first their segments stay reserved and free memory is under-read.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvlab.device.base import Device


@dataclass(frozen=True)
class MemoryReading:
    """Free memory as the budget sees it. ``free_bytes`` is the MIN over ranks (SGLang all-reduces MIN)."""

    free_bytes: int
    total_bytes: int
    per_rank_free_bytes: tuple[int, ...]
    allocated_bytes: tuple[int, ...]
    reserved_bytes: tuple[int, ...]
    gc_collected: bool
    empty_cache: bool
    gc_objects_collected: int = 0


def get_available_gpu_memory(
    devices: Device | Sequence[Device],
    *,
    empty_cache: bool = True,
    gc_collect: bool = True,
) -> MemoryReading:
    """Read free device memory the way SGLang sizes its KV pool.

    ``gc_collect=True`` is the fixed behaviour (SGLang >= 0.5.19); ``False`` reproduces the bug.
    """
    ranks = [devices] if isinstance(devices, Device) else list(devices)
    if not ranks:
        raise ValueError("get_available_gpu_memory needs at least one device")
    collected = gc.collect() if gc_collect else 0
    free_per_rank: list[int] = []
    total = None
    for device in ranks:
        with device.phase("measure"):
            if empty_cache:
                device.empty_cache()
            free, total_i = device.mem_get_info()
        free_per_rank.append(free)
        total = total_i if total is None else min(total, total_i)
    return MemoryReading(
        free_bytes=min(free_per_rank),
        total_bytes=total,
        per_rank_free_bytes=tuple(free_per_rank),
        allocated_bytes=tuple(d.memory_allocated() for d in ranks),
        reserved_bytes=tuple(d.memory_reserved() for d in ranks),
        gc_collected=gc_collect,
        empty_cache=empty_cache,
        gc_objects_collected=collected,
    )


@contextlib.contextmanager
def automatic_gc_paused() -> Iterator[None]:
    """Pause the interpreter's *automatic* collections for the duration of a scenario.

    In a serving process the loader's cycle survives until measurement because it has been
    promoted to an old generation, and full collections are rare. In a short script the automatic
    collector could run at any allocation count and make the no-gc arm depend on allocation
    history. Pausing it keeps both arms deterministic; an explicit ``gc.collect()`` still works.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
