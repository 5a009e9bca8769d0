"""What both two-tier trees do, written once: the token tree
(:class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache`, over slot tensors) and the page tree
(:class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree`, the page engine's, over page counts).

Upstream: 0.5.16's ``hiradix_cache.py::HiRadixCache``: the walks (``_match_prefix_helper``, ``_insert_helper`` with
its re-insert over a host-only node, ``inc_hit_count``) and ``_detach_backuped``; kvlab's own: the locked-path
shortcut of insert and the re-match after it, the ends of a match walk on each tier (``match_ends``), the replay of a
repeated walk (``restamp_path``, see ``hiradix_cache``'s module docstring) and the structural check both trees'
``check_invariants`` make. The moves between the tiers are :mod:`~kvlab.mem_cache.hicache.two_tier_moves`'.

A tree gives only what reads its values (the token tree's: slot tensors; the page tree's: ``True`` and page ids):
``_key_of(key, off)``, the child key at ``key[off]`` (a token, or a page's bytes; a page id); ``_split_len(ckey,
key, off, n)``, where a walk splits a node that diverges from the key (whole pages); ``_device_value(src, start,
end)``, what a node of ``key[start:end]`` holds on the device, from the caller's or a load's ``src`` (its own copy
of the slots; ``True``). Lengths are the tree's key units (``len(node.key)``: tokens, or pages), as its counters
are; ``key_tokens`` (storage_moves: tokens per key unit) turns them into tokens. A mixin; no torch.
"""

from __future__ import annotations

from kvlab.errors import InvariantError, require
from kvlab.mem_cache.hicache.tree_node import HiTreeNode


class TwoTierCore:
    """A two-tier tree's walks, match ends, walk replay and structural check (a mixin over its ``root_node``,
    ``clock``, leaf indexes, locks, counters and the hooks above)."""

    __slots__ = ()  # (a mixin: the tree that uses it lists its fields, see PageHiRadixTree.__slots__)

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
        and then for each node of the path, top down (:meth:`match_walk`), so the clock moves ``times`` times the path
        length plus one and the path keeps the last walk's times; a node of the path that is a leaf of a tier gets
        a fresh heap entry (once: the earlier walks' entries would be stale). Walked bottom up with the times the
        walk's reads gave (the depth first): most paths are a node or two, so no path list is made. Only ``node`` may
        be a leaf of either tier: an ancestor whose path child is on the device is a leaf of neither (it has a child
        on the device, and is on the device), and one whose path child is host-only (a host copy: every node is on a
        tier) is no host leaf."""
        root, depth, x = self.root_node, 0, node
        while x is not root:
            depth += 1
            x = x.parent
        clock = self.clock
        now = clock.now = clock.now + times * (depth + 1)  # the last walk's read of ``node``
        root.last_access_time = now - depth
        if not depth:  # (the walk matched nothing)
            return
        dev = self.leaf_index
        dev_leaves = dev.leaves
        node.last_access_time = now
        if node in dev_leaves:  # (_touch, inlined: a leaf of one tier at most)
            dev.push(node)
        elif node in self.host_leaf_index.leaves:
            self.host_leaf_index.push(node)
        below, node = node.value, node.parent
        while node is not root:  # (the heap pushes' order reads nothing: the sort key ends in the node's id)
            now -= 1
            node.last_access_time = now
            if below is None and node in dev_leaves:
                dev.push(node)
            below, node = node.value, node.parent

    def _detach_backuped(self, node: HiTreeNode) -> int:
        """Make ``node`` host-only (the caller frees its device slots or pages): both trees' demotion."""
        n = len(node.key)
        self.evictable_size_ -= n
        node.value = None
        self.structure_version += 1
        self.leaf_index.leaves.pop(node, None)  # (_update_leaf_status: off the device, no device leaf)
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
        self.host_leaf_index.leaves.pop(node, None)  # (_update_host_leaf_status: on the device, no host leaf)
        self._update_leaf_status(node.parent)
        return n

    def _new_node(self, key, value, parent: HiTreeNode | None, priority: int = 0) -> HiTreeNode:
        node_id = self._next_id  # (TreeCore._register_node, inlined: a node is made per new leaf and per split)
        self._next_id = node_id + 1
        self.structure_version += 1
        return HiTreeNode(key, value, parent, self.clock, node_id, priority)

    # -- the walks: each tree's key lookup (``_key_of``), split length (``_split_len``) and device values
    # (``_device_value``); the rest, op for op 0.5.16's ``_match_prefix_helper`` / ``_insert_helper`` ----------------
    def match_walk(self, key, n: int, values: list | None = None) -> tuple[HiTreeNode, int]:
        """The match walk of ``key[:n]`` (n > 0, whole pages): (the deepest node matched on either tier, the length
        matched). A clock read for the root and each node, the node's heap entries refreshed; the node the key ends
        inside is split. ``values``: a list that collects the device values of the path, top down."""
        node, clock = self.root_node, self.clock
        node.last_access_time = clock.now = clock.now + 1  # (LogicalClock.tick, inlined)
        off, key_of = 0, self._key_of
        while off < n:
            child = node.children.get(key_of(key, off))
            if child is None:
                break
            node, m, whole = self._visit(child, key, off, n)
            if values is not None and node.value is not None:
                values.append(node.value)
            off += m
            if not whole:
                break
        return node, off

    def _visit(self, child: HiTreeNode, key, off: int, n: int) -> tuple[HiTreeNode, int, bool]:
        """A walk's step onto ``child`` (match and insert alike): a clock read, its heap entries refreshed (its sort
        key changed), and its key compared with ``key[off:n]``: ``(child, its length, True)`` when the key holds it
        whole, else ``(the upper half of its split at the common prefix, that length, False)``. A key one unit long
        is held whole unread: the child was looked up by that unit (``_key_of``, a token or a page id)."""
        clock = self.clock
        child.last_access_time = clock.now = clock.now + 1  # (LogicalClock.tick, inlined)
        dev = self.leaf_index
        if child in dev.leaves:  # (_touch, inlined: a leaf of one tier at most)
            dev.push(child)
        elif child in self.host_leaf_index.leaves:
            self.host_leaf_index.push(child)
        ckey = child.key
        m = len(ckey)
        if m != 1 and (off + m > n or ckey != key[off : off + m]):
            m = self._split_len(ckey, key, off, n)
            return self._split_node(child, m), m, False
        return child, m, True

    def _insert_walk(self, key, n: int, src, priority: int, chunked: bool, held: HiTreeNode | None = None,
                     held_len: int = 0) -> tuple[int, HiTreeNode]:
        """Insert ``key[:n]`` (n whole pages) with the caller's device values ``src`` (``_device_value`` slices
        them): (the length already on the device, the node ending at ``n``; the root for n = 0). A host-only node
        on the way adopts the caller's values (not counted as cached); under the write-through policies a node
        reaching its hit threshold is backed up. ``held``: the node the request holds locked, whose path spells
        ``key[:held_len]`` (walked without looking its children up or comparing its keys again)."""
        if n == 0:
            return 0, self.root_node
        count_hits = not chunked and self.write_policy != "write_back"
        path = self._held_path(held, held_len) if 0 < held_len <= n else None
        if path:  # (its nodes spell key[:held_len]: _held_path checked their length)
            self._walk_held(path, priority, count_hits)
            node, off = path[-1], held_len
        else:
            node, off = self.root_node, 0
        prefix, key_of, visit = off, self._key_of, self._visit
        while off < n:
            child = node.children.get(key_of(key, off))
            if child is None:
                break
            if priority > child.priority:
                child.priority = priority
            node, m, whole = visit(child, key, off, n)
            if not whole and priority > node.priority:  # (the upper half of a split: a new node, never a leaf)
                node.priority = priority
            if node.value is None:  # host-only: adopt the caller's (recomputed) values
                self._attach_device(node, self._device_value(src, off, off + m))
            else:
                if count_hits:
                    self._inc_hit_count(node)
                prefix += m
            off += m
        if off < n:
            node = self._add_leaf(node, key[off:n], self._device_value(src, off, n), priority, count_hits)
        return prefix, node

    def rematch(self, last: HiTreeNode, values: list | None = None) -> list | None:
        """0.5.16's re-match of the key an insert just made end at ``last`` (not the root), without comparing it
        again: the same walk (no split is possible, every node is on the device), the same clock reads (the root,
        then each node from the top) and device heap entries, which are those of one repeat of a match walk that
        ended at ``last`` (:meth:`restamp_path`); ``values`` collects the path's device values, top down."""
        self.restamp_path(last)
        if values is not None:
            up, root = [], self.root_node
            while last is not root:
                up.append(last.value)
                last = last.parent
            values.extend(reversed(up))
        return values

    def _walk_held(self, path: list, priority: int, count_hits: bool) -> None:
        """What insert's walk does to each node of a request's locked path, top down (a clock read, the priority, a
        hit), without looking the children up. No heap entry to refresh: a locked device node is a leaf of neither
        tier. The hit is :meth:`_inc_hit_count`'s with no heap entry (inlined: the walk's hottest loop), the clock
        read kept in a local but for the backups it starts."""
        clock, threshold = self.clock, self.write_through_threshold
        now = clock.now
        for child in path:
            now += 1
            child.last_access_time = now
            if priority > child.priority:
                child.priority = priority
            if count_hits:
                child.hit_count += 1
                if child.host_value is None and child.hit_count >= threshold:
                    clock.now = now
                    self.write_backup(child)
                    now = clock.now
        clock.now = now

    def _add_leaf(self, parent: HiTreeNode, key, value, priority: int, count_hits: bool) -> HiTreeNode:
        """Insert's tail past the match: a new device leaf under ``parent`` holding ``key`` and ``value``, a hit
        counted on it when ``count_hits`` (write-through: it may be backed up at once)."""
        leaf = self._new_node(key, value, parent, priority)
        parent.children[self._key_of(leaf.key)] = leaf
        self.evictable_size_ += len(key)
        self.leaf_index.leaves.pop(parent, None)  # (_update_leaf_status: a child of it is on the device now)
        if count_hits:  # (before the leaf is filed: it gets one heap entry, with its hit, unless a backup locks it;
            leaf.hit_count = 1  # _inc_hit_count, inlined: a new node has no hit, no heap entry and no host copy)
            if self.write_through_threshold <= 1:
                self.write_backup(leaf)
        if not leaf.lock_ref:  # (_update_leaf_status: on the device and childless, a leaf unless locked)
            self.leaf_index.push(leaf)
        return leaf

    def _inc_hit_count(self, node: HiTreeNode, touch: bool = True) -> None:
        """A hit on ``node`` (insert, under the write-through policies: its caller's ``count_hits``): its heap entry
        refreshed (its sort key changed; ``touch`` False: the caller knows it has none), then it is backed up once its
        hits reach the threshold (1: ``write_through``, 2: ``write_through_selective``)."""
        node.hit_count += 1
        if touch:
            self._touch(node)
        if node.host_value is None and node.hit_count >= self.write_through_threshold:
            self.write_backup(node)

    # -- the check both trees' check_invariants make -------------------------------------------------------------------
    def _check_tiers(self, name: str) -> tuple[list, list]:
        """Children filed by their first key unit and pointing back; device residency closed under prefixes;
        lock_ref >= the children's; keys of whole pages; every node on a tier; host-only nodes unlocked;
        write-through backups a prefix from the root; the size counters. Returns (the nodes but the root, those on
        the device)."""
        root, ps, unit = self.root_node, self.page_size, self.key_tokens
        self._check_root(name)
        nodes, on_device = [], []
        for node in self.nodes():
            child_locks = 0
            for ck, child in node.children.items():
                require(child.parent is node and ck == self._key_of(child.key),
                        f"{name}: each child is filed under its first token/page and points back at its parent",
                        child=child, filed_under=ck)
                child_locks += child.lock_ref
                if node.value is None and child.value is not None:
                    raise InvariantError(f"{name}: device residency is closed under prefixes (a device node's "
                                         "parent is on the device)", child=child, parent=node)
            if node is root:
                continue
            require(node.lock_ref >= child_locks, f"{name}: lock_ref >= the sum of the children's", node=node,
                    lock_ref=node.lock_ref, children_lock_ref=child_locks)
            k = len(node.key) * unit
            if not k or k % ps:
                raise InvariantError(f"{name}: every key is a non-empty whole number of pages", node=node,
                                     key_tokens=k, page_size=ps)
            if node.value is None and node.host_value is None:
                raise InvariantError(f"{name}: every node is on the device or on host", node=node)
            if node.value is None:
                require(node.lock_ref == 0, f"{name}: a host-only node is unlocked", node=node)
            else:
                on_device.append(node)
            if (node.host_value is not None and self.write_policy != "write_back" and node.parent is not root
                    and node.parent.host_value is None):
                raise InvariantError(f"{name}: write-through backups form a prefix from the root", node=node,
                                     parent=node.parent)
            nodes.append(node)
        self._check_sizes(on_device, name)  # (device lengths only)
        return nodes, on_device

    def _check_tier_indexes(self, nodes: list, on_device: list, name: str) -> None:
        """Both leaf indexes against a recomputation (each leaf with a live heap entry of its current sort key),
        every node an in-flight copy protects locked, and the copy controller's and the storage tier's checks."""
        self.leaf_index.check({x for x in on_device if not x.lock_ref and all(c.value is None for c in x.children.values())},
                              f"{name}: the device-leaf index holds exactly the unlocked device leaves",
                              f"{name}: every device leaf has a live heap entry with its current sort key")
        self.host_leaf_index.check({x for x in nodes if x.value is None
                                    and all(c.host_value is None for c in x.children.values())},
                                   f"{name}: the host-leaf index holds exactly the host-only nodes without backed-up "
                                   "children",
                                   f"{name}: every host leaf has a live heap entry with its current sort key")
        for op, lock_node in self.ongoing_write_through.values():
            if lock_node is not None:
                require(lock_node.lock_ref > 0, f"{name}: a node with a backup in flight is locked", node=lock_node,
                        finish_s=op.finish_s)
        for op, node in self.ongoing_load_back.values():
            require(node.value is not None and node.lock_ref > 0,
                    f"{name}: a node with a load-back in flight is on the device and locked", node=node,
                    finish_s=op.finish_s)
        self.cache_controller.check_invariants()
        self.check_storage_invariants()
