"""The choices a run's configuration names, and the host pool's sizing rule: plain Python, no torch.

``kvlab.sched.config`` and the CLI check a configuration against these without importing the pools and trees
(torch's import is most of a cold start). Their old homes re-export them: ``common.EVICTION_MODES``,
``cache_controller.WRITE_POLICIES`` and ``FINISH_TOLERANCE_S``, ``memory_pool_host.HostPoolSize`` / ``host_pool_size``,
``memory_pool.PoolTooLargeError`` (which the CLI catches around any simulation).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError
from kvlab.units import GB

EVICTION_MODES = ("shortfall", "full")  # common.evict_from_tree_cache's mode: SGLang >= 0.5.17, <= 0.5.16
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")  # HiCache's --hicache-write-policy
FINISH_TOLERANCE_S = 1e-12  # a copy finishing within this of the clock counts as finished (float sums of seconds)


class PoolTooLargeError(KvlabError, MemoryError):
    """A pool table larger than this machine's memory (issue 26: torch's raw allocator message, or the machine
    swapping); the message gives the table's shape and bytes and what sets them."""


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
    (decimal GB, ``--hicache-size``) wins over ``hicache_ratio`` (``--hicache-ratio``, default 2.0). The rule,
    in SGLang's order, is in ``memory_pool_host``'s docstring."""
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
