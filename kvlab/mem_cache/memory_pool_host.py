"""Old import path of the host pool, kept for the modules that still use it: it lives in
:mod:`kvlab.mem_cache.hicache.memory_pool_host`."""

from kvlab.mem_cache.hicache.memory_pool_host import (
    ALLOCATION_SLACK_FRACTION,
    HICACHE_HOST_MEMORY_RESERVE_BYTES,
    HostKVCache,
    HostPoolSize,
    auto_hicache_ratio,
    host_pool_size,
)

__all__ = ["ALLOCATION_SLACK_FRACTION", "HICACHE_HOST_MEMORY_RESERVE_BYTES", "HostKVCache", "HostPoolSize",
           "auto_hicache_ratio", "host_pool_size"]
