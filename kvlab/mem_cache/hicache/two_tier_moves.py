"""The moves between a two-tier tree's tiers, written once for both trees: the token tree
(:class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache`, over slot tensors) and the page tree
(:class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree`, over page counts): backups (device -> host),
demotion and write-back on device eviction, host eviction, load-back (host -> device), and the copies'
acknowledgements on the modelled clock.

Upstream: ``sglang/srt/mem_cache/hiradix_cache.py::HiRadixCache`` (0.5.16): ``write_backup``, ``writing_check``,
``loading_check``, ``check_hicache_events``, ``evict`` (``_evict_write_through`` / ``_evict_write_back``,
``_evict_backuped``, ``_evict_regular``, ``_drop_subtree_no_host``), ``evict_host`` and ``load_back``. The
load-back's eviction is finding 2's rule (``load_back_evict_mode``: each tree's ``_evict_for_load`` calls
:func:`~kvlab.mem_cache.shortfall.tokens_to_evict`).

A tree's side (:mod:`~kvlab.mem_cache.hicache.tier_moves`' ``TierMoves`` over slot tensors,
:mod:`~kvlab.mem_cache.hicache.page_tier_moves`' ``PageTierMoves`` over counts) gives only its copies and frees:

- ``_write_host(node)``: issue ``node``'s backup: its host value, or None when the host pool is short;
- ``_free_device(node, value)`` / ``_free_host(node)``: a node's device / host copy back to its pool;
- ``_host_source(to_load, tokens)`` / ``_load_device(source, last_hit)``: a load-back's source (the host slots; the
  tokens) and its issue: the device value, or None when the device pool is short;
- ``_evict_for_load(tokens, available)``: the load-back's eviction, answered as its caller reads it;

and :class:`~kvlab.mem_cache.hicache.two_tier_core.TwoTierCore`'s ``_device_value`` gives the loaded nodes their
values. Lengths are the tree's key units (tokens, or pages); ``key_tokens`` turns them into tokens where tokens are
meant (the load-back threshold and quota, ``host_evicted_tokens``). No torch.
"""

from __future__ import annotations

from kvlab.errors import require
from kvlab.mem_cache.hicache.tree_node import HiTreeNode


class TwoTierMoves:
    """The tier moves of both two-tier trees (a mixin, the base of each tree's ``TierMoves`` / ``PageTierMoves``):
    they use the tree's controller, leaf indexes, locks, counters and the hooks above."""

    __slots__ = ()  # (a mixin: the tree that uses it lists its fields, see PageHiRadixTree.__slots__)

    # -- backups and eviction: each tree's copies and frees (``_write_host``, ``_free_device``, ``_free_host``); the
    # rest, op for op 0.5.16's write_backup, evict (_evict_write_through / _evict_write_back) and evict_host ------------
    def write_backup(self, node: HiTreeNode, write_back: bool = False) -> int:
        """Copy ``node``'s device KV to host (evicting host leaves once if the pool is full). Under the write-through
        policies only a node whose parent is backed up is copied, and it stays locked until the copy is
        acknowledged. Returns its length (0: not backed up)."""
        if not write_back and node.parent is not self.root_node and node.parent.host_value is None:
            return 0
        n = len(node.key)
        host = self._write_host(node)
        if host is None:
            self.evict_host(n)
            host = self._write_host(node)
            while host is None and write_back and self.wait_storage_backups():  # (storage_moves)
                self.evict_host(n)
                host = self._write_host(node)
            if host is None:
                return 0
        self.structure_version += 1
        node.host_value = host
        op = self.cache_controller.write_queue[-1]
        op_id = id(op)
        self.ongoing_write_through[op_id] = (op, None if write_back else node)
        if self.storage_controller is not None:  # (storage_moves: on its ack, on to storage; the key length now)
            self._storage_backups[op_id] = (node, n)
        if not write_back:
            self.inc_lock_ref(node)
        return n

    def _evict_leaves(self, num: int, tally: dict | None = None) -> int:
        """Evict unlocked device leaves in the policy's order until ``num`` (tree units) are freed or none is left:
        demoted to host-only when backed up, else destroyed (write-through policies) or written to host first
        (``write_back``: the eviction waits for its copies; if the host pool stays full, the leaf and its host-only
        subtree are dropped). A parent whose children all left the device joins the heap as it becomes a leaf, as
        0.5.16 pushes it. ``tally``: adds the demoted, written and destroyed lengths. Returns the length evicted."""
        if not self.evictable_size_:  # (every device node locked, so no evictable leaf: most calls on a full pool)
            return 0
        tally = {"demoted": 0, "written": 0, "destroyed": 0} if tally is None else tally
        staged: list = []  # write-back: (node, its device value) whose copies are in flight
        kept: list = []  # popped but still leaves (a host-protected subtree): candidates again next call
        index = self.leaf_index
        index.frozen = True  # no rebuild while popped leaves wait in ``kept``
        try:
            return self._evict_loop(num, tally, staged, kept)
        finally:
            index.frozen = False
            for x in kept:
                index.touch(x)

    def _evict_loop(self, num: int, tally: dict, staged: list, kept: list) -> int:
        evicted = 0
        pop, leaves = self.leaf_index.pop, self.leaf_index.leaves
        while evicted < num:
            x = pop()
            if x is None:
                break
            if x.host_value is not None:
                evicted += self._evict_backuped(x)
                tally["demoted"] += len(x.key)
            elif self.write_policy != "write_back":
                evicted += self._evict_regular(x)
                tally["destroyed"] += len(x.key)
            elif self.write_backup(x, write_back=True) > 0 or self.retry_write_back(x, staged):
                x.protect_host()
                staged.append((x, x.value))
                evicted += self._detach_backuped(x)
                tally["written"] += len(x.key)
            else:
                self._flush_staged(staged)
                dropped = self._drop_subtree_no_host(x)
                evicted += dropped
                tally["destroyed"] += dropped
            if x in leaves:  # not dropped (a host-protected node below it)
                kept.append(x)
        if staged:  # (write-back only)
            self._flush_staged(staged)
        return evicted

    def _flush_staged(self, staged: list) -> None:
        """Write-back: wait for the staged copies, then free their device slots or pages."""
        if not staged:
            return
        self.writing_check(write_back=True)
        for node, value in staged:
            self._free_device(node, value)
            node.release_host()
        staged.clear()

    def _evict_backuped(self, node: HiTreeNode) -> int:
        value = node.value
        n = self._detach_backuped(node)
        self._free_device(node, value)
        return n

    def _evict_regular(self, node: HiTreeNode) -> int:
        require(not node.children, "a two-tier tree: an unbacked device leaf has no children (write-through)",
                tree=type(self).__name__, node=node)
        self._free_device(node, node.value)
        self._delete_leaf(node)
        return len(node.key)

    def _delete_leaf(self, node: HiTreeNode) -> None:
        self._drop_leaf(node)  # (tree_core: the structure version, the counters, the device-leaf index)
        del node.parent.children[self._key_of(node.key)]
        node.value = None
        self._update_leaf_status(node.parent)

    def _drop_subtree_no_host(self, top: HiTreeNode) -> int:
        """Write-back with the host pool full: drop ``top`` (a device leaf) and its host-only descendants from both
        tiers, unless any of them is host-protected. Returns the device length freed."""
        nodes, stack = [], [top]
        while stack:
            x = stack.pop()
            nodes.append(x)
            stack.extend(x.children.values())
        if any(x.host_ref_counter > 0 for x in nodes):
            return 0
        self.structure_version += 1
        freed = 0
        for x in nodes:
            if x.host_value is not None:
                self._free_host(x)
                x.host_value = None
            if x.value is not None:
                self._free_device(x, x.value)
                freed += len(x.key)
                self.evictable_size_ -= len(x.key)
                x.value = None
            self.leaf_index.discard(x)
            self.host_leaf_index.discard(x)
        del top.parent.children[self._key_of(top.key)]
        self._update_leaf_status(top.parent)
        self._update_host_leaf_status(top.parent)
        return freed

    def evict_host(self, num: int) -> int:
        """Free the host copies of host-only leaves (never host-protected ones), in the policy's order, until
        ``num`` (tree units) are freed or none is left; the node is deleted, and a parent left childless and
        host-only becomes a candidate. Returns the length freed (``HiRadixCache.evict_host``); the running total
        ``host_evicted_tokens`` counts tokens (``key_tokens`` per unit)."""
        freed, kept = 0, []  # kept: host-protected leaves, skipped, candidates again next call
        index = self.host_leaf_index
        pop, leaves = index.pop, index.leaves
        index.frozen = True
        try:
            while freed < num:
                x = pop()
                if x is None:
                    break
                if x.host_ref_counter > 0:
                    kept.append(x)
                    continue
                self._free_host(x)
                freed += len(x.key)
                self.structure_version += 1
                parent = x.parent
                del parent.children[self._key_of(x.key)]
                del leaves[x]  # (a popped leaf stays in the index until deleted)
                x.host_value = None
                self._update_host_leaf_status(parent)  # a parent left childless and host-only joins the heap
        finally:
            index.frozen = False
            for x in kept:
                index.touch(x)
        self.host_evicted_tokens += freed * self.key_tokens
        return freed

    # -- load-back (host -> device): each tree's copy source and device values (``_host_source``, ``_load_device``,
    # ``_device_value``); the rest, op for op 0.5.16's load_back (with kvlab's load_back_evict_mode) -----------------
    def _load_back(self, node: HiTreeNode, mem_quota: int | None = None) -> tuple[object, object, str | None]:
        """Bring the host-only path ending at ``node`` back to the device, all or nothing: ``(its device value, the
        eviction run for room or None, None)``, or ``(None, that eviction or None, why)`` when nothing was loaded
        (``"below_threshold"``: fewer than ``load_back_threshold`` tokens; ``"over_quota"``: more than
        ``mem_quota`` device tokens, the evictable ones the load would pin counted against it; ``"device_full"``).
        The device pool's room comes first from eviction as finding 2's rule says (``load_back_evict_mode``). On
        success the loaded nodes hold their values at once and ``node`` stays locked until the copy is acknowledged
        (``loading_check``)."""
        last_hit, to_load = node, []
        while node.value is None:
            require(node.host_value is not None, "a two-tier tree: a node off the device has a host copy", node=node)
            to_load.append(node)
            node = node.parent
        to_load.reverse()
        ancestor = node
        delta = self.inc_lock_ref(ancestor)
        n = sum(len(x.key) for x in to_load) * self.key_tokens  # tokens
        if n < self.load_back_threshold or (mem_quota is not None and n > mem_quota + delta * self.key_tokens):
            self.dec_lock_ref(ancestor)
            return None, None, "below_threshold" if n < self.load_back_threshold else "over_quota"
        for x in to_load:
            x.protect_host()
        source, ev = self._host_source(to_load, n), None
        available = self.cache_controller.mem_pool_device_allocator.available_size()
        if self.load_back_evict_mode == "shortfall":  # 0.5.23: make room first, then allocate
            if n > available:
                ev = self._evict_for_load(n, available)
            device = self._load_device(source, last_hit)
        else:  # 0.5.16: try to allocate, and on failure evict (the bug: all of n) and try again
            device = self._load_device(source, last_hit)
            if device is None:
                ev = self._evict_for_load(n, available)
                device = self._load_device(source, last_hit)
        self.dec_lock_ref(ancestor)
        for x in to_load:
            x.release_host()
        if device is None:
            return None, ev, "device_full"
        self._loaded(to_load, device, last_hit)
        return device, ev, None

    def _loaded(self, to_load: list, device, last_hit: HiTreeNode) -> None:
        """A load-back was issued: the nodes ``to_load`` take their parts of ``device`` (no longer host leaves),
        and ``last_hit`` is locked until the copy's ack."""
        op = self.cache_controller.load_queue[-1]
        self.structure_version += 1
        off, discard = 0, self.host_leaf_index.discard
        for x in to_load:
            end = off + len(x.key)
            x.value = self._device_value(device, off * self.key_tokens, end * self.key_tokens)
            discard(x)  # on the device again: no host leaf (and locked below)
            off = end
        self.evictable_size_ += off
        self.inc_lock_ref(last_hit)
        self.ongoing_load_back[id(op)] = (op, last_hit)

    # -- the copy clock ---------------------------------------------------------------------------------------------
    def poll(self, now_s: float) -> None:
        """Move the copy clock to ``now_s`` and complete every copy finished by then (and the storage tier's)."""
        ctl = self.cache_controller
        ctl.poll(now_s)
        if ctl.ack_write_queue or ctl.ack_load_queue:  # check_hicache_events (which does nothing without acks)
            self.check_hicache_events()
        if self._storage_due_s <= ctl.now_s:  # (storage_moves; most steps: no storage event due, or no storage)
            self._poll_storage()

    def advance(self, seconds: float) -> None:
        self.poll(self.now_s + seconds)

    def drain(self) -> float:
        """Advance until every issued copy is complete; returns the seconds that took."""
        start = self.now_s
        self.poll(self.cache_controller.drain_time())
        if self.storage_controller is not None:  # the host copies' acks issue backups to storage: let them land
            self.poll(self.storage_controller.drain_time())
        return self.now_s - start

    def check_hicache_events(self) -> None:
        """The scheduler's per-step poll (storage parts omitted): ``writing_check`` then ``loading_check``."""
        self.writing_check()
        self.loading_check()

    # -- copies' acknowledgements -----------------------------------------------------------------------------------
    def writing_check(self, write_back: bool = False) -> int:
        """Consume acknowledged backups (unlocking their nodes). ``write_back=True`` first waits for every issued
        copy (the clock jumps forward: ``cache_controller.totals.stall_s``). Returns the acks consumed."""
        ctl = self.cache_controller
        if write_back:
            ctl.wait_writes()
        acks, ctl.ack_write_queue = ctl.ack_write_queue, []
        backups = self._storage_backups if self.storage_controller is not None else None  # (storage_moves)
        for op in acks:
            op_id = id(op)
            _, lock_node = self.ongoing_write_through.pop(op_id, (op, None))
            if backups is not None:  # _finish_write_through_ack -> write_backup_storage, noted by write_backup
                entry = backups.pop(op_id, None)
                if entry is not None:
                    self.write_backup_storage(*entry)
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
