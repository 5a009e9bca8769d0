"""A radix tree as a table: one row per node, for plots and for reading a tree without walking it.

Works for every kvlab tree (``RadixCache``, ``SWARadixCache``, ``MambaRadixCache``, ``HiRadixCache``); the
two-tier tree's residency shows up in the ``residency`` column, the hybrid trees'
second component in the ``state`` column (a Mamba node with or without its recurrent state, an
SWA tombstone). :func:`with_evicted` lays a tree *after* an eviction over the tree *before* it, so a plot
can keep the scale and mark what was destroyed instead of dropping it.
"""

from __future__ import annotations

from collections.abc import Callable

from kvlab.mem_cache.base_prefix_cache import BasePrefixCache, PrefixNode

SPANS = "spans"  # tree_frame(names=SPANS): label each node by where it lies in the sequence
EVICTED = "evicted"  # with_evicted(): the status of a node the eviction destroyed

# ``state`` column values (empty for a plain radix tree, whose nodes have no second component)
STATE_MAMBA = "recurrent state"  # a Mamba node holding a state: a hit may resume here
STATE_MAMBA_TOMBSTONE = "no state (Mamba tombstone)"  # KV cached, state gone: a hit cannot end here
STATE_SWA_TOMBSTONE = "SWA tombstone"  # full KV cached, sliding-window KV freed
_STATE_SUFFIX = {STATE_MAMBA: "state", STATE_MAMBA_TOMBSTONE: "no state", STATE_SWA_TOMBSTONE: "SWA tombstone"}

Names = dict | str | Callable[[PrefixNode], str | None] | None


def _node_state(cache_kind: str, node: PrefixNode) -> str:
    """The node's second component, by ``BasePrefixCache.kind``: Mamba nodes carry ``mamba_value``, SWA nodes
    ``swa_tombstone``, plain radix nodes neither."""
    if cache_kind == "mamba":
        return STATE_MAMBA if node.mamba_value is not None else STATE_MAMBA_TOMBSTONE
    if cache_kind == "swa" and node.swa_tombstone:
        return STATE_SWA_TOMBSTONE
    return ""


def tree_frame(cache: BasePrefixCache, *, names: Names = None, preview_tokens: int = 6):
    """Rows: ``id``, ``parent_id`` (None for the root), ``tokens`` (this node's key length),
    ``subtree_tokens`` (this node and everything below), ``prefix_tokens`` (root to the node's end),
    ``path_tokens`` (a leaf's whole cached sequence; an inner node's, the sum over its leaves — the
    width an icicle gives a node so that children fill their parent),
    ``lock_ref``, ``status`` (``root`` / ``locked`` / ``evictable`` leaf / ``internal``),
    ``last_access_time``, ``hit_count``, ``label``, ``key_preview`` (the first ``preview_tokens``
    token ids), and for hybrid trees: ``state`` (:data:`STATE_MAMBA`, :data:`STATE_MAMBA_TOMBSTONE`,
    :data:`STATE_SWA_TOMBSTONE` or ``""``), ``has_state`` (a Mamba node holds a recurrent state a hit
    can resume from; False elsewhere), ``mamba_slot`` (its ``MambaPool`` slot, ``<NA>`` if none) and
    ``swa_tombstone``; ``residency``: on a two-tier tree (``HiRadixCache``) ``"device"``, ``"both"`` or
    ``"host"`` (:attr:`HiTreeNode.residency`; a host-only node is never ``locked``), ``""`` on one-tier trees.

    ``label``: ``names[first token]`` when ``names`` is a dict (a conversation's name, say), ``names(node)``
    when it is a function, and with ``names="spans"`` where the node lies in the cached sequence,
    ``"tokens 9–12"`` (1-based, inclusive), followed by the node's state on a hybrid tree
    (``"tokens 9–12 · state"``). Otherwise, or when the dict / function gives nothing, the key preview.
    """
    import pandas as pd

    if isinstance(names, str) and names != SPANS:
        raise ValueError(f"tree_frame: names must be a dict, a function or {SPANS!r}, got {names!r}")
    kind = cache.kind
    root = cache.root_node
    page = cache.page_size  # siblings differ in their first page
    rows, order = [], []
    stack = [(root, 0)]
    while stack:  # pre-order, children in key order, so the table reads like pretty_print
        node, prefix = stack.pop()
        end = prefix + len(node.key)
        order.append((node, end))
        for child in sorted(node.children.values(), key=lambda c: tuple(c.key[:page]), reverse=True):
            stack.append((child, end))
    subtree: dict[int, int] = {}
    path: dict[int, int] = {}
    ends = {node.id: end for node, end in order}
    for node, _ in reversed(order):
        subtree[node.id] = len(node.key) + sum(subtree[c.id] for c in node.children.values())
        path[node.id] = sum(path[c.id] for c in node.children.values()) if node.children else ends[node.id]
    for node, end in order:
        if node is root:
            status, label, preview, state = "root", "root", "", ""
        else:
            status = "locked" if node.lock_ref > 0 else ("evictable" if not node.children else "internal")
            head = list(node.key[:preview_tokens])
            preview = f"{head}{' …' if len(node.key) > preview_tokens else ''}"
            state = _node_state(kind, node)
            if names == SPANS:
                label = f"tokens {end - len(node.key) + 1:,}–{end:,}"
                if state:
                    label += f" · {_STATE_SUFFIX[state]}"
            elif callable(names):
                label = names(node) or preview
            else:
                label = (names or {}).get(node.key[0]) or preview
        slot = node.mamba_value if kind == "mamba" and node is not root else None
        residency = "" if node is root else getattr(node, "residency", "")
        rows.append(dict(id=node.id, parent_id=None if node is root else node.parent.id, tokens=len(node.key),
                         subtree_tokens=subtree[node.id], path_tokens=path[node.id], prefix_tokens=end,
                         lock_ref=node.lock_ref, status=status, last_access_time=node.last_access_time,
                         hit_count=node.hit_count, label=label, key_preview=preview, state=state,
                         has_state=slot is not None, mamba_slot=slot,
                         swa_tombstone=kind == "swa" and bool(node.swa_tombstone), residency=residency))
    frame = pd.DataFrame(rows)
    frame["mamba_slot"] = pd.array(frame["mamba_slot"].tolist(), dtype="Int64")
    return frame


def with_evicted(before, after):
    """The tree ``before`` an eviction with the tree ``after`` it laid over it: one row per node of
    ``before`` (same order, same ``path_tokens``, so a plot keeps the scale), surviving nodes with their
    ``after`` status and fields, destroyed nodes with status :data:`EVICTED`. An eviction only deletes
    leaves (node ids are stable), so a node of ``after`` missing from ``before`` means the frames are of
    different trees, or the tree changed by more than an eviction: that raises ``ValueError``."""
    new = set(after["id"]) - set(before["id"])
    if new:
        raise ValueError(f"with_evicted: nodes {sorted(new)} of the tree after are not in the tree before; "
                         "give two frames of one tree, before and after an eviction")
    kept = after.set_index("id")
    out = before.copy()
    live = out["id"].isin(kept.index)
    for column in ("status", "lock_ref", "last_access_time", "hit_count", "label", "state", "has_state",
                   "mamba_slot", "swa_tombstone", "residency"):
        if column in out and column in kept:
            out.loc[live, column] = kept.loc[out.loc[live, "id"], column].to_numpy()
    out.loc[~live, "status"] = EVICTED
    out["evicted"] = ~live
    return out
