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
        nodes, on_device = self._check_tiers("HiRadixCache")  # (two_tier_core: what both two-tier trees check)
        for node in nodes:
            for tier, v in (("device", node.value), ("host", node.host_value)):
                if v is not None and len(v) != len(node.key):
                    raise InvariantError(f"HiRadixCache: a node's {tier} slots number its tokens", node=node,
                                         key_len=len(node.key), slots=len(v))
        dev = [x.value for x in on_device]
        host = [x.host_value for x in nodes if x.host_value is not None]
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
                tree=host_tokens, pool_used=self.token_to_kv_pool_host.used_size())
        self.token_to_kv_pool_host.check_invariants()
        self._check_tier_indexes(nodes, on_device, "HiRadixCache")
