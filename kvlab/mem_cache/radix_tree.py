"""The tree mechanics every kvlab prefix cache over KV slots shares (plain, two-tier, SWA and Mamba).

:class:`BaseRadixTree` holds what reads only ``page_size``, ``root_node`` and the nodes'
keys / children / values: how a child is filed, the path's KV, membership checks
for locks, printing, and the tree-shape invariants. It stands on :class:`~kvlab.mem_cache.tree_core.TreeCore`
(``nodes()``, the lock walk and size counters, the evictable-leaf index; the page tree shares that too). ``RadixCache`` and the hybrid trees' base
(``swa_radix_cache.HybridTreeBase``) inherit it; matching, inserting, locking and evicting stay
with each tree, because that is where SGLang's trees differ. Also here: the token-key helper the trees
use (``as_tokens``); the logical clock and ``common_prefix_len`` live in the torch-free ``base_prefix_cache`` (the
page engine's tree shares them) and are re-exported here.
"""

from __future__ import annotations

from array import array

import torch

from kvlab.errors import InvariantError, LockRefError, require
from kvlab.mem_cache.base_prefix_cache import (  # noqa: F401  (LogicalClock, common_prefix_len: re-exported here)
    ChildKey,
    InsertResult,
    KVAllocator,
    LogicalClock,
    PrefixNode,
    SlotIndices,
    TokenKey,
    TreeLock,
    common_prefix_len,
)
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.tree_core import TreeCore


def as_tokens(key: TokenKey) -> array:
    """``key`` as an ``array('q')`` (no copy when it already is one)."""
    if isinstance(key, array) and key.typecode == "q":
        return key
    if isinstance(key, torch.Tensor):
        key = key.tolist()
    return array("q", key)


class BaseRadixTree(TreeCore):
    """Shared tree code. A subclass sets ``root_node`` and ``_empty`` (an empty int64 tensor) in its
    ``reset()``, which its ``__init__`` calls after this one."""

    root_node: PrefixNode
    _empty: torch.Tensor
    kind = "radix"  # BasePrefixCache.kind: a subclass with a second component per node names it
    state_pool = None  # BasePrefixCache.state_pool: no recurrent states (MambaRadixCache has one)

    def __init__(self, req_to_token_pool: ReqToTokenPool | None, token_to_kv_pool_allocator: KVAllocator | None,
                 page_size: int, name: str):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        alloc_ps = getattr(token_to_kv_pool_allocator, "page_size", page_size)
        if alloc_ps != page_size:
            raise ValueError(f"{name} page_size {page_size} does not fit the allocator's page_size {alloc_ps}")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = False

    def _child_key(self, key: array, off: int = 0) -> ChildKey:
        """A child's key in ``children``: its first token (page 1) or its first page. SGLang keys a page
        by the tuple of its tokens; kvlab by the page's bytes (same equality, no int objects built)."""
        return key[off] if self.page_size == 1 else key[off : off + self.page_size].tobytes()

    def child_key(self, key: array) -> ChildKey:
        """The key a node whose key is ``key`` is filed under in its parent's ``children``."""
        return self._child_key(key)

    def _sort_key(self, node: PrefixNode) -> int | tuple[int, ...]:
        """Children in token order: by first token, or by the first page's tokens."""
        return node.key[0] if self.page_size == 1 else tuple(node.key[: self.page_size])

    def _check_member(self, node: PrefixNode, what: str, gone: str = "was evicted") -> None:
        """Raise :class:`LockRefError` unless ``node`` holds device KV (``gone`` says how it lost it) in this tree."""
        if node.value is None:
            raise LockRefError(f"{what}: {node!r} {gone}")
        x = node
        while x.parent is not None:
            x = x.parent
        if x is not self.root_node:
            raise LockRefError(f"{what}: {node!r} belongs to another tree")

    gone_words = "was evicted"  # how a refused lock says the node lost its device KV

    def _lock_guard(self, node: PrefixNode, what: str) -> bool:
        """TreeCore's hook: no lock while the cache is disabled (True); else lock only a node of this tree that holds
        device KV."""
        if self.disable:
            return True
        self._check_member(node, what, self.gone_words)
        return False

    tree_words = "a plain radix tree"  # how insert_slots' error names this kind of tree

    def insert_slots(self, key: TokenKey, value: SlotIndices, *, prev_prefix_len: int = 0,
                     state_slot: int | None = None) -> InsertResult:
        """The contract's insert (``BasePrefixCache.insert_slots``) for a tree whose ``insert`` returns the prefix
        already cached and leaves the caller's slots for it alone: :meth:`insert`, then the caller's duplicate slots
        ``value[prev_prefix_len:already_cached]`` are freed. The SWA and Mamba trees free them inside their own
        ``insert`` and override this."""
        if state_slot is not None:
            raise ValueError(f"{type(self).__name__}.insert_slots: {self.tree_words} keeps no recurrent state, got "
                             f"state_slot={state_slot}")
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value, dtype=torch.int64)
        cached = self.insert(key, value)
        self.token_to_kv_pool_allocator.free(value[prev_prefix_len:cached])
        return InsertResult(cached)

    # sizes in tokens on the device (BasePrefixCache): TreeCore's counters for the plain and two-tier trees; the SWA
    # tree counts its full and window parts apart and overrides evictable_size / protected_size / total_size

    def lock(self, node: PrefixNode) -> TreeLock:
        """0.5.23's ``BasePrefixCache.lock``: ``inc_lock_ref(node)`` as a receipt for :meth:`unlock`
        (``SWARadixCache`` overrides both: its receipt carries the SWA lock's boundary)."""
        self.inc_lock_ref(node)
        return TreeLock(node)

    def unlock(self, lock: TreeLock) -> None:
        self.dec_lock_ref(lock.node)

    def all_values_flatten(self) -> torch.Tensor:
        values = [n.value for n in self.nodes() if n is not self.root_node]
        return torch.cat(values) if values else self._empty

    def path_device_indices(self, node: PrefixNode) -> torch.Tensor:
        """KV slots from the root down to ``node`` (0.5.23's way to read a match)."""
        values = []
        while node is not self.root_node:
            values.append(node.value)
            node = node.parent
        return torch.cat(values[::-1]) if values else self._empty

    def _node_note(self, node: PrefixNode) -> str:
        """A hybrid tree's marks for one node in :meth:`pretty_print` (its second component)."""
        return ""

    def pretty_print(self) -> str:
        """The tree as text, one node a line: ``len [first tokens] r=lock_ref`` (children in key
        order) plus the tree's own marks, then ``#tokens: N``. Returned, not printed."""
        lines = []

        def walk(node: PrefixNode, depth: int) -> None:
            head = list(node.key[:10])
            more = " ..." if len(node.key) > 10 else ""
            lines.append(f"{'  ' * depth}{len(node.key)} {head}{more} r={node.lock_ref}{self._node_note(node)}")
            for child in sorted(node.children.values(), key=self._sort_key):
                walk(child, depth + 1)

        walk(self.root_node, 0)
        lines.append(f"#tokens: {self.total_size()}")
        return "\n".join(lines)

    def _check_tree(self, evictable_size: int, protected_size: int, name: str) -> list[PrefixNode]:
        """The invariants every radix tree shares; returns the non-root nodes.

        The root has lock_ref 1, an empty key and no parent; each child points back at its parent and
        is filed under its own first token/page; every node holds one value per token of a key of
        whole pages; lock_ref >= 0 and >= the sum of its children's (a lock covers the path to the
        root); the tokens of locked / unlocked nodes equal ``protected_size`` / ``evictable_size``;
        no KV slot is in two nodes, and every cached slot is allocated.
        """
        root, ps = self.root_node, self.page_size
        self._check_root(name)
        nodes = []
        for node in self.nodes():
            child_locks = 0
            for ck, child in node.children.items():
                if child.parent is not node:
                    raise InvariantError(f"{name}: each child points back at its parent", child=child,
                                         parent=child.parent, filed_under=node)
                if ck != self._child_key(child.key):
                    raise InvariantError(f"{name}: each child is filed under its own first token/page", child=child,
                                         filed_under=ck, own_key=self._child_key(child.key))
                child_locks += child.lock_ref
            if node is root:
                continue
            nodes.append(node)
            if node.value is None or len(node.value) != len(node.key) or not len(node.key):
                raise InvariantError(f"{name}: every node holds one value per token of a non-empty key", node=node,
                                     key_len=len(node.key), values=None if node.value is None else len(node.value))
            if len(node.key) % ps:
                raise InvariantError(f"{name}: every key is a whole number of pages", node=node,
                                     key_len=len(node.key), page_size=ps)
            if node.lock_ref < 0 or node.lock_ref < child_locks:
                raise InvariantError(f"{name}: lock_ref >= 0 and >= the sum of the children's", node=node,
                                     lock_ref=node.lock_ref, children_lock_ref=child_locks)
        self._check_sizes(nodes, name, evictable_size, protected_size)
        if nodes:
            flat = torch.cat([n.value for n in nodes])
            distinct = len(torch.unique(flat))
            require(distinct == len(flat), f"{name}: no KV slot is cached in two nodes", cached_slots=len(flat),
                    distinct=distinct)
            alloc = self.token_to_kv_pool_allocator
            if alloc is not None and hasattr(alloc, "all_allocated") and not alloc.all_allocated(flat):
                free = flat[~alloc.is_allocated(flat)] if hasattr(alloc, "is_allocated") else flat
                raise InvariantError(f"{name}: every cached KV slot is allocated in the allocator",
                                     n_free=len(free), first_free=free.tolist()[:16])
        return nodes
