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
from operator import attrgetter
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


# The policies whose priority is one read of the node's fields (the table above, in registration order):
# ``operator.attrgetter`` reads a field, or a tuple of fields, with no Python frame (the trees call it on every
# heap push).
_FIELD_POLICIES = (
    ("lru", attrgetter("last_access_time"), "Least recently used first."),
    ("lfu", attrgetter("hit_count", "last_access_time"), "Least hit first, LRU among equals."),
    ("fifo", attrgetter("creation_time"), "Oldest node first."),
    ("mru", lambda node: -node.last_access_time, "Most recently used first."),
    ("filo", lambda node: -node.creation_time, "Newest node first."),
    ("priority", attrgetter("priority", "last_access_time"), "Lower request priority first, LRU within a priority."),
)
for _name, _priority, _doc in _FIELD_POLICIES:  # (each class importable by its name: LRUStrategy, ...)
    globals()[f"{_name.upper()}Strategy"] = register_policy(_name)(type(
        f"{_name.upper()}Strategy", (EvictionStrategy,),
        {"get_priority": staticmethod(_priority), "__doc__": _doc, "__module__": __name__}))
del _name, _priority, _doc


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
