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
asserts), and so does a free of slots that are not whole pages (all the pool hands out; SGLang takes any slots);
the per-token byte size is given directly (``size_per_token``) instead of read from a device
pool object; 0.5.23's auto-sizing (``hicache_auto_size.py``: lower the ratio until the pools fit a fraction of
host memory) is :func:`auto_hicache_ratio`. For speed (issue 21 item 7) the free list and the staged frees are
Python lists of page ids (``free_slots`` / ``release_slots`` read them as SGLang's slot tensors, in the same order),
and the slot tensors ``alloc`` hands out are slices of one table of slot numbers (a concatenation of slices when
the pages are not consecutive), so ``free`` reads their pages back without a per-slot check.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from kvlab.errors import DoubleFreeError, InvariantError, require
from kvlab.mem_cache.options import HostPoolSize as HostPoolSize  # re-exported: moved to the torch-free options
from kvlab.mem_cache.options import host_pool_size as host_pool_size
from kvlab.units import GB, GiB

_I64 = torch.int64

HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * GiB  # pool_host/base.py: host RAM left to the OS and other processes
ALLOCATION_SLACK_FRACTION = 0.05  # 0.5.23 hicache_auto_size.py: page rounding, metadata, staging buffers


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
        # Page ids, not slot tensors: the free list and the staged frees are Python lists (SGLang keeps slot
        # tensors; the order, and so every slot handed out, is the same). ``_free[_head:]`` is the free list: alloc
        # advances ``_head`` instead of copying the tail. ``_used`` marks the pages handed out (a bytearray, and a
        # tensor view of the same bytes for the vectorised checks).
        self._free: list[int] = list(range(self.page_num))
        self._head = 0
        self._release: list[int] = []
        self._used = bytearray(self.page_num)
        self._used_t = torch.frombuffer(self._used, dtype=torch.uint8)
        self._run = torch.arange(self.page_size, dtype=_I64)
        # every slot tensor alloc hands out is a slice of this table, or a cat of slices registered in _issued
        # (data pointer -> a weak reference to it and its pages), so free reads a tensor's pages back without
        # checking its slots one by one; neither is ever written in place
        # (filled page by page as alloc first reaches it: pages are first handed out in order, and an arange of a
        # pool of millions of slots is a visible part of a short simulation)
        self._table = torch.empty(self.size, dtype=_I64)
        self._table_np = self._table.numpy()  # the same memory: numpy concatenates slices at a third of torch's cost
        self._table_ptr = self._table.data_ptr()
        self._filled_pages = 0  # table[: _filled_pages * page_size] holds its slot numbers
        self._issued: dict[int, tuple[weakref.ref, list[int]]] = {}

    @property
    def free_slots(self) -> torch.Tensor:
        """The free list's slots, in the order ``alloc`` takes them (a copy)."""
        return self._slots(self._free[self._head:])

    @property
    def release_slots(self) -> list[torch.Tensor]:
        """The staged frees' slots (one tensor; empty list when none is staged)."""
        return [self._slots(self._release)] if self._release else []

    @property
    def num_release_slots(self) -> int:
        return len(self._release) * self.page_size

    def available_size(self) -> int:
        return (len(self._free) - self._head + len(self._release)) * self.page_size

    def used_size(self) -> int:
        return self.size - self.available_size()

    def _slots(self, pages: list[int]) -> torch.Tensor:
        """The slots of ``pages``, in order: the slot table's slice for a run of consecutive pages, else the
        concatenation of one slice per run (registered for :meth:`free`)."""
        ps = self.page_size
        if not pages:
            return self._table[:0]
        hi = max(pages) + 1
        if hi > self._filled_pages:
            self._table_np[self._filled_pages * ps : hi * ps] = np.arange(self._filled_pages * ps, hi * ps)
            self._filled_pages = hi
        runs = []
        start = prev = pages[0]
        for p in pages[1:]:
            if p != prev + 1:
                runs.append((start, prev + 1))
                start = p
            prev = p
        if not runs:
            return self._table[start * ps : (prev + 1) * ps]
        runs.append((start, prev + 1))
        table = self._table_np
        out = torch.from_numpy(np.concatenate([table[a * ps : b * ps] for a, b in runs]))
        ptr, issued = out.data_ptr(), self._issued

        def forget(ref: weakref.ref, ptr: int = ptr) -> None:
            if issued.get(ptr, (None,))[0] is ref:
                del issued[ptr]

        issued[ptr] = (weakref.ref(out, forget), pages)
        return out

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` host slots (whole pages), or None if fewer are free."""
        ps = self.page_size
        if need_size < 0 or need_size % ps:
            raise ValueError(f"HostKVCache.alloc({need_size}): need a non-negative multiple of page_size {ps}")
        k = need_size // ps
        head, free = self._head, self._free
        if k > len(free) - head:
            if k > len(free) - head + len(self._release):
                return None
            # the staged frees join the tail only now (SGLang's release_slots)
            self._free = free = free[head:] + self._release
            self._release, head = [], 0
        pages = free[head : head + k]
        self._head = head + k
        used = self._used
        for p in pages:
            used[p] = 1
        return self._slots(pages)

    def _pages_of(self, idx: torch.Tensor, what: str) -> list[int]:
        """The pages of ``idx`` (whole pages, each page's slots in order from its first), in order; raises
        :class:`DoubleFreeError` naming an out-of-range slot, ValueError for slots that are not whole pages."""
        ps = self.page_size
        if idx.stride(0) == 1:  # what alloc handed out, or whole pages of it: read back in O(pages)
            ptr, k = idx.data_ptr(), idx.numel()
            start = (ptr - self._table_ptr) // 8
            if 0 <= start and start + k <= self.size:  # a slice of the slot table
                if not start % ps and not k % ps:
                    return list(range(start // ps, (start + k) // ps))
            else:  # part of a concatenation alloc made, while it lives (its memory is then nobody else's)
                base = idx.untyped_storage().data_ptr()
                entry = self._issued.get(base)
                out = None if entry is None else entry[0]()
                if out is not None:
                    off = (ptr - base) // 8
                    if not off % ps and not k % ps and off + k <= out.numel():
                        return entry[1][off // ps : (off + k) // ps]
        if ps == 1:
            out = idx.tolist()
            lo, hi = (min(out), max(out)) if out else (0, 0)
        else:
            out = idx[::ps].tolist()
            lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.size:
            raise DoubleFreeError(f"HostKVCache.{what}: slot out of range 0..{self.size - 1} (got {lo}..{hi})")
        if ps > 1:
            if idx.numel() % ps or any(f % ps for f in out) or not torch.equal(
                    idx.view(-1, ps), torch.tensor(out, dtype=_I64)[:, None] + self._run):
                raise ValueError(f"HostKVCache.{what}: {idx.numel()} slots are not whole pages of {ps} (each page's "
                                 "slots in order from a multiple of page_size), which is all the host pool hands out")
            out = [f // ps for f in out]
        return out

    def free(self, indices: torch.Tensor) -> int:
        """Return host slots (whole pages); raises :class:`DoubleFreeError` on a slot that is not allocated."""
        idx = indices
        if not isinstance(idx, torch.Tensor) or idx.dtype != _I64 or idx.dim() != 1:
            idx = torch.as_tensor(indices, dtype=_I64).reshape(-1)
        if idx.numel() == 0:
            return 0
        pages = self._pages_of(idx, "free")
        used = self._used
        if not all(used[p] for p in pages):
            ps = self.page_size
            bad = [p * ps + i for p in pages if not used[p] for i in range(ps)][:8]
            raise DoubleFreeError(f"HostKVCache.free: double free of host slots {bad}")
        if len(set(pages)) != len(pages):
            raise DoubleFreeError("HostKVCache.free: double free of host slots repeated in one free")
        for p in pages:
            used[p] = 0
        self._release.extend(pages)
        return idx.numel()

    def all_allocated(self, indices: torch.Tensor) -> bool:
        if indices.numel() == 0:
            return True
        if int(indices.min()) < 0 or int(indices.max()) >= self.size:
            return False
        return bool(self._used_t[indices // self.page_size].all())

    def check_invariants(self) -> None:
        """free + staged + used == size; no page both free and used; no free page listed twice."""
        free = self._free[self._head:] + self._release
        require(len(free) * self.page_size == self.available_size(), "HostKVCache: available_size counts the free list",
                free_pages=len(free), available=self.available_size())
        require(len(set(free)) == len(free), "HostKVCache: no page is free twice", free_pages=len(free))
        require(all(0 <= p < self.page_num for p in free), "HostKVCache: free pages are pages of the pool",
                free_pages=len(free), page_num=self.page_num)
        used = sum(self._used)
        if used + len(free) != self.page_num or any(self._used[p] for p in free):
            raise InvariantError("HostKVCache: free + used == size, and no page is both", used_pages=used,
                                 free_pages=len(free), page_num=self.page_num)
