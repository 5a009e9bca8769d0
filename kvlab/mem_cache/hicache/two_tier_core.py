"""What both two-tier trees do that reads only residency, locks, the logical clock and the copy clock: the token tree
(:class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache`, over slot tensors) and the page tree
(:class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree`, the page engine's, over page counts), written once.

Upstream: 0.5.16's ``hiradix_cache.py::HiRadixCache`` ``writing_check`` / ``loading_check`` (the acks of the copies,
which unlock their nodes); kvlab's own: the ends of a match walk on each tier (``match_ends``) and the replay of a
repeated walk (``restamp_path``), see ``hiradix_cache``'s module docstring. A mixin; no torch.
"""

from __future__ import annotations

from kvlab.mem_cache.hicache.tree_node import HiTreeNode


class TwoTierCore:
    """A two-tier tree's match ends, walk replay and copy acks (a mixin over its ``root_node``, ``clock``, leaf
    indexes, locks, ``cache_controller`` and ``ongoing_write_through`` / ``ongoing_load_back``)."""

    @property
    def now_s(self) -> float:
        """The copy clock (the host controller's, which the storage tier's channels share)."""
        return self.cache_controller.now_s

    def match_ends(self, end: HiTreeNode) -> tuple[HiTreeNode, HiTreeNode, int]:
        """Where a match walk that ended at ``end`` (the deepest node it matched, on either tier) stops on each
        tier: ``(last_device_node, last_host_node, host_hit_length)`` as :class:`HiMatchResult` names them. The
        walk's end is ``last_host_node`` when ``host_hit_length`` is not 0, else ``last_device_node``."""
        node, host_hit = end, 0
        while node.value is None:
            host_hit += len(node.key)
            node = node.parent
        last_host = end
        while last_host.host_value is None:
            last_host = last_host.parent
        return node, last_host, host_hit

    def restamp_path(self, node: HiTreeNode, times: int = 1) -> None:
        """What ``times`` repeats of the match walk that ended at ``node`` do while :attr:`structure_version` is
        unchanged since it (the walk would visit the same nodes and split none): each reads the clock for the root
        and then for each node of the path, top down (``_match_walk``), so the clock moves ``times`` times the path
        length plus one and the path keeps the last walk's times; a node of the path that is a leaf of a tier gets
        a fresh heap entry (once: the earlier walks' entries would be stale)."""
        path, root = [], self.root_node
        while node is not root:
            path.append(node)
            node = node.parent
        clock = self.clock
        now = clock.now + (times - 1) * (len(path) + 1) + 1
        root.last_access_time = now
        for x in reversed(path):
            now += 1
            x.last_access_time = now
            self._touch(x)
        clock.now = now

    def _host_backup_acked(self, op_id: int) -> None:
        """A host copy landed: the storage tier's hook (storage_moves: on to storage); nothing without one."""

    def _detach_backuped(self, node: HiTreeNode) -> int:
        """Make ``node`` host-only (the caller frees its device slots or pages): both trees' demotion."""
        n = len(node.key)
        self.evictable_size_ -= n
        node.value = None
        self.structure_version += 1
        self._update_leaf_status(node)
        self._update_host_leaf_status(node)
        self._update_leaf_status(node.parent)
        return n

    def _attach_device(self, node: HiTreeNode, value) -> int:
        """Put host-only ``node`` back on the device holding ``value`` (an insert over it: recomputed KV), the
        inverse of :meth:`_detach_backuped`: both trees' re-insert. Returns its key's length (tree units)."""
        n = len(node.key)
        node.value = value
        self.structure_version += 1
        self.evictable_size_ += n
        self._update_leaf_status(node)
        self._update_host_leaf_status(node)
        self._update_leaf_status(node.parent)
        return n

    def _new_node(self, key, value, parent: HiTreeNode | None, priority: int = 0) -> HiTreeNode:
        return HiTreeNode(key, value, parent, self.clock, self._register_node(), priority)

    def _add_leaf(self, parent: HiTreeNode, key, value, priority: int, count_hits: bool) -> HiTreeNode:
        """Insert's tail past the match: a new device leaf under ``parent`` holding ``key`` and ``value``, a hit
        counted on it when ``count_hits`` (write-through: it may be backed up at once)."""
        leaf = self._new_node(key, value, parent, priority)
        parent.children[self._key_of(leaf.key)] = leaf
        self.evictable_size_ += len(key)
        self._update_leaf_status(parent)
        self._update_leaf_status(leaf)
        if count_hits:
            self._inc_hit_count(leaf)
        return leaf

    def _inc_hit_count(self, node: HiTreeNode) -> None:
        """A hit on ``node`` (insert): under the write-through policies it is backed up once its hits reach the
        threshold (1: ``write_through``, 2: ``write_through_selective``)."""
        if self.write_policy == "write_back":
            return
        node.hit_count += 1
        self._touch(node)
        if node.host_value is None and node.hit_count >= self.write_through_threshold:
            self.write_backup(node)

    def writing_check(self, write_back: bool = False) -> int:
        """Consume acknowledged backups (unlocking their nodes). ``write_back=True`` first waits for every issued
        copy (the clock jumps forward: ``cache_controller.totals.stall_s``). Returns the acks consumed."""
        ctl = self.cache_controller
        if write_back:
            ctl.wait_writes()
        acks, ctl.ack_write_queue = ctl.ack_write_queue, []
        for op in acks:
            _, lock_node = self.ongoing_write_through.pop(id(op), (op, None))
            self._host_backup_acked(id(op))  # _finish_write_through_ack -> write_backup_storage
            if lock_node is not None:
                self.dec_lock_ref(lock_node)
        return len(acks)

    def loading_check(self) -> int:
        """Consume acknowledged load-backs (unlocking the node each one locked). Returns the acks consumed."""
        ctl = self.cache_controller
        acks, ctl.ack_load_queue = ctl.ack_load_queue, []
        for op in acks:
            _, node = self.ongoing_load_back.pop(id(op))
            self.dec_lock_ref(node)
        return len(acks)
