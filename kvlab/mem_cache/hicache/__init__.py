"""HiCache's host tier (L2): the host pool, the copies between the tiers, and the two-tier radix tree.

Mirrors SGLang 0.5.16's hierarchical cache under its own names, so a learner can read the two side by side. Each
module here reads against one upstream file or one part of it:

==================== ==============================================================================================
module               upstream (``sglang/srt/...``)
==================== ==============================================================================================
``memory_pool_host`` ``mem_cache/memory_pool_host.py`` / ``mem_cache/pool_host/base.py::HostKVCache`` (host slots,
                     sized as SGLang sizes them); 0.5.23's ``mem_cache/hicache_auto_size.py``
``cache_controller`` ``managers/cache_controller.py::HiCacheController`` (copies on a modelled clock)
``tree_node``        ``mem_cache/radix_cache.py::TreeNode`` with its HiCache fields
``results``          ``mem_cache/base_prefix_cache.py::MatchResult`` / ``EvictResult`` as the two-tier tree fills them
``hiradix_cache``    ``mem_cache/hiradix_cache.py::HiRadixCache``: the class, match, insert, request flows, locks
``leaf_index``       ``HiRadixCache``'s leaf sets (``_update_host_leaf_status``) and eviction heaps
                     (``_make_eviction_heap``, ``_promote_parent``), kept across calls
``tier_moves``       ``HiRadixCache.evict`` / ``load_back`` / ``init_load_back`` over slot tensors (the copies,
                     frees and answers of the moves ``two_tier_core`` makes)
``invariants``       kvlab's own: ``HiRadixCache.check_invariants()``
``two_tier_core``    what both two-tier trees (slots, pages) share, written once: ``HiRadixCache``'s match and
                     insert walks, and kvlab's match ends, walk replay and structural check
``two_tier_moves``   ``HiRadixCache.write_backup``, ``evict`` (demotion, write-back), ``evict_host``,
                     ``load_back``, ``writing_check`` / ``loading_check``: both two-tier trees' moves, written once
``page_host``        the host pool as free pages and ``HiCacheController`` over counts (the page engine's)
``page_tier_moves``  ``tier_moves`` in pages (the copies and frees over counts)
``page_hiradix``     ``HiRadixCache`` op for op over page ids (the page engine's two-tier tree)
``storage``          0.5.23's ``mem_cache/hicache_storage.py::HiCacheFile``, ``storage/file/lru_file_evictor.py``,
                     ``mem_cache/utils.py::get_hash_str``: the L3 store of page keys, its capacity, backend presets
``storage_controller`` ``managers/cache_controller.py``: ``prefetch`` / ``prefetch_thread_func`` /
                     ``_page_transfer``, ``write_storage`` / ``backup_thread_func`` (L3 channels, modelled clock)
``storage_moves``    ``HiRadixCache.prefetch_from_storage`` / ``check_prefetch_progress`` /
                     ``can_terminate_prefetch`` / ``_insert_helper_host`` / ``write_backup_storage`` (0.5.16)
==================== ==============================================================================================

Imports go one way: ``memory_pool_host`` <- ``cache_controller``; ``tree_node`` <- ``results``, ``leaf_index``
<- ``tier_moves``; ``invariants``; ``storage`` <- ``storage_controller`` <- ``storage_moves``; all <-
``hiradix_cache`` (which mixes ``leaf_index``, ``tier_moves``, ``storage_moves`` and ``invariants`` into
:class:`HiRadixCache`). Names are imported on first use (``__getattr__``), so importing one
module does not import the tree. Import the public names from this package
(``from kvlab.mem_cache.hicache import HiRadixCache, HostKVCache``).
"""

from __future__ import annotations

from kvlab.lazy import lazy_exports

_EXPORTS = {  # module -> the names the package re-exports from it, imported on first use
    "kvlab.mem_cache.hicache.memory_pool_host": ("HostKVCache", "auto_hicache_ratio", "host_pool_size"),
    "kvlab.mem_cache.hicache.cache_controller": ("DEFAULT_HOST_DEVICE_BYTES_PER_S", "HiCacheController",
                                                 "WRITE_POLICIES"),
    "kvlab.mem_cache.hicache.tree_node": ("HiTreeNode",),
    "kvlab.mem_cache.hicache.results": ("HiEvictResult", "HiMatchResult", "LoadBackResult"),
    "kvlab.mem_cache.hicache.hiradix_cache": ("HiRadixCache", "LOAD_BACK_EVICT_MODES"),
    "kvlab.mem_cache.hicache.storage": ("HiCacheStorage", "STORAGE_PRESETS", "get_hash_str"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = ["DEFAULT_HOST_DEVICE_BYTES_PER_S", "HiCacheController", "HiEvictResult", "HiMatchResult", "HiRadixCache",
           "HiCacheStorage", "HiTreeNode", "HostKVCache", "LOAD_BACK_EVICT_MODES", "LoadBackResult", "STORAGE_PRESETS",
           "WRITE_POLICIES", "auto_hicache_ratio", "get_hash_str", "host_pool_size"]
