"""The allocator model's statistics: torch's ``Stat`` counters and ``torch.cuda.memory_stats()``.

Mirrors ``c10/core/CachingDeviceAllocator.h`` (``Stat``: current, peak, allocated, freed;
``DeviceStats``: one ``StatArray`` per quantity, indexed by ``StatType`` all / small_pool /
large_pool, plus ``oversize_allocations`` and ``oversize_segments``) and the stats methods of
``DeviceCachingAllocator`` in ``c10/cuda/CUDACachingAllocator.cpp`` (``getStats``,
``resetAccumulatedStats``, ``resetPeakStats``, and the ``increase_stat`` / ``decrease_stat`` updates
inlined in :meth:`AllocatorStats._stat`). ``memory_stats`` flattens them as
``torch/cuda/memory.py::memory_stats`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvlab.device.caching_allocator.sizes import POOLS
from kvlab.errors import InvariantError

if TYPE_CHECKING:
    from kvlab.device.caching_allocator.config import AllocatorConfig

STAT_ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
STAT_TYPES = ("all", "small_pool", "large_pool")


class Stat:
    """torch's ``Stat``: current, peak, and the running totals ``allocated`` / ``freed``."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount: int) -> None:
        self.current += amount
        self.peak = max(self.peak, self.current)
        self.allocated += amount

    def decrease(self, amount: int) -> None:
        self.current -= amount
        if self.current < 0:
            raise InvariantError("a tracked stat never goes negative", current=self.current, decrease=amount)
        self.freed += amount


class AllocatorStats:
    """The stats half of :class:`~kvlab.device.caching_allocator.CachingAllocatorModel` (a mixin):
    it owns ``_stats``, ``_oversize_allocations``, ``_oversize_segments`` and ``_counters``, and reads
    ``config`` for ``max_split_size``."""

    config: AllocatorConfig

    def _init_stats(self) -> None:
        self._stats = {name: {t: Stat() for t in STAT_TYPES} for name in STAT_ARRAYS}
        self._stat_pairs = {
            (name, p): (self._stats[name]["all"], self._stats[name][f"{p}_pool"])
            for name in STAT_ARRAYS
            for p in POOLS
        }
        self._oversize_allocations = Stat()
        self._oversize_segments = Stat()
        self._counters = dict.fromkeys(
            ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"), 0
        )

    def _stat(self, pool: str, *updates: tuple[str, int]) -> None:
        """Apply ``(stat_name, amount)`` updates (amount may be negative) to the aggregate and the
        ``pool`` entry of each stat array: torch's increase_stat / decrease_stat, inlined."""
        pairs = self._stat_pairs
        for name, amount in updates:
            if amount >= 0:
                for stat in pairs[name, pool]:
                    current = stat.current + amount
                    stat.current = current
                    if current > stat.peak:
                        stat.peak = current
                    stat.allocated += amount
            else:
                for stat in pairs[name, pool]:
                    stat.current += amount
                    if stat.current < 0:
                        raise InvariantError("a tracked stat never goes negative", stat=name, pool=pool,
                                             current=stat.current, decrease=-amount)
                    stat.freed -= amount

    def memory_allocated(self) -> int:
        return self._stats["allocated_bytes"]["all"].current

    def memory_reserved(self) -> int:
        return self._stats["reserved_bytes"]["all"].current

    def max_memory_allocated(self) -> int:
        return self._stats["allocated_bytes"]["all"].peak

    def max_memory_reserved(self) -> int:
        return self._stats["reserved_bytes"]["all"].peak

    def reset_peak_memory_stats(self) -> None:
        for stat in self._all_stats():
            stat.peak = stat.current

    def reset_accumulated_memory_stats(self) -> None:
        for stat in self._all_stats():
            stat.allocated = stat.freed = 0
        for key in self._counters:
            self._counters[key] = 0

    def _all_stats(self) -> Iterator[Stat]:
        for stats in self._stats.values():
            yield from stats.values()
        yield self._oversize_allocations
        yield self._oversize_segments

    def memory_stats(self) -> dict[str, int]:
        """``torch.cuda.memory_stats()``: flat ``"allocated_bytes.all.current"``-style keys, sorted.
        As in torch, ``max_split_size`` is -1 when unlimited (SIZE_MAX cast to int64), ``segment``
        counts cudaMalloc segments only (mapping pages is not a segment) and ``inactive_split``
        leaves expandable segments out."""
        result: dict[str, int] = dict(self._counters)
        result["max_split_size"] = self.config.max_split_size_bytes or -1
        for name, stats in self._stats.items():
            for stat_type, stat in stats.items():
                for field in Stat.__slots__:
                    result[f"{name}.{stat_type}.{field}"] = getattr(stat, field)
        for name, stat in (
            ("oversize_allocations", self._oversize_allocations),
            ("oversize_segments", self._oversize_segments),
        ):
            for field in Stat.__slots__:
                result[f"{name}.{field}"] = getattr(stat, field)
        return dict(sorted(result.items()))
