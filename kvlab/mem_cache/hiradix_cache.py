"""Old import path of the two-tier tree, kept for the modules that still use it: the tree lives in
:mod:`kvlab.mem_cache.hicache` (``hicache/hiradix_cache.py`` and the modules beside it)."""

from kvlab.mem_cache.hicache.hiradix_cache import LOAD_BACK_EVICT_MODES, HiRadixCache
from kvlab.mem_cache.hicache.results import HiEvictResult, HiMatchResult, LoadBackResult
from kvlab.mem_cache.hicache.tree_node import HiTreeNode

__all__ = ["HiEvictResult", "HiMatchResult", "HiRadixCache", "HiTreeNode", "LOAD_BACK_EVICT_MODES", "LoadBackResult"]
