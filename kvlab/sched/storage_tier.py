"""The storage tier (L3) as both memories attach and consult it: the store and its channel from the run's config
(a backend preset, :data:`~kvlab.mem_cache.hicache.storage.STORAGE_PRESETS`), and the admission check of a request's
prefetch. The token-level memory (:class:`~kvlab.sched.kv.SchedulerKV`, a ``HiRadixCache``) and the page engine
(:class:`~kvlab.sched.page_kv.PageKV`, a ``PageHiRadixTree``) share them; each tree runs the prefetches and backups
itself (``kvlab.mem_cache.hicache.storage_moves``, one mixin for both). No torch.
"""

from __future__ import annotations

from kvlab.mem_cache.hicache.storage import STORAGE_PRESETS, HiCacheStorage, storage_capacity_bytes
from kvlab.sched.config import SchedulerConfig
from kvlab.sched.request import SimReq


def storage_store(config: SchedulerConfig, storage: HiCacheStorage | None) -> HiCacheStorage:
    """``storage`` (a store kept from an earlier run: what ``/flush_cache`` leaves) or a new empty one of the
    config's backend preset and capacity."""
    if storage is not None:
        return storage
    return HiCacheStorage(config.page_size * config.cost.kv_bytes_per_token,
                          storage_capacity_bytes(config.hicache_storage_backend, config.hicache_storage_size_gb))


def storage_options(config: SchedulerConfig) -> dict:
    """``attach_storage``'s channel and prefetch settings: the backend preset's speeds, the config's policy,
    threshold and timeout."""
    preset = STORAGE_PRESETS[config.hicache_storage_backend]
    return dict(read_bytes_per_s=preset.read_gbps * 1e9, write_bytes_per_s=preset.write_gbps * 1e9,
                latency_s=preset.latency_us * 1e-6, prefetch_policy=config.hicache_storage_prefetch_policy,
                prefetch_threshold=config.prefetch_threshold,
                prefetch_timeout=(config.prefetch_timeout_base, config.prefetch_timeout_per_ki_token,
                                  config.prefetch_timeout_max))


def start_prefetch(tree, req: SimReq, last_host, tokens) -> None:
    """On arrival (after the request's match, which gave it its ``host`` state): ``prefetch_from_storage`` of
    ``tokens``, its prompt past the host match that ends at ``last_host``; ``host.prefetching`` while one is under
    way (the scheduler asks :func:`prefetch_done` of those only)."""
    req.host.prefetching = tree.prefetch_from_storage(id(req), last_host, tokens, tree.get_last_hash_value(last_host))


def prefetch_done(tree, req: SimReq) -> bool:
    """Before admission (``check_prefetch_progress``): may the request be scheduled now? Its pages read from
    storage are then in the tree, host only (``pop_prefetch_loaded_tokens``: its storage hit)."""
    host = req.host
    if host is None or not host.prefetching:  # (most requests: no prefetch, nothing loaded)
        return True
    if id(req) in tree.ongoing_prefetch and not tree.check_prefetch_progress(id(req)):
        return False
    host.prefetching = False  # (done with, or revoked for want of host room meanwhile)
    loaded = tree.pop_prefetch_loaded_tokens(id(req))
    if loaded:
        host.storage_len = loaded
    return True
