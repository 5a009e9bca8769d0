"""Which evictable leaf goes first, and the request/result types of an eviction.

Mirrors ``sglang/srt/mem_cache/evict_policy.py``: each strategy maps a tree node to a priority and
the *smallest* priority is evicted first. SGLang breaks ties by comparing the nodes themselves
(``TreeNode.__lt__``: older ``last_access_time`` first); kvlab appends ``last_access_time`` and
then the node id to every key, so victim order is total and reproducible. Times come from the
cache's logical clock (``radix_cache.LogicalClock``), never from wall time.

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
from dataclasses import dataclass
from typing import Any, TypeVar

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
    def get_priority(self, node: Any) -> Any: ...


@register_policy("lru")
class LRUStrategy(EvictionStrategy):
    def get_priority(self, node):
        return node.last_access_time


@register_policy("lfu")
class LFUStrategy(EvictionStrategy):
    def get_priority(self, node):
        return (node.hit_count, node.last_access_time)


@register_policy("fifo")
class FIFOStrategy(EvictionStrategy):
    def get_priority(self, node):
        return node.creation_time


@register_policy("mru")
class MRUStrategy(EvictionStrategy):
    def get_priority(self, node):
        return -node.last_access_time


@register_policy("filo")
class FILOStrategy(EvictionStrategy):
    def get_priority(self, node):
        return -node.creation_time


@register_policy("priority")
class PriorityStrategy(EvictionStrategy):
    """Lower request priority evicted first, LRU within a priority."""

    def get_priority(self, node):
        return (node.priority, node.last_access_time)


@register_policy("slru")
class SLRUStrategy(EvictionStrategy):
    """Segmented LRU: nodes hit ``protected_threshold`` times outlive the probationary ones."""

    def __init__(self, protected_threshold: int = 2):
        self.protected_threshold = protected_threshold

    def get_priority(self, node):
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


@dataclass(frozen=True)
class EvictParams:
    """``base_prefix_cache.EvictParams``: tokens to free from the full pool (and the SWA pool)."""

    num_tokens: int = 0
    swa_num_tokens: int = 0


@dataclass(frozen=True)
class EvictResult:
    """What one eviction did, in tokens. ``evicted == needed + over_evicted + overshoot``, where
    ``needed = min(evicted_tokens, shortfall_tokens)``.

    - ``shortfall_tokens``: what was truly missing, ``max(0, need - available)``. A direct
      ``RadixCache.evict(n)`` call knows no pool, so there it is ``n``.
    - ``requested_tokens``: what was asked of the tree. Equal to the shortfall with the fix
      (SGLang >= 0.5.17); the whole need in the bug (<= 0.5.16, ``mode="full"``).
    - ``evicted_tokens``: what the tree freed (whole leaves, so possibly more than requested, or
      less when it ran out of evictable leaves).
    - ``over_evicted_tokens``: evicted because the request exceeded the shortfall (the bug's
      damage): ``max(0, min(evicted, requested) - shortfall)``.
    - ``overshoot_tokens``: leaf-granularity excess beyond the request:
      ``max(0, evicted - max(requested, swa_requested))``. Present with or without the bug.
    - ``swa_shortfall_tokens`` / ``swa_requested_tokens``: the SWA pool's side (SWA allocator
      arm only; 0 otherwise).
    """

    shortfall_tokens: int = 0
    requested_tokens: int = 0
    evicted_tokens: int = 0
    over_evicted_tokens: int = 0
    overshoot_tokens: int = 0
    swa_shortfall_tokens: int = 0
    swa_requested_tokens: int = 0

    @classmethod
    def of(cls, shortfall: int, requested: int, evicted: int, swa_shortfall: int = 0,
           swa_requested: int = 0) -> EvictResult:
        return cls(
            shortfall_tokens=shortfall,
            requested_tokens=requested,
            evicted_tokens=evicted,
            over_evicted_tokens=max(0, min(evicted, requested) - shortfall),
            overshoot_tokens=max(0, evicted - max(requested, swa_requested)),
            swa_shortfall_tokens=swa_shortfall,
            swa_requested_tokens=swa_requested,
        )

    @property
    def num_tokens_evicted(self) -> int:
        """SGLang's name for ``evicted_tokens``."""
        return self.evicted_tokens
