"""The prefix-cache contract every kvlab tree keeps (``sglang/srt/mem_cache/base_prefix_cache.py``).

:class:`BasePrefixCache` is the written contract: the attributes and methods the glue
(``common.evict_from_tree_cache``, ``common.match_alloc_insert``), the scheduler, the tree views and
the widgets may rely on for *any* prefix cache (``RadixCache``, ``SWARadixCache``,
``MambaRadixCache``). The request and result types of those methods live beside it, as in SGLang:
:class:`MatchResult`, :class:`EvictParams`, :class:`EvictResult` (+ :class:`HybridEvictResult`) and
the lock receipt :class:`TreeLock`.

Differs on purpose from SGLang 0.5.23:

- ``BasePrefixCache`` is a ``typing.Protocol`` (checked structurally, ``runtime_checkable``), not an
  ABC the trees inherit: the contract stays one short page, and the shared tree code lives in
  ``radix_tree.BaseRadixTree``. It holds what all three trees implement alike; HiCache, sessions,
  metrics and KV events are not modelled.
- Each tree's own ``insert`` keeps its own arguments (SGLang 0.5.23 funnels them all through one
  ``InsertParams``); the contract's insert is ``insert_slots``, one form every tree takes, which also frees the
  caller's duplicate slots (a plain RadixCache's ``insert`` leaves them to the caller) and says whether the tree
  took the caller's recurrent-state slot (:class:`InsertResult`). ``state_pool`` says whether a tree needs one.
- ``kind`` names the tree (``"radix"``, ``"swa"``, ``"mamba"``) so views can read a hybrid node's second
  component without guessing from attributes; ``nodes()`` walks every node.
- ``match_prefix`` / ``insert`` take plain token sequences (:data:`TokenKey`), not ``RadixKey`` /
  ``MatchPrefixParams``; ``MatchResult`` keeps only the device fields.
- ``EvictResult`` separates shortfall, request, eviction, over-eviction and overshoot (the finding
  the project is about); SGLang's ``num_tokens_evicted`` is a property of it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from kvlab.mem_cache.shortfall import over_evicted_tokens

if TYPE_CHECKING:  # torch only in annotations here, so the result types import without it (start-up)
    import torch

    from kvlab.mem_cache.allocator import KVAllocator
    from kvlab.mem_cache.memory_pool import ReqToTokenPool

    TokenKey = Sequence[int] | torch.Tensor  # token ids (a list, an ``array('q')``, a 1-D tensor)
    SlotIndices = Sequence[int] | torch.Tensor  # KV slot indices, one per token


def __getattr__(name: str) -> Any:
    """The names that need torch, made on first use (PEP 562): ``KVAllocator`` (re-exported: the allocators'
    protocol) and the aliases :data:`TokenKey` / :data:`SlotIndices`. The trees import them; ``EvictResult`` and
    the other result types import without torch (``kvlab simulate``'s start-up)."""
    if name == "KVAllocator":
        from kvlab.mem_cache.allocator import KVAllocator

        value: Any = KVAllocator
    elif name in ("TokenKey", "SlotIndices"):
        import torch

        value = Sequence[int] | torch.Tensor
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


ChildKey = int | bytes  # a child's key in ``children``: its first token (page 1) or first page's bytes
Priority = int | tuple[int, int]  # an eviction strategy's sort key (smaller is evicted first)
TREE_KINDS = ("radix", "swa", "mamba")  # BasePrefixCache.kind


class LogicalClock:
    """Deterministic stand-in for ``time.monotonic()``: ``tick()`` returns 1, 2, 3, ... (every tree's clock)."""

    __slots__ = ("now",)

    def __init__(self, start: int = 0):
        self.now = start

    def tick(self) -> int:
        self.now += 1
        return self.now


def common_prefix_len(a: array, b: array, off: int, n: int) -> int:
    """Length of the common prefix of ``a`` and ``b[off:n]`` (C-level slice compares, log steps)."""
    lim = min(len(a), n - off)
    if a[:lim] == b[off : off + lim]:
        return lim
    lo, hi = 0, lim  # a[:lo] matches, a[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[off + lo : off + mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixNode(Protocol):
    """One edge of a prefix tree, as views and eviction strategies read it (``TreeNode``,
    ``HybridTreeNode``). ``value is None`` once the node was evicted."""

    id: int
    key: array
    value: torch.Tensor | None
    parent: PrefixNode | None
    children: dict[ChildKey, PrefixNode]
    lock_ref: int
    last_access_time: int
    creation_time: int
    hit_count: int
    priority: int


class MatchResult(NamedTuple):
    """``match_prefix``'s answer. ``device_indices``: KV slots of the matched prefix (int64);
    ``last_device_node``: the node the prefix ends at (lock it to pin the prefix);
    ``device_prefix_len``: matched tokens (a multiple of page_size)."""

    device_indices: torch.Tensor
    last_device_node: PrefixNode
    device_prefix_len: int

    @property
    def prefix_len(self) -> int:
        return self.device_prefix_len


class InsertResult(NamedTuple):
    """``insert_slots``'s answer. ``prefix_len``: leading tokens of the key that were already cached (the caller's
    slots for them past ``prev_prefix_len`` were duplicates, now freed); ``state_exist``: the final node already
    held a recurrent state, so the tree did not take the caller's ``state_slot`` (the caller frees it; always
    False on trees without a ``state_pool``)."""

    prefix_len: int
    state_exist: bool = False


class TreeLock(NamedTuple):
    """0.5.23's ``lock(node)`` receipt; ``unlock(lock)`` replays it."""

    node: PrefixNode


class LockReceipt(Protocol):
    """What ``lock`` returns and ``unlock`` takes back (:class:`TreeLock`, ``SWATreeLock``)."""

    @property
    def node(self) -> PrefixNode: ...


@dataclass(frozen=True)
class EvictParams:
    """``base_prefix_cache.EvictParams``: tokens to free from the full pool (and the SWA pool)."""

    num_tokens: int = 0
    swa_num_tokens: int = 0


@dataclass(frozen=True)
class EvictResult:
    """What one eviction did, in tokens. ``evicted == needed + over_evicted + overshoot``, where
    ``needed = min(evicted_tokens, shortfall_tokens)``.

    - ``shortfall_tokens``: what was truly missing, ``max(0, need - available)``. A direct
      ``RadixCache.evict(n)`` call knows no pool, so there it is ``n``.
    - ``requested_tokens``: what was asked of the tree. Equal to the shortfall with the fix
      (SGLang >= 0.5.17); the whole need in the bug (<= 0.5.16, ``mode="full"``).
    - ``evicted_tokens``: what the tree freed (whole leaves, so possibly more than requested, or
      less when it ran out of evictable leaves).
    - ``over_evicted_tokens``: evicted because the request exceeded the shortfall (the bug's
      damage): ``max(0, min(evicted, requested) - shortfall)``.
    - ``overshoot_tokens``: leaf-granularity excess beyond the request:
      ``max(0, evicted - max(requested, swa_requested))``. Present with or without the bug.
    - ``swa_shortfall_tokens`` / ``swa_requested_tokens``: the SWA pool's side (SWA allocator
      arm only; 0 otherwise).
    """

    shortfall_tokens: int = 0
    requested_tokens: int = 0
    evicted_tokens: int = 0
    over_evicted_tokens: int = 0
    overshoot_tokens: int = 0
    swa_shortfall_tokens: int = 0
    swa_requested_tokens: int = 0

    @classmethod
    def of(cls, shortfall: int, requested: int, evicted: int, swa_shortfall: int = 0,
           swa_requested: int = 0) -> EvictResult:
        return cls(
            shortfall_tokens=shortfall,
            requested_tokens=requested,
            evicted_tokens=evicted,
            over_evicted_tokens=over_evicted_tokens(evicted, requested, shortfall),
            overshoot_tokens=max(0, evicted - max(requested, swa_requested)),
            swa_shortfall_tokens=swa_shortfall,
            swa_requested_tokens=swa_requested,
        )

    @property
    def num_tokens_evicted(self) -> int:
        """SGLang's name for ``evicted_tokens``."""
        return self.evicted_tokens


@dataclass(frozen=True)
class HybridEvictResult(EvictResult):
    """:class:`EvictResult` plus what the second pool gave back.

    ``swa_evicted_tokens``: SWA slots freed (tombstones and deleted nodes); ``mamba_*``: recurrent
    states asked for / freed (Mamba cache)."""

    swa_evicted_tokens: int = 0
    mamba_shortfall: int = 0
    mamba_num_evicted: int = 0


@runtime_checkable
class BasePrefixCache(Protocol):
    """The contract of a prefix cache (SGLang's ``BasePrefixCache`` + ``PrefixCacheTrait``).

    State: ``req_to_token_pool`` / ``token_to_kv_pool_allocator`` (either may be None for a
    tree-only cache), ``page_size`` (keys and matches are whole pages), ``disable`` (a disabled cache
    matches nothing, caches nothing, evicts nothing), ``root_node`` (always present, never evicted,
    never counted in the sizes).

    Sizes, in tokens: ``total_size() == evictable_size() + protected_size()``. *Protected* tokens sit
    on a path some lock holds; *evictable* ones do not, but only unlocked *leaves* can actually be
    evicted, whole.
    """

    req_to_token_pool: ReqToTokenPool | None
    token_to_kv_pool_allocator: KVAllocator | None
    page_size: int
    disable: bool
    root_node: PrefixNode
    kind: str  # one of TREE_KINDS: "radix" (plain), "swa" (nodes have swa_tombstone), "mamba" (nodes have mamba_value)
    state_pool: Any  # the recurrent-state pool one insert takes a slot of (MambaPool), or None (radix, SWA)

    def reset(self) -> None:
        """Forget every cached prefix (the slots are not freed: the allocator is reset apart)."""

    def match_prefix(self, key: TokenKey) -> MatchResult:
        """The longest usable cached prefix of ``key``, truncated to whole pages. May split the node
        the match ends inside and refreshes recency along the path; evicts and allocates nothing. A
        hybrid tree may answer shorter than the KV match (SWA: a whole window must be cached; Mamba:
        the prefix must end at a recurrent state)."""
        ...

    def insert_slots(self, key: TokenKey, value: SlotIndices, *, prev_prefix_len: int = 0,
                     state_slot: int | None = None) -> InsertResult:
        """Cache ``key`` (whole pages) with the caller's KV slots ``value``, one per token: ``value[:prev_prefix_len]``
        came from this tree's own match, the rest the caller allocated. Matched tokens past ``prev_prefix_len`` keep
        the tree's slots and the caller's duplicates are freed; the tree owns the rest. ``state_slot``: a slot of
        ``state_pool`` holding the state after the key's last token, required exactly when ``state_pool`` is not
        None (else ``ValueError``)."""
        ...

    def nodes(self) -> Iterator[PrefixNode]:
        """Every node, the root first (pre-order; children in no promised order)."""
        ...

    def inc_lock_ref(self, node: PrefixNode) -> int | None:
        """Lock ``node``'s path: none of its tokens can be evicted until the matching
        ``dec_lock_ref``. Locks nest (a count per node). Locking the root is a no-op."""
        ...

    def dec_lock_ref(self, node: PrefixNode) -> int | None:
        """Undo one ``inc_lock_ref(node)``; raises ``LockRefError`` on an unlocked, evicted or foreign
        node. (``SWARadixCache`` needs the ``swa_uuid`` its ``inc_lock_ref`` returned: use
        ``lock`` / ``unlock``, which carry it.)"""
        ...

    def lock(self, node: PrefixNode) -> LockReceipt:
        """``inc_lock_ref(node)``, returned as a receipt that :meth:`unlock` replays."""
        ...

    def unlock(self, lock: LockReceipt) -> None:
        """Release a receipt from :meth:`lock`."""
        ...

    def evict(self, params: EvictParams | int) -> EvictResult:
        """Free at least ``num_tokens`` tokens (and ``swa_num_tokens`` SWA tokens where the tree has
        an SWA pool) from unlocked nodes, or every evictable one if fewer exist. Whole leaves go, so
        the result may exceed the request (``overshoot_tokens``); locked paths are never touched.
        Freed slots go back to ``token_to_kv_pool_allocator``."""
        ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def total_size(self) -> int: ...

    def path_device_indices(self, node: PrefixNode) -> torch.Tensor:
        """KV slots from the root down to ``node`` (int64)."""
        ...

    def pretty_print(self) -> str:
        """The tree as text, one node a line; returned, not printed."""
        ...

    def check_invariants(self) -> None:
        """Raise ``InvariantError`` unless the bookkeeping is consistent (sizes equal the tree's
        tokens, locks cover paths to the root, no slot cached twice, every cached slot allocated)."""
        ...
