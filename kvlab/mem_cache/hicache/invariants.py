"""The two-tier tree's integrity check: both tiers' bookkeeping against a recomputation.

kvlab's own (SGLang has no counterpart; the differential test compares the trees instead). A mixin of
:class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache`.
"""

from __future__ import annotations

import torch

from kvlab.errors import InvariantError, require


class HiInvariants:
    """``check_invariants`` of :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` (a mixin): what both
    tiers' nodes hold, on top of the tree core's checks (root, size counters, each tier's leaf index)."""

    # -- invariants ----------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise :class:`InvariantError` unless the two tiers' bookkeeping is consistent.

        Every node is on the device, on host, or both, with one slot per token of a whole-page key; device
        residency is closed under prefixes; host-only nodes are unlocked; under the write-through policies
        backups form a prefix from the root; lock_ref >= the children's; the evictable/protected counters equal
        the device tokens of unlocked/locked nodes; no device or host slot is cached twice, each is allocated in
        its pool, and the host pool holds exactly the tree's host copies; both leaf indexes equal a brute-force
        recomputation, and each of their leaves has a live entry with its current sort key in its tier's heap;
        every node an in-flight copy protects is locked.
        """
        root, ps = self.root_node, self.page_size
        self._check_root("HiRadixCache")
        dev, host, nodes, on_device = [], [], [], []
        for node in self.nodes():
            child_locks = 0
            for ck, child in node.children.items():
                require(child.parent is node, "HiRadixCache: each child points back at its parent", child=child)
                require(ck == self._key_of(child.key), "HiRadixCache: each child is filed under its first token/page",
                        child=child, filed_under=ck)
                child_locks += child.lock_ref
                if node.value is None and child.value is not None:
                    raise InvariantError("HiRadixCache: device residency is closed under prefixes (a device node's "
                                         "parent is on the device)", child=child, parent=node)
            if node is root:
                continue
            require(node.lock_ref >= child_locks, "HiRadixCache: lock_ref >= the sum of the children's", node=node,
                    lock_ref=node.lock_ref, children_lock_ref=child_locks)
            nodes.append(node)
            k = len(node.key)
            if not k or k % ps:
                raise InvariantError("HiRadixCache: every key is a non-empty whole number of pages", node=node,
                                     key_len=k, page_size=ps)
            if node.value is None and node.host_value is None:
                raise InvariantError("HiRadixCache: every node is on the device or on host", node=node)
            for tier, v in (("device", node.value), ("host", node.host_value)):
                if v is not None and len(v) != k:
                    raise InvariantError(f"HiRadixCache: a node's {tier} slots number its tokens", node=node,
                                         key_len=k, slots=len(v))
            if node.value is None:
                require(node.lock_ref == 0, "HiRadixCache: a host-only node is unlocked", node=node)
            else:
                dev.append(node.value)
                on_device.append(node)
            if node.host_value is not None:
                host.append(node.host_value)
                if (self.write_policy != "write_back" and node.parent is not root
                        and node.parent.host_value is None):
                    raise InvariantError("HiRadixCache: write-through backups form a prefix from the root",
                                         node=node, parent=node.parent)
        self._check_sizes(on_device, "HiRadixCache")  # (device tokens only)
        held = self.prefetch_host_slots()  # (storage_moves) host slots a prefetch holds, not yet in the tree
        for tier, slots, pool in (("device", dev, self.token_to_kv_pool_allocator),
                                  ("host", host + held, self.token_to_kv_pool_host)):
            flat = torch.cat(slots) if slots else self._empty
            require(len(torch.unique(flat)) == len(flat), f"HiRadixCache: no {tier} slot is cached in two nodes",
                    slots=len(flat))
            require(pool.all_allocated(flat), f"HiRadixCache: every cached {tier} slot is allocated in its pool",
                    slots=len(flat))
        host_tokens = sum(len(h) for h in host + held)
        require(host_tokens == self.token_to_kv_pool_host.used_size(),
                "HiRadixCache: the host pool holds exactly the tree's host copies and the prefetches' slots",
                tree=host_tokens,
                pool_used=self.token_to_kv_pool_host.used_size())
        self.leaf_index.check({x for x in on_device if not x.lock_ref and all(c.value is None for c in x.children.values())},
                              "HiRadixCache: the device-leaf index holds exactly the unlocked device leaves",
                              "HiRadixCache: every device leaf has a live heap entry with its current sort key")
        self.host_leaf_index.check({x for x in nodes if x.value is None
                                    and all(c.host_value is None for c in x.children.values())},
                                   "HiRadixCache: the host-leaf index holds exactly the host-only nodes without "
                                   "backed-up children",
                                   "HiRadixCache: every host leaf has a live heap entry with its current sort key")
        for op, lock_node in self.ongoing_write_through.values():
            if lock_node is not None:
                require(lock_node.lock_ref > 0, "HiRadixCache: a node with a backup in flight is locked",
                        node=lock_node, finish_s=op.finish_s)
        for op, node in self.ongoing_load_back.values():
            require(node.value is not None and node.lock_ref > 0,
                    "HiRadixCache: a node with a load-back in flight is on the device and locked", node=node,
                    finish_s=op.finish_s)
        self.token_to_kv_pool_host.check_invariants()
        self.check_storage_invariants()
