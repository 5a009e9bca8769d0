"""Old import path of the host tier's copy controller, kept for the modules that still use it: it lives in
:mod:`kvlab.mem_cache.hicache.cache_controller`."""

from kvlab.mem_cache.hicache.cache_controller import (
    DEFAULT_HOST_DEVICE_BYTES_PER_S,
    FINISH_TOLERANCE_S,
    WRITE_POLICIES,
    CacheOperation,
    HiCacheController,
    TransferTotals,
)

__all__ = ["DEFAULT_HOST_DEVICE_BYTES_PER_S", "FINISH_TOLERANCE_S", "WRITE_POLICIES", "CacheOperation",
           "HiCacheController", "TransferTotals"]
