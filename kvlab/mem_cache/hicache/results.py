"""What the two-tier tree answers: a match on both tiers, an eviction split by what became of the tokens, a load-back.

Upstream: ``sglang/srt/mem_cache/base_prefix_cache.py::MatchResult`` (its host fields ``last_host_node``,
``host_hit_length``) and ``EvictResult``, as 0.5.16's ``hiradix_cache.py`` fills them; :class:`LoadBackResult`
is kvlab's own (SGLang's ``load_back`` returns the device indices or None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from kvlab.mem_cache.base_prefix_cache import EvictResult, MatchResult

if TYPE_CHECKING:
    from kvlab.mem_cache.hicache.tree_node import HiTreeNode


class HiMatchResult(NamedTuple):
    """``match_prefix``'s answer (0.5.16's ``MatchResult`` with its host fields): the one-tier :class:`MatchResult`'s
    three fields and its ``prefix_len``, then the host tier's two.

    ``device_indices`` / ``last_device_node`` / ``device_prefix_len``: the prefix on the device (lock
    ``last_device_node`` to pin it); ``last_host_node``: the deepest matched node with a host copy (where a
    load-back starts, SGLang's ``best_match_node``); ``host_hit_length``: matched tokens that are on host only,
    below ``last_device_node``."""

    device_indices: torch.Tensor
    last_device_node: HiTreeNode
    device_prefix_len: int
    last_host_node: HiTreeNode
    host_hit_length: int

    prefix_len = MatchResult.prefix_len  # the device prefix, the one-tier MatchResult's property

    @property
    def best_match_node(self) -> HiTreeNode:
        return self.last_host_node


@dataclass(frozen=True)
class HiEvictResult(EvictResult):
    """:class:`EvictResult` (device tokens) split by what became of them: ``demoted_tokens`` left the device but
    stay on host (already backed up, or written back first: ``written_back_tokens``), ``destroyed_tokens`` are
    gone from both tiers (``evicted = demoted + destroyed``); ``host_evicted_tokens``: host copies freed to make
    room for write-backs."""

    demoted_tokens: int = 0
    written_back_tokens: int = 0
    destroyed_tokens: int = 0
    host_evicted_tokens: int = 0


class LoadBackResult(NamedTuple):
    """What :meth:`HiRadixCache.load_back` did. ``device_indices``: the new device slots of the loaded tokens
    (None when nothing was loaded; ``reason`` says why: ``"below_threshold"``, ``"over_quota"``,
    ``"device_full"``); ``evict``: the device eviction it ran to make room (empty when none was needed)."""

    device_indices: torch.Tensor | None
    evict: EvictResult
    reason: str | None = None

    @property
    def loaded_tokens(self) -> int:
        return 0 if self.device_indices is None else int(self.device_indices.shape[0])


NO_EVICT = EvictResult()  # a load-back that evicted nothing
