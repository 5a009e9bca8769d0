"""The classic (0.5.16) request API of the token trees: what a request carries, and what the tree does with it
after a prefill chunk and at the end.

Upstream: ``sglang/srt/managers/schedule_batch.py::Req`` (the fields the tree reads: :class:`Req`) and
``sglang/srt/mem_cache/radix_cache.py::RadixCache.cache_finished_req`` / ``cache_unfinished_req``.
:class:`RequestFlows` is the finished-request flow ``RadixCache`` and the two-tier ``HiRadixCache`` share (in SGLang
the latter inherits it); :class:`RadixRequestFlows` adds ``RadixCache``'s unfinished-request flow (the two-tier tree
has its own). Both are mixins over a tree's ``_insert`` / ``_insert_finished``, locks and pools.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from kvlab.errors import require
from kvlab.mem_cache.base_prefix_cache import PrefixNode
from kvlab.mem_cache.radix_tree import as_tokens
from kvlab.units import align_down

_I64 = torch.int64


class Req(Protocol):
    """What ``cache_finished_req`` / ``cache_unfinished_req`` read and write on a request
    (SGLang 0.5.16's ``schedule_batch.Req`` fields of the same names).

    - ``rid``: id, only for messages.
    - ``origin_input_ids``, ``output_ids``: prompt and generated tokens (finished path).
    - ``fill_ids``: tokens whose KV is in the row so far (unfinished path, after a chunk).
    - ``req_pool_idx``: its row in ``ReqToTokenPool.req_to_token``.
    - ``prefix_indices``: KV slots of the cached prefix (written by ``cache_unfinished_req``).
    - ``last_node``: the tree node its prefix ends at; the request holds one lock on it.
    - ``cache_protected_len``: row positions ``[0, cache_protected_len)`` belong to the tree
      (matched or already inserted); the request must not free them.
    - ``priority`` (optional, default 0): passed to ``insert`` for the ``priority`` policy.
    """

    rid: str | int
    origin_input_ids: list[int]
    output_ids: list[int]
    fill_ids: list[int]
    req_pool_idx: int | None
    prefix_indices: torch.Tensor
    last_node: PrefixNode | None
    cache_protected_len: int


@dataclass
class SimpleReq:
    """A minimal concrete :class:`Req` (tests, notebooks, the simulator's starting point)."""

    rid: str | int
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    fill_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=_I64))
    last_node: PrefixNode | None = None
    cache_protected_len: int = 0
    priority: int = 0


class RequestFlows:
    """The finished-request flow of the trees with SGLang 0.5.16's classic request API (``RadixCache``, and
    ``HiRadixCache``, which in SGLang inherits ``RadixCache.cache_finished_req`` and runs it over its own insert).
    A tree supplies ``_insert_finished`` (its insert of ``tokens[:key_len]`` with the row's slots, returning the
    prefix already cached) and the attributes ``BaseRadixTree`` sets."""

    def _held_path(self, held, held_len: int) -> list | None:
        """Root-to-``held`` nodes (root excluded) if ``held`` is a live, locked node whose path holds ``held_len``
        tokens; None otherwise (the caller then walks from the root)."""
        if held is None or held.value is None or held.lock_ref <= 0 or held is self.root_node:
            return None
        path, length, root = [], 0, self.root_node
        while held is not root:
            if held is None:
                return None
            path.append(held)
            length += len(held.key)
            held = held.parent
        return path[::-1] if length == held_len else None

    def _insert_finished(self, tokens: array, key_len: int, row: torch.Tensor, priority: int, req: Req) -> int:
        raise NotImplementedError

    def _row_freeing(self, row: torch.Tensor, req_pool_idx: int):
        """``(free, view)``: the allocator's free for row slices (``free_row`` when it has one) and the row as that
        free reads it cheapest (the pool's numpy view of the same memory when there is one, else ``row``)."""
        alloc = self.token_to_kv_pool_allocator
        free_row = getattr(alloc, "free_row", None)
        if free_row is None:
            return alloc.free, row
        rows = getattr(self.req_to_token_pool, "rows", None)
        return free_row, (row if rows is None else rows[req_pool_idx])

    def cache_finished_req(self, req: Req, is_insert: bool = True, kv_len_to_handle: int | None = None) -> None:
        """A finished request hands its KV to the tree (``RadixCache.cache_finished_req``).

        Tokens = ``(origin_input_ids + output_ids)[:kv_len_to_handle]``; the default is all but the
        last output token, whose KV was never computed. Inserts the page-aligned part (``_insert_finished``; the
        two-tier tree's write-through backs up what reaches its hit threshold), frees the
        duplicates ``row[cache_protected_len : already_cached]`` and the unaligned tail, and drops
        the request's lock. The caller then frees the row (``common.release_kv_cache`` does both).
        Row slices go to the allocator as they are (``free_row``: one index per page).
        """
        origin = as_tokens(req.origin_input_ids)
        n_out = len(req.output_ids)
        total = len(origin) + n_out
        kv_len = max(0, total - 1) if kv_len_to_handle is None else len(range(total)[:kv_len_to_handle])
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx, :kv_len]
        free, view = self._row_freeing(row, req.req_pool_idx)
        view = view[:kv_len]
        protected = req.cache_protected_len
        if self.disable:
            free(view[protected:])
            return
        key_len = align_down(kv_len, self.page_size)
        if is_insert:
            tokens = origin if key_len <= len(origin) else origin + as_tokens(req.output_ids)
            done = self._insert_finished(tokens, key_len, row, getattr(req, "priority", 0) or 0, req)
            free(view[protected:done])
        else:
            free(view[protected:key_len])
        free(view[key_len:])
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
            req.last_node = None


class RadixRequestFlows(RequestFlows):
    """``RadixCache``'s request flows: the shared finished flow and its own unfinished one (a mixin over
    ``RadixCache._insert``, ``restamp_path`` and the locks)."""

    def cache_unfinished_req(self, req: Req, chunked: bool = False) -> None:
        """After a prefill chunk: insert ``fill_ids``' page-aligned KV, free duplicates, re-point the
        row at the tree's slots, and move the request's lock to the new last node
        (``RadixCache.cache_unfinished_req``). ``chunked=True`` counts no hits (0.5.16).

        The re-match replays the walk insert just made (``restamp_path`` from the node ending at the key: the
        same clock tick and access times, and no split is possible); the row is rewritten from the path's values
        over ``[cache_protected_len, key_len)`` only, as SGLang's write does. ``prefix_indices`` becomes the path's
        slots then the partial page's; a request with a ``defer_prefix_indices(runs)`` method (the simulator's
        ``SimReq``) receives those runs instead and concatenates them only if it reads ``prefix_indices``."""
        if self.disable:
            return
        tokens = as_tokens(req.fill_ids)
        n_tok = len(tokens)
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        key_len = align_down(n_tok, self.page_size)
        free, view = self._row_freeing(row, req.req_pool_idx)
        protected = req.cache_protected_len
        done, last_node = self._insert(tokens, key_len, row, getattr(req, "priority", 0) or 0,
                                       key_len if chunked else 0, req.last_node, protected)  # reads row[:key_len]
        free(view[protected:done])
        path = []
        if key_len:  # the re-match walks exactly the path insert just made (no split): replay it upwards
            self.restamp_path(last_node)
            node, root = last_node, self.root_node
            while node is not root:
                path.append(node)
                node = node.parent
            path.reverse()
        found = sum(len(node.key) for node in path)  # (each node's value is as long as its key)
        require(found == key_len, "cache_unfinished_req: the re-match finds every token just inserted",
                found=found, inserted=key_len)
        pos = 0
        # req_to_token[protected:key_len] = new_indices[protected:]; a leaf this insert made holds the row's own
        # slots (copied from it), so rewriting its span changes nothing and is skipped
        for node in path[:-1] if done < key_len else path:
            end = pos + len(node.key)
            if end > protected:
                lo = max(pos, protected)
                self.req_to_token_pool.write((req.req_pool_idx, slice(lo, end)), node.value[lo - pos :])
            pos = end
        req.cache_protected_len = key_len
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(last_node)
        runs = [node.value for node in path]
        # With page_size > 1 the partial last page stays the request's (in the row, not the tree): copied, as the
        # row's later positions change
        if key_len < n_tok:
            tail = view[key_len:n_tok]
            runs.append(torch.from_numpy(tail.astype(np.int64)) if view is not row else tail.to(_I64))
        defer = getattr(req, "defer_prefix_indices", None)
        if defer is not None:  # the request concatenates the runs when (if ever) it reads prefix_indices
            defer(runs)
        else:
            req.prefix_indices = torch.cat(runs) if runs else self._empty
        req.last_node = last_node
