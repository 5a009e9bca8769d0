"""The host tier at page granularity, for the page engine (``kvlab.sched.page_kv.PageKV`` with a host tier): the host
pool as a count of free pages, and :class:`HiCacheController`'s copies over counts.

Why counts are enough. SGLang's host pool (``pool_host/base.py::HostKVCache``, kvlab's
:class:`~kvlab.mem_cache.hicache.memory_pool_host.HostKVCache`) hands out whole pages and fails exactly when the
pages asked for outnumber the free ones, staged frees included; which host slot a node holds is read by nothing but
the copy itself, which kvlab does not make. A copy's time is its tokens times the bytes per token over the link: a
count too. So :class:`PageHostPool` is the pool's free pages, and :class:`PageHiController` is
:class:`~kvlab.mem_cache.hicache.cache_controller.HiCacheController` itself (its FIFO channels, its clock, ``poll``,
``wait_writes``, ``drain_time`` and totals: one clock for both memories) with ``write`` / ``load`` / ``evict_device`` /
``evict_host`` over counts; a copy's "indices" are ``range(tokens)``, and so are a storage prefetch's host slots
(:meth:`PageHostPool.alloc`; the storage tier's controller, ``storage_controller.StorageController``, serves both
trees). No torch.
"""

from __future__ import annotations

from kvlab.errors import require
from kvlab.mem_cache.hicache.cache_controller import (
    DEFAULT_HOST_DEVICE_BYTES_PER_S,
    LOAD,
    CacheOperation,
    HiCacheController,
)
from kvlab.mem_cache.options import FINISH_TOLERANCE_S, host_pool_size


class PageHostPool:
    """The host pool's free pages (``HostKVCache``'s ``alloc`` / ``free`` / ``available_size`` as counts), sized by
    :func:`~kvlab.mem_cache.options.host_pool_size` (SGLang's rule: one page more than the whole pages)."""

    def __init__(self, device_size_tokens: int, size_per_token: int, page_size: int, hicache_ratio: float = 2.0,
                 hicache_size_gb: float = 0) -> None:
        self.sizing = host_pool_size(device_size_tokens, size_per_token, page_size, hicache_ratio, hicache_size_gb)
        self.size = self.sizing.size_tokens
        self.page_size = page_size
        self.page_num = self.free_pages = self.sizing.num_pages
        self.size_per_token = size_per_token
        self.hicache_ratio, self.hicache_size_gb = hicache_ratio, hicache_size_gb
        self.device_size_tokens = device_size_tokens

    def available_size(self) -> int:
        return self.free_pages * self.page_size

    def used_size(self) -> int:
        return (self.page_num - self.free_pages) * self.page_size

    def take(self, pages: int) -> bool:
        """Hand out ``pages``; False (and nothing taken) when fewer are free (``HostKVCache.alloc`` -> None)."""
        if pages > self.free_pages:
            return False
        self.free_pages -= pages
        return True

    def alloc(self, tokens: int) -> range | None:
        """``HostKVCache.alloc`` as a count (a storage prefetch's slots): ``range(tokens)``, None when short."""
        return range(tokens) if self.take(tokens // self.page_size) else None

    def free(self, indices: range) -> int:
        """``HostKVCache.free`` of slots :meth:`alloc` handed out (or a slice of them)."""
        self.free_pages += len(indices) // self.page_size
        return len(indices)

    def check_invariants(self) -> None:
        require(0 <= self.free_pages <= self.page_num, "PageHostPool: 0 <= free pages <= pool pages",
                free=self.free_pages, pages=self.page_num)


class PageHiController(HiCacheController):
    """:class:`HiCacheController` over page counts: ``allocator`` is the device pool's free pages (an object with
    ``free`` and ``take(pages)``, the page engine's ``PageCounter``), ``mem_pool_host`` a :class:`PageHostPool`.
    ``write`` / ``load`` take and give tokens (whole pages) and return whether the copy was issued."""

    def __init__(self, allocator, mem_pool_host: PageHostPool, write_policy: str = "write_through",
                 d2h_bytes_per_s: float = DEFAULT_HOST_DEVICE_BYTES_PER_S,
                 h2d_bytes_per_s: float = DEFAULT_HOST_DEVICE_BYTES_PER_S, latency_s: float = 0.0) -> None:
        super().__init__(allocator, mem_pool_host, write_policy, d2h_bytes_per_s, h2d_bytes_per_s, latency_s)
        self.page_size = mem_pool_host.page_size

    def write(self, tokens: int, node_id: int) -> bool:
        """Back ``tokens`` up to fresh host pages; False (nothing issued) when the host pool is short."""
        pool, pages = self.mem_pool_host, tokens // self.page_size
        if pages > pool.free_pages:  # (PageHostPool.take and _issue_counted's refusal, inlined: half the backups of a
            self.totals.write_failures += 1  # full pool are refused first, then retried after a host eviction)
            return False
        pool.free_pages -= pages
        slots = range(tokens)  # (a copy's indices, on both sides)
        # (HiCacheController._issue(WRITE, slots, slots, node_id), inlined without its lookups by name: a copy per
        # backup; the copy's time is the controller's transfer_seconds)
        queue, start = self.write_queue, self.now_s
        if queue and queue[-1].finish_s > start:
            start = queue[-1].finish_s
        finish = start + self.transfer_seconds(tokens, self.d2h_bytes_per_s)
        queue.append(CacheOperation("write", slots, slots, node_id, start, finish))
        if finish - FINISH_TOLERANCE_S < self.due_s:
            self.due_s = finish - FINISH_TOLERANCE_S
        totals = self.totals
        totals.written_tokens += tokens
        totals.write_s += finish - start
        totals.writes += 1
        return True

    def load(self, tokens: int, node_id: int) -> bool:
        """Load ``tokens`` into fresh device pages; False (nothing issued) when the device pool is short."""
        slots = range(tokens)
        taken = slots if self.mem_pool_device_allocator.take(tokens // self.page_size) else None
        return self._issue_counted(LOAD, slots, taken, node_id) is not None

    def evict_device(self, tokens: int) -> int:
        self.mem_pool_device_allocator.free += tokens // self.page_size
        return tokens

    def evict_host(self, tokens: int) -> int:
        self.mem_pool_host.free_pages += tokens // self.page_size
        return tokens
