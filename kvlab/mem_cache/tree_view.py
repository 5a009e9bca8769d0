"""A radix tree as a table: one row per node, for plots and for reading a tree without walking it."""

from __future__ import annotations

from typing import Any


def tree_frame(cache: Any, *, names: dict[int, str] | None = None, preview_tokens: int = 6):
    """Rows: ``id``, ``parent_id`` (None for the root), ``tokens`` (this node's key length),
    ``subtree_tokens`` (this node and everything below), ``prefix_tokens`` (root to the node's end),
    ``path_tokens`` (a leaf's whole cached sequence; an inner node's, the sum over its leaves — the
    width an icicle gives a node so that children fill their parent),
    ``lock_ref``, ``status`` (``root`` / ``locked`` / ``evictable`` leaf / ``internal``),
    ``last_access_time``, ``hit_count``, ``label`` (``names[first token]`` or a key preview)."""
    import pandas as pd

    names = names or {}
    root = cache.root_node
    page = getattr(cache, "page_size", 1)  # siblings differ in their first page
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
            status, label = "root", "root"
        else:
            status = "locked" if node.lock_ref > 0 else ("evictable" if not node.children else "internal")
            head = list(node.key[:preview_tokens])
            label = names.get(node.key[0]) or f"{head}{' …' if len(node.key) > preview_tokens else ''}"
        rows.append(dict(id=node.id, parent_id=None if node is root else node.parent.id, tokens=len(node.key),
                         subtree_tokens=subtree[node.id], path_tokens=path[node.id], prefix_tokens=end, lock_ref=node.lock_ref, status=status,
                         last_access_time=node.last_access_time, hit_count=node.hit_count, label=label))
    return pd.DataFrame(rows)
