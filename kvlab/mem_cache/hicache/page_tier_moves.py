"""The page-granular two-tier tree's moves between tiers: :mod:`~kvlab.mem_cache.hicache.tier_moves` op for op over
page counts (a mixin of :class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree`).

Upstream, as ``tier_moves``: 0.5.16's ``hiradix_cache.py::HiRadixCache`` ``write_backup``, ``writing_check``,
``loading_check``, ``check_hicache_events``, ``evict`` (``_evict_write_through`` / ``_evict_write_back``,
``_detach_backuped``, ``_evict_backuped``, ``_evict_regular``, ``_drop_subtree_no_host``), ``evict_host`` and
``load_back`` (with kvlab's ``load_back_evict_mode``, finding 2's rule). Where the token tree moves slot tensors
this one moves counts: the controller (:class:`~kvlab.mem_cache.hicache.page_host.PageHiController`) takes and
gives pages of both pools and times each copy on the shared clock. Counts here are pages; the controller and the
host-eviction total count tokens. No torch.
"""

from __future__ import annotations

from kvlab.errors import require
from kvlab.mem_cache.hicache.page_host import PageHiController
from kvlab.mem_cache.hicache.tree_node import HiTreeNode
from kvlab.mem_cache.shortfall import shortfall_tokens, tokens_to_evict


class PageTierMoves:
    """The tier-move methods of :class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree` (a mixin)."""

    cache_controller: PageHiController
    page_size: int
    write_policy: str
    load_back_threshold: int
    load_back_evict_mode: str
    host_evicted_tokens: int
    ongoing_write_through: dict
    ongoing_load_back: dict

    # -- backups (device -> host) and their acknowledgements -------------------------------------------------------
    def write_backup(self, node: HiTreeNode, write_back: bool = False) -> int:
        """``HiRadixCache.write_backup``: copy ``node`` to host (evicting host leaves once if the pool is full); under
        the write-through policies only below a backed-up parent, and locked until the copy is acknowledged. Returns
        the pages issued (0: not backed up)."""
        if not write_back and node.parent is not self.root_node and node.parent.host_value is None:
            return 0
        ctl, n = self.cache_controller, len(node.key)
        if not ctl.write(n * self.page_size, node.id):
            self.evict_host(n)
            written = ctl.write(n * self.page_size, node.id)
            while not written and write_back and self.wait_storage_backups():  # (storage_moves)
                self.evict_host(n)
                written = ctl.write(n * self.page_size, node.id)
            if not written:
                return 0
        self.structure_version += 1
        node.host_value = True
        op = ctl.write_queue[-1]
        self.ongoing_write_through[id(op)] = (op, None if write_back else node)
        self._note_host_backup(id(op), node)  # (storage_moves: on its ack, on to storage)
        if not write_back:
            self.inc_lock_ref(node)
        return n

    def poll(self, now_s: float) -> None:
        """Move the copy clock to ``now_s`` and complete the copies finished by then (``check_hicache_events``)."""
        ctl = self.cache_controller
        ctl.poll(now_s)
        if ctl.ack_write_queue or ctl.ack_load_queue:
            self.writing_check()
            self.loading_check()
        if self.storage_controller is not None and self._storage_due_s <= ctl.now_s:  # (drain_storage_control_queues)
            self._poll_storage()

    def drain(self) -> None:
        """Every issued copy lands (and the backups to storage their acks issued)."""
        self.poll(self.cache_controller.drain_time())
        if self.storage_controller is not None:
            self.poll(self.storage_controller.drain_time())

    # -- device eviction ------------------------------------------------------------------------------------------
    def evict(self, pages: int) -> int:
        """``HiRadixCache.evict`` in pages: unlocked device leaves in the policy's order until ``pages`` are freed;
        demoted when backed up, else destroyed (write-through) or written to host first (write-back, dropped with
        its host-only subtree when the host stays full). Returns the pages evicted (the device pool gets them back
        through the controller; a write-back's only once its copies landed)."""
        staged: list = []
        kept: list = []  # popped but still leaves (a host-protected subtree): candidates again next call
        index = self.leaf_index
        index.frozen = True
        try:
            evicted = self._evict_loop(pages, staged, kept)
        finally:
            index.frozen = False
            for x in kept:
                index.touch(x)
        return evicted

    def _evict_loop(self, pages: int, staged: list, kept: list) -> int:
        evicted = 0
        pop, leaves = self.leaf_index.pop, self.leaf_index.leaves
        while evicted < pages:
            x = pop()
            if x is None:
                break
            if x.host_value is not None:
                evicted += self._detach_backuped(x)
                self.cache_controller.evict_device(len(x.key) * self.page_size)
            elif self.write_policy != "write_back":
                require(not x.children, "PageHiRadixTree: an unbacked device leaf has no children", node=x)
                evicted += len(x.key)
                self.cache_controller.evict_device(len(x.key) * self.page_size)
                self._delete_leaf(x)
            elif self.write_backup(x, write_back=True) > 0 or self.retry_write_back(x, staged):
                x.protect_host()
                staged.append(x)
                evicted += self._detach_backuped(x)
            else:
                self._flush_staged(staged)
                evicted += self._drop_subtree_no_host(x)
            if x in leaves:
                kept.append(x)
        self._flush_staged(staged)
        return evicted

    def _flush_staged(self, staged: list) -> None:
        """Write-back: wait for the staged copies, then free their device pages."""
        if not staged:
            return
        self.writing_check(write_back=True)
        for node in staged:
            self.cache_controller.evict_device(len(node.key) * self.page_size)
            node.release_host()
        staged.clear()

    def _delete_leaf(self, node: HiTreeNode) -> None:
        self._drop_leaf(node)
        del node.parent.children[node.key[0]]
        node.value = None
        self._update_leaf_status(node.parent)

    def _drop_subtree_no_host(self, top: HiTreeNode) -> int:
        """Write-back with the host pool full: drop ``top`` and its host-only descendants from both tiers, unless one
        of them is host-protected. Returns the device pages freed."""
        nodes, stack = [], [top]
        while stack:
            x = stack.pop()
            nodes.append(x)
            stack.extend(x.children.values())
        if any(x.host_ref_counter > 0 for x in nodes):
            return 0
        self.structure_version += 1
        ctl, ps, freed = self.cache_controller, self.page_size, 0
        for x in nodes:
            n = len(x.key)
            if x.host_value is not None:
                ctl.evict_host(n * ps)
                x.host_value = None
            if x.value is not None:
                ctl.evict_device(n * ps)
                freed += n
                self.evictable_size_ -= n
                x.value = None
            self.leaf_index.discard(x)
            self.host_leaf_index.discard(x)
        del top.parent.children[top.key[0]]
        self._update_leaf_status(top.parent)
        self._update_host_leaf_status(top.parent)
        return freed

    # -- host eviction ----------------------------------------------------------------------------------------------
    def evict_host(self, pages: int) -> int:
        """``HiRadixCache.evict_host`` in pages: host-only leaves (never host-protected ones) in the policy's order
        until ``pages`` are freed; each node is deleted. Returns the pages freed."""
        freed, kept = 0, []
        index, ps = self.host_leaf_index, self.page_size
        index.frozen = True
        try:
            while freed < pages:
                x = index.pop()
                if x is None:
                    break
                if x.host_ref_counter > 0:
                    kept.append(x)
                    continue
                freed += len(x.key)
                self.cache_controller.evict_host(len(x.key) * ps)
                self.structure_version += 1
                parent = x.parent
                del parent.children[x.key[0]]
                index.discard(x)
                x.host_value = None
                self._update_host_leaf_status(parent)
        finally:
            index.frozen = False
            for x in kept:
                index.touch(x)
        self.host_evicted_tokens += freed * ps
        return freed

    # -- load-back (host -> device) ---------------------------------------------------------------------------------
    def load_back(self, node: HiTreeNode) -> tuple[int, tuple | None]:
        """``HiRadixCache.load_back`` in pages (no ``mem_quota``, as the scheduler passes none): the host-only path
        ending at ``node`` back on the device, all or nothing. Returns (pages loaded, 0 when skipped or short;
        the eviction it ran as ``(shortfall, requested, evicted)`` tokens, or None)."""
        last_hit, to_load = node, []
        while node.value is None:
            require(node.host_value is not None, "PageHiRadixTree: a node off the device has a host copy", node=node)
            to_load.append(node)
            node = node.parent
        to_load.reverse()
        ancestor = node
        self.inc_lock_ref(ancestor)
        ps = self.page_size
        n = sum(len(x.key) for x in to_load)
        if n * ps < self.load_back_threshold:
            self.dec_lock_ref(ancestor)
            return 0, None
        for x in to_load:
            x.protect_host()
        ctl, ev = self.cache_controller, None
        available = ctl.mem_pool_device_allocator.free
        if self.load_back_evict_mode == "shortfall":  # 0.5.23: make room first, then allocate
            if n > available:
                ev = self._evict_for_load(n * ps, available * ps)
            ok = ctl.load(n * ps, last_hit.id)
        else:  # 0.5.16: try to allocate, and on failure evict all of n and try again
            ok = ctl.load(n * ps, last_hit.id)
            if not ok:
                ev = self._evict_for_load(n * ps, available * ps)
                ok = ctl.load(n * ps, last_hit.id)
        self.dec_lock_ref(ancestor)
        for x in to_load:
            x.release_host()
        if not ok:
            return 0, ev
        op = ctl.load_queue[-1]
        self.structure_version += 1
        discard = self.host_leaf_index.discard
        for x in to_load:
            x.value = True
            discard(x)
        self.evictable_size_ += n
        self.inc_lock_ref(last_hit)
        self.ongoing_load_back[id(op)] = (op, last_hit)
        return n, ev

    def _evict_for_load(self, n: int, available: int) -> tuple[int, int, int]:
        """A load-back of ``n`` tokens found ``available`` free: evict what finding 2's rule asks for; returns
        ``(shortfall, requested, evicted)`` tokens."""
        requested = tokens_to_evict(n, available, self.load_back_evict_mode)
        ps = self.page_size
        return shortfall_tokens(n, available), requested, self.evict(-(-requested // ps)) * ps
