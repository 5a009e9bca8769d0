"""Which evictable leaf goes first.

Mirrors ``sglang/srt/mem_cache/evict_policy.py``: each strategy maps a tree node to a priority and
the *smallest* priority is evicted first. SGLang breaks ties by comparing the nodes themselves
(``TreeNode.__lt__``: older ``last_access_time`` first); kvlab appends ``last_access_time`` and
then the node id to every key, so victim order is total and reproducible. Times come from the
cache's logical clock (``radix_tree.LogicalClock``), never from wall time.

| policy     | priority (smaller = evicted first)                  |
| ---------- | --------------------------------------------------- |
| ``lru``    | ``last_access_time``                                |
| ``lfu``    | ``(hit_count, last_access_time)``                   |
| ``fifo``   | ``creation_time``                                   |
| ``mru``    | ``-last_access_time``                               |
| ``filo``   | ``-creation_time``                                  |
| ``priority`` | ``(priority, last_access_time)``                  |
| ``slru``   | ``(1 if hit_count >= protected_threshold else 0, last_access_time)`` |
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TypeVar

from kvlab.mem_cache.base_prefix_cache import EvictParams, EvictResult, PrefixNode, Priority

# EvictParams / EvictResult live in base_prefix_cache (as in SGLang); kept importable from here.
__all__ = ["EVICTION_POLICIES", "EvictParams", "EvictResult", "EvictionStrategy", "get_eviction_strategy",
           "register_policy"]

EVICTION_POLICIES: dict[str, type[EvictionStrategy]] = {}

_S = TypeVar("_S", bound=type)


def register_policy(name: str) -> Callable[[_S], _S]:
    """Class decorator: make a strategy available as ``get_eviction_strategy(name)``."""

    def deco(cls: _S) -> _S:
        EVICTION_POLICIES[name] = cls
        return cls

    return deco


class EvictionStrategy(abc.ABC):
    """Contract: ``get_priority(node)`` reads only the node's own fields (``last_access_time``,
    ``creation_time``, ``hit_count``, ``priority``), so a node's key changes only when the tree
    writes one of them, which is when the tree re-indexes the leaf."""

    @abc.abstractmethod
    def get_priority(self, node: PrefixNode) -> Priority: ...


@register_policy("lru")
class LRUStrategy(EvictionStrategy):
    def get_priority(self, node: PrefixNode) -> Priority:
        return node.last_access_time


@register_policy("lfu")
class LFUStrategy(EvictionStrategy):
    def get_priority(self, node: PrefixNode) -> Priority:
        return (node.hit_count, node.last_access_time)


@register_policy("fifo")
class FIFOStrategy(EvictionStrategy):
    def get_priority(self, node: PrefixNode) -> Priority:
        return node.creation_time


@register_policy("mru")
class MRUStrategy(EvictionStrategy):
    def get_priority(self, node: PrefixNode) -> Priority:
        return -node.last_access_time


@register_policy("filo")
class FILOStrategy(EvictionStrategy):
    def get_priority(self, node: PrefixNode) -> Priority:
        return -node.creation_time


@register_policy("priority")
class PriorityStrategy(EvictionStrategy):
    """Lower request priority evicted first, LRU within a priority."""

    def get_priority(self, node: PrefixNode) -> Priority:
        return (node.priority, node.last_access_time)


@register_policy("slru")
class SLRUStrategy(EvictionStrategy):
    """Segmented LRU: nodes hit ``protected_threshold`` times outlive the probationary ones."""

    def __init__(self, protected_threshold: int = 2):
        self.protected_threshold = protected_threshold

    def get_priority(self, node: PrefixNode) -> Priority:
        return (1 if node.hit_count >= self.protected_threshold else 0, node.last_access_time)


def get_eviction_strategy(name: str, config: dict | None = None) -> EvictionStrategy:
    """``utils.get_eviction_strategy``: build a registered strategy; ``config`` = constructor kwargs."""
    try:
        cls = EVICTION_POLICIES[name.lower()]
    except KeyError:
        raise ValueError(
            f"Unknown eviction policy: {name!r}. Supported policies: {', '.join(sorted(EVICTION_POLICIES))}"
        ) from None
    return cls(**(config or {}))
