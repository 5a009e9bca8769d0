"""The host KV pool of the hierarchical cache (HiCache's L2 tier): which host slots are free.

Mirrors ``sglang/srt/mem_cache/pool_host/base.py::HostKVCache`` (0.5.16; ``memory_pool_host.py`` re-exports
it) for what the tree sees: how big the pool is and which slot indices ``alloc`` / ``free`` hand out. The
bytes themselves are not stored (kvlab moves no KV); a transfer's cost is its tokens times
``size_per_token`` bytes, priced by ``cache_controller.HiCacheController``.

Sizing, in SGLang's order (``HostKVCache.__init__``)::

    size_tokens = int(hicache_size_gb * 1e9 // size_per_token)  if hicache_size_gb > 0   (decimal GB)
                = int(device_size_tokens * hicache_ratio)        otherwise
    page_num    = size_tokens // page_size + 1                   (always one page more: never empty)
    size_tokens = page_num * page_size

So the pool is page-aligned and at least one page, and rounding always *adds* a page, even to an aligned
size. A pool no bigger than the device pool is legal; SGLang only warns ("L2 cache effectiveness is
reduced"), and :attr:`HostKVCache.smaller_than_device` says the same. SGLang then refuses a pool that does
not fit in the host's available memory minus a 10 GiB reserve; kvlab checks that only when told the host's
available bytes (``host_available_bytes``).

Slot order (SGLang's exactly): slots ``0 .. size-1`` are all usable (no padding page, unlike the device
pool); ``alloc`` takes from the head of ``free_slots``; ``free`` stages the slots in ``release_slots``,
which join the *tail* of ``free_slots`` only when an ``alloc`` needs more than ``free_slots`` holds.

Differs on purpose: a double free, an out-of-range slot or a non page-aligned request raises (SGLang
asserts); the per-token byte size is given directly (``size_per_token``) instead of read from a device
pool object; 0.5.23's auto-sizing (``hicache_auto_size.py``: lower the ratio until the pools fit a fraction of
host memory) is :func:`auto_hicache_ratio`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.errors import DoubleFreeError, InvariantError, require
from kvlab.units import GB, GiB

_I64 = torch.int64

HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * GiB  # pool_host/base.py: host RAM left to the OS and other processes
ALLOCATION_SLACK_FRACTION = 0.05  # 0.5.23 hicache_auto_size.py: page rounding, metadata, staging buffers


@dataclass(frozen=True)
class HostPoolSize:
    """How :func:`host_pool_size` sized a pool. ``requested_tokens``: before page rounding; ``size_tokens``:
    the pool (whole pages, one page more than ``requested_tokens // page_size``); ``source``: ``"ratio"`` or
    ``"size"`` (``--hicache-size`` overrides the ratio)."""

    requested_tokens: int
    size_tokens: int
    page_size: int
    size_per_token: int
    source: str

    @property
    def num_pages(self) -> int:
        return self.size_tokens // self.page_size

    @property
    def size_bytes(self) -> int:
        return self.size_tokens * self.size_per_token


def host_pool_size(device_size_tokens: int, size_per_token: int, page_size: int = 1, hicache_ratio: float = 2.0,
                   hicache_size_gb: float = 0) -> HostPoolSize:
    """SGLang's host pool size (``HostKVCache.__init__``, 0.5.16 and 0.5.23 alike): ``hicache_size_gb`` > 0
    (decimal GB, ``--hicache-size``) wins over ``hicache_ratio`` (``--hicache-ratio``, default 2.0)."""
    if device_size_tokens < 0:
        raise ValueError(f"device_size_tokens must be >= 0, got {device_size_tokens}")
    if size_per_token <= 0:
        raise ValueError(f"size_per_token must be > 0 bytes, got {size_per_token}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if hicache_size_gb < 0:
        raise ValueError(f"hicache_size_gb (--hicache-size) must be >= 0 GB, got {hicache_size_gb}")
    if hicache_size_gb > 0:
        requested, source = int(hicache_size_gb * GB // size_per_token), "size"
    else:
        if hicache_ratio <= 0:
            raise ValueError(f"hicache_ratio (--hicache-ratio) must be > 0, got {hicache_ratio}")
        requested, source = int(device_size_tokens * hicache_ratio), "ratio"
    size = (requested // page_size + 1) * page_size
    return HostPoolSize(requested, size, page_size, size_per_token, source)


def auto_hicache_ratio(requested_ratio: float, device_kv_bytes: int, host_budget_bytes: int) -> float:
    """0.5.23's ``hicache_auto_size.auto_size_hicache``: the ratio, lowered until the host pools fit
    ``host_budget_bytes`` (the host's free memory after the 10 GiB reserve, per rank, times
    ``--hicache-host-memory-fraction``) with 5 % slack. Raises where no host memory is left."""
    if device_kv_bytes <= 0:
        raise ValueError(f"device_kv_bytes must be > 0, got {device_kv_bytes}")
    ratio = min(requested_ratio, host_budget_bytes * (1 - ALLOCATION_SLACK_FRACTION) / device_kv_bytes)
    if ratio <= 0:
        raise ValueError(f"no host memory is left for HiCache (budget {host_budget_bytes} bytes after the 10 GiB "
                         "reserve); set hicache_ratio or hicache_size_gb explicitly")
    return ratio


class HostKVCache:
    """The host pool's slots (``HostKVCache``'s ``alloc`` / ``free`` / ``available_size``), sized by
    :func:`host_pool_size`. ``host_available_bytes``: if given, the pool must fit in it minus the 10 GiB
    reserve (SGLang's "Not enough host memory available")."""

    def __init__(self, device_size_tokens: int, size_per_token: int, page_size: int = 1, hicache_ratio: float = 2.0,
                 hicache_size_gb: float = 0, host_available_bytes: int | None = None):
        self.sizing = host_pool_size(device_size_tokens, size_per_token, page_size, hicache_ratio, hicache_size_gb)
        self.size = self.sizing.size_tokens
        self.page_size = page_size
        self.page_num = self.sizing.num_pages
        self.size_per_token = size_per_token
        self.device_size_tokens = device_size_tokens
        if host_available_bytes is not None:
            budget = host_available_bytes - HICACHE_HOST_MEMORY_RESERVE_BYTES
            if self.sizing.size_bytes > budget:
                raise ValueError(
                    f"not enough host memory for the HiCache pool: it needs {self.sizing.size_bytes / GB:.2f} GB "
                    f"({self.size} tokens x {size_per_token} bytes) but only {max(budget, 0) / GB:.2f} GB are free "
                    f"after the 10 GiB reserve (host_available_bytes={host_available_bytes}); lower hicache_ratio "
                    "or hicache_size_gb")
        self.clear()

    @property
    def smaller_than_device(self) -> bool:
        """SGLang's warning: a host pool no bigger than the device pool reduces L2 effectiveness."""
        return self.size <= self.device_size_tokens

    def clear(self) -> None:
        self.free_slots = torch.arange(self.size, dtype=_I64)
        self.release_slots: list[torch.Tensor] = []
        self.num_release_slots = 0
        self.slot_used = torch.zeros(self.size, dtype=torch.bool)
        self._run = torch.arange(self.page_size, dtype=_I64)

    def available_size(self) -> int:
        return self.free_slots.shape[0] + self.num_release_slots

    def used_size(self) -> int:
        return self.size - self.available_size()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` host slots (whole pages), or None if fewer are free."""
        if need_size < 0 or need_size % self.page_size:
            raise ValueError(f"HostKVCache.alloc({need_size}): need a non-negative multiple of page_size "
                             f"{self.page_size}")
        if need_size > self.available_size():
            return None
        if need_size > self.free_slots.shape[0] and self.num_release_slots:
            self.free_slots = torch.cat([self.free_slots, *self.release_slots])
            self.release_slots, self.num_release_slots = [], 0
        out = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        self.slot_used[out] = True
        return out

    def free(self, indices: torch.Tensor) -> int:
        """Return host slots; raises :class:`DoubleFreeError` on a slot that is not allocated."""
        idx = torch.as_tensor(indices, dtype=_I64).reshape(-1)
        if idx.numel() == 0:
            return 0
        if int(idx.min()) < 0 or int(idx.max()) >= self.size:
            raise DoubleFreeError(f"HostKVCache.free: slot out of range 0..{self.size - 1} "
                                  f"(got {int(idx.min())}..{int(idx.max())})")
        if not bool(self.slot_used[idx].all()):
            bad = idx[~self.slot_used[idx]].tolist()[:8]
            raise DoubleFreeError(f"HostKVCache.free: double free of host slots {bad}")
        if self._repeats(idx):
            raise DoubleFreeError("HostKVCache.free: double free of host slots repeated in one free")
        self.slot_used[idx] = False
        self.release_slots.append(idx.clone())
        self.num_release_slots += idx.numel()
        return idx.numel()

    def _repeats(self, idx: torch.Tensor) -> bool:
        """Whether a slot appears twice in ``idx``. Slots that come as whole pages (each page's slots in order from
        its first) repeat iff a page does, which is checked on the pages alone (a sort over every slot was the
        host tier's largest cost in a simulation); anything else is checked slot by slot."""
        ps = self.page_size
        if ps > 1 and idx.numel() % ps == 0:
            pages = idx.view(-1, ps)
            firsts = pages[:, 0]
            if bool((firsts % ps == 0).all()) and bool((pages == firsts[:, None] + self._run).all()):
                return len(torch.unique(firsts)) != len(firsts)
        return len(torch.unique(idx)) != len(idx)

    def all_allocated(self, indices: torch.Tensor) -> bool:
        if indices.numel() == 0:
            return True
        if int(indices.min()) < 0 or int(indices.max()) >= self.size:
            return False
        return bool(self.slot_used[indices].all())

    def check_invariants(self) -> None:
        """free + staged + used == size; no slot both free and used; no free slot listed twice."""
        free = torch.cat([self.free_slots, *self.release_slots]) if self.release_slots else self.free_slots
        require(free.numel() == self.available_size(), "HostKVCache: available_size counts the free list",
                free=free.numel(), available=self.available_size())
        require(len(torch.unique(free)) == free.numel(), "HostKVCache: no slot is free twice", free=free.numel())
        used = int(self.slot_used.sum())
        if used + free.numel() != self.size or bool(self.slot_used[free].any()):
            raise InvariantError("HostKVCache: free + used == size, and no slot is both", used=used,
                                 free=free.numel(), size=self.size)
