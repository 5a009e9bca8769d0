"""The page tree's side of the moves between tiers: the copies and frees over page counts that
:class:`~kvlab.mem_cache.hicache.two_tier_moves.TwoTierMoves`' backups, device and host eviction and load-back run
(written once there for both two-tier trees; a mixin of :class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree`).

Upstream, as ``tier_moves``: 0.5.16's ``hiradix_cache.py::HiRadixCache`` ``evict`` and ``load_back`` (with kvlab's
``load_back_evict_mode``, finding 2's rule) as the page engine reads them. Where the token tree moves slot tensors
this one moves counts: the controller (:class:`~kvlab.mem_cache.hicache.page_host.PageHiController`) takes and
gives pages of both pools and times each copy on the shared clock. Counts here are pages; the controller and the
host-eviction total count tokens. No torch.
"""

from __future__ import annotations

from kvlab.mem_cache.hicache.page_host import PageHiController
from kvlab.mem_cache.hicache.tree_node import HiTreeNode
from kvlab.mem_cache.hicache.two_tier_moves import TwoTierMoves
from kvlab.mem_cache.shortfall import shortfall_tokens, tokens_to_evict


class PageTierMoves(TwoTierMoves):
    """The tier-move methods of :class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree` (a mixin)."""

    __slots__ = ()  # (a mixin: the tree that uses it lists its fields, see PageHiRadixTree.__slots__)

    cache_controller: PageHiController
    page_size: int
    allocator: object  # the device pool's free pages (the controller's ``mem_pool_device_allocator``)
    host_pool: object  # the host pool (the controller's ``mem_pool_host``, a PageHostPool)
    write_policy: str
    load_back_threshold: int
    load_back_evict_mode: str
    host_evicted_tokens: int
    ongoing_write_through: dict
    ongoing_load_back: dict

    # -- the copies and frees TwoTierMoves' write_backup, evict and evict_host run over page counts -----------------
    def _write_host(self, node: HiTreeNode) -> bool | None:
        """Issue ``node``'s backup: True, or None (nothing issued) when the host pool is short."""
        return True if self.cache_controller.write(len(node.key) * self.page_size, node.id) else None

    def _free_device(self, node: HiTreeNode, value: bool) -> None:
        self.allocator.free += len(node.key)  # (PageHiController.evict_device in pages: its device pool's free count)

    def _free_host(self, node: HiTreeNode) -> None:
        self.host_pool.free_pages += len(node.key)  # (PageHiController.evict_host in pages: its host pool)

    # -- device eviction (TwoTierMoves._evict_leaves) ----------------------------------------------------------------
    def evict(self, pages: int) -> int:
        """``HiRadixCache.evict`` in pages (TwoTierMoves' ``_evict_leaves``): unlocked device leaves in the policy's
        order until ``pages`` are freed. Returns the pages evicted (the device pool gets them back through the
        controller; a write-back's only once its copies landed)."""
        if not self.evictable_size_:  # (every device node locked: most calls on a full pool, answered here)
            return 0
        return self._evict_leaves(pages)

    # -- load-back (host -> device) ---------------------------------------------------------------------------------
    def load_back(self, node: HiTreeNode) -> tuple[int, tuple | None]:
        """``HiRadixCache.load_back`` in pages (TwoTierMoves' ``_load_back``, no ``mem_quota``, as the scheduler
        passes none): (pages loaded, 0 when skipped or short; the eviction it ran as ``(shortfall, requested,
        evicted)`` tokens, or None)."""
        device, ev, _ = self._load_back(node)
        return (0 if device is None else device // self.page_size), ev

    def _host_source(self, to_load: list[HiTreeNode], tokens: int) -> int:
        return tokens

    def _load_device(self, tokens: int, last_hit: HiTreeNode) -> int | None:
        """The load's tokens once issued, None (nothing issued) when the device pool is short."""
        return tokens if self.cache_controller.load(tokens, last_hit.id) else None

    def _evict_for_load(self, n: int, available: int) -> tuple[int, int, int]:
        """A load-back of ``n`` tokens found ``available`` free: evict what finding 2's rule asks for; returns
        ``(shortfall, requested, evicted)`` tokens."""
        requested = tokens_to_evict(n, available, self.load_back_evict_mode)
        ps = self.page_size
        return shortfall_tokens(n, available), requested, self.evict(-(-requested // ps)) * ps
