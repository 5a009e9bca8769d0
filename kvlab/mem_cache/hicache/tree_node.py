"""The two-tier tree's node: 0.5.16's ``TreeNode`` with its HiCache fields.

Upstream: ``sglang/srt/mem_cache/radix_cache.py::TreeNode`` (``host_value``, ``host_ref_counter``,
``protect_host`` / ``release_host``, ``evicted`` / ``backuped``), as ``hiradix_cache.py`` uses it.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from kvlab.errors import LockRefError
from kvlab.mem_cache.base_prefix_cache import LogicalClock
from kvlab.mem_cache.tree_core import NodeCore

if TYPE_CHECKING:  # (annotations only: the page engine's two-tier tree uses this node without torch)
    import torch


class HiTreeNode(NodeCore):
    """One edge of the hierarchical tree (0.5.16's ``TreeNode`` with its HiCache fields).

    ``value``: device slots or None (``evicted``); ``host_value``: host slots or None (``backuped``);
    ``host_ref_counter``: holds that keep the host copy from host eviction (a load-back reading it, a write-back
    staging it)."""

    __slots__ = ("value", "host_value", "host_ref_counter", "hash_value")

    def __init__(self, key: array, value: torch.Tensor | None, parent: HiTreeNode | None, clock: LogicalClock,
                 node_id: int, priority: int = 0):
        # two reads of the clock, as TreeNode.__init__ does: the access time, then the creation time (LogicalClock.tick
        # twice, inlined: a node is made per insert's new leaf and per split)
        t = clock.now + 1
        clock.now = t + 1
        NodeCore.__init__(self, key, parent, t, t + 1, node_id, priority)  # (no super object to make)
        self.value = value
        self.host_value: torch.Tensor | None = None
        self.host_ref_counter = 0
        self.hash_value: list[int] | None = None  # storage keys of its pages (L3, the store's), when first needed

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

