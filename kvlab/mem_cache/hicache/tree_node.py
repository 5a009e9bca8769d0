"""The two-tier tree's node: 0.5.16's ``TreeNode`` with its HiCache fields.

Upstream: ``sglang/srt/mem_cache/radix_cache.py::TreeNode`` (``host_value``, ``host_ref_counter``,
``protect_host`` / ``release_host``, ``evicted`` / ``backuped``), as ``hiradix_cache.py`` uses it.
"""

from __future__ import annotations

from array import array

import torch

from kvlab.errors import LockRefError
from kvlab.mem_cache.base_prefix_cache import LogicalClock


class HiTreeNode:
    """One edge of the hierarchical tree (0.5.16's ``TreeNode`` with its HiCache fields).

    ``value``: device slots or None (``evicted``); ``host_value``: host slots or None (``backuped``);
    ``host_ref_counter``: holds that keep the host copy from host eviction (a load-back reading it, a write-back
    staging it)."""

    __slots__ = ("children", "parent", "key", "value", "host_value", "lock_ref", "host_ref_counter",
                 "last_access_time", "creation_time", "hit_count", "priority", "id", "hash_value")

    def __init__(self, key: array, value: torch.Tensor | None, parent: HiTreeNode | None, clock: LogicalClock,
                 node_id: int, priority: int = 0):
        self.children: dict = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.host_value: torch.Tensor | None = None
        self.lock_ref = 0
        self.host_ref_counter = 0
        self.last_access_time = clock.tick()  # two reads of the clock, as TreeNode.__init__ does
        self.creation_time = clock.tick()
        self.hit_count = 0
        self.priority = priority
        self.id = node_id
        self.hash_value: list[str] | None = None  # storage keys of its pages (L3), computed when first needed

    @property
    def evicted(self) -> bool:
        return self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    def protect_host(self) -> None:
        self.host_ref_counter += 1

    def release_host(self) -> None:
        if self.host_ref_counter <= 0:
            raise LockRefError(f"release_host: {self!r} holds no host protection")
        self.host_ref_counter -= 1

    @property
    def residency(self) -> str:
        """``"device"``, ``"both"`` or ``"host"``."""
        if self.value is None:
            return "host"
        return "device" if self.host_value is None else "both"

    def __repr__(self) -> str:
        head = list(self.key[:6])
        more = "..." if len(self.key) > 6 else ""
        return f"HiTreeNode(id={self.id}, key={head}{more} ({len(self.key)}), {self.residency}, lock_ref={self.lock_ref})"

