"""The token tree's side of the moves between tiers: the copies and frees over slot tensors that
:class:`~kvlab.mem_cache.hicache.two_tier_moves.TwoTierMoves`' backups, device and host eviction and load-back run
(written once there for both two-tier trees), and the answers as the scheduler reads them.

Upstream: ``sglang/srt/mem_cache/hiradix_cache.py::HiRadixCache`` (0.5.16): ``evict``'s result, ``load_back``'s
and ``init_load_back``. The load-back's eviction is finding 2's rule (:func:`~kvlab.mem_cache.shortfall.tokens_to_evict`).
A mixin of :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvlab.mem_cache.base_prefix_cache import EvictParams, EvictResult
from kvlab.mem_cache.hicache.cache_controller import CacheOperation, HiCacheController
from kvlab.mem_cache.hicache.results import NO_EVICT, HiEvictResult, LoadBackResult
from kvlab.mem_cache.hicache.tree_node import HiTreeNode
from kvlab.mem_cache.hicache.two_tier_moves import TwoTierMoves
from kvlab.mem_cache.shortfall import over_evicted_tokens, shortfall_tokens, tokens_to_evict


class TierMoves(TwoTierMoves):
    """The tier-move methods of :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` (a mixin): they use
    its controller, its leaf indexes, its locks and its counters."""

    cache_controller: HiCacheController
    write_policy: str
    load_back_threshold: int
    load_back_evict_mode: str
    host_evicted_tokens: int
    ongoing_write_through: dict[int, tuple[CacheOperation, HiTreeNode | None]]
    ongoing_load_back: dict[int, tuple[CacheOperation, HiTreeNode]]

    # -- the copies and frees TwoTierMoves' write_backup, evict and evict_host run over slot tensors ------------------
    def _write_host(self, node: HiTreeNode) -> torch.Tensor | None:
        """Issue ``node``'s backup: its host slots (the copy's op holds the same tensor; neither writes to it), or
        None (nothing issued) when the host pool is full."""
        return self.cache_controller.write(node.value, node.id)

    def _free_device(self, node: HiTreeNode, value: torch.Tensor) -> None:
        self.cache_controller.evict_device(value)

    def _free_host(self, node: HiTreeNode) -> None:
        self.cache_controller.evict_host(node.host_value)

    # -- device eviction (TwoTierMoves._evict_leaves) ----------------------------------------------------------------
    def evict(self, params: EvictParams | int) -> HiEvictResult:
        """Free at least ``num_tokens`` device tokens from unlocked device leaves, in the strategy's order (or all
        there are). A backed-up leaf is demoted to host-only; an unbacked one is destroyed (write-through
        policies) or written to host first (``write_back``: the eviction waits for the copy; if the host pool
        stays full, the leaf and its host-only subtree are dropped). A parent whose children all left the device
        becomes a candidate. ``HiRadixCache.evict`` -> ``_evict_write_through`` / ``_evict_write_back``."""
        num_tokens = params if isinstance(params, int) else params.num_tokens
        tally = {"demoted": 0, "written": 0, "destroyed": 0}
        host_before = self.host_evicted_tokens
        evicted = self._evict_leaves(num_tokens, tally)
        res = EvictResult.of(num_tokens, num_tokens, evicted)
        return HiEvictResult(**res.__dict__, demoted_tokens=tally["demoted"] + tally["written"],
                             written_back_tokens=tally["written"], destroyed_tokens=tally["destroyed"],
                             host_evicted_tokens=self.host_evicted_tokens - host_before)

    # -- load-back (host -> device) ------------------------------------------------------------------
    def load_back(self, node: HiTreeNode, mem_quota: int | None = None) -> LoadBackResult:
        """Bring the host-only path ending at ``node`` back to the device, all or nothing (TwoTierMoves'
        ``_load_back``): the new slots, the eviction it ran and why nothing was loaded, if so."""
        device, ev, reason = self._load_back(node, mem_quota)
        return LoadBackResult(device, NO_EVICT if ev is None else ev, reason)

    def _host_source(self, to_load: list[HiTreeNode], tokens: int) -> torch.Tensor:
        return torch.cat([x.host_value for x in to_load]) if to_load else self._empty

    def _load_device(self, host_indices: torch.Tensor, last_hit: HiTreeNode) -> torch.Tensor | None:
        return self.cache_controller.load(host_indices, last_hit.id)

    def _evict_for_load(self, n: int, available: int) -> HiEvictResult:
        """A load-back of ``n`` tokens found ``available`` device slots free: evict what finding 2's rule asks for
        (:func:`~kvlab.mem_cache.shortfall.tokens_to_evict` in ``load_back_evict_mode``), counted against the
        shortfall."""
        shortfall = shortfall_tokens(n, available)
        requested = tokens_to_evict(n, available, self.load_back_evict_mode)
        got = self.evict(requested)
        return replace(got, shortfall_tokens=shortfall,
                       over_evicted_tokens=over_evicted_tokens(got.evicted_tokens, requested, shortfall))

    def init_load_back(self, last_node: HiTreeNode, mem_quota: int | None = None) -> tuple[torch.Tensor, HiTreeNode]:
        """The scheduler's entry (``init_load_back``): load back if ``last_node`` is host-only; returns the loaded
        device slots (empty if none) and the node the request's device prefix now ends at."""
        if last_node.value is not None:
            return self._empty, last_node
        res = self.load_back(last_node, mem_quota)
        if res.device_indices is not None:
            return res.device_indices, last_node
        while last_node.value is None:
            last_node = last_node.parent
        return self._empty, last_node
