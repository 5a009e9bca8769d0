"""Token-slot allocators: which KV slots are free (``sglang/srt/mem_cache/allocator/``).

Free lists hold SGLang's page ids in SGLang's order (read as int64 tensors; kept as host lists, see
:class:`BaseTokenToKVPoolAllocator`), and the first slot (page) is never handed out::

    slots   0 .. ps-1 | ps .. 2ps-1 | ... | size .. size+ps-1      (size + page_size rows in the pool)
    pages   0 (pad)   | 1           | ... | num_pages
            ^ CUDA-graph padded tokens write here, so it is never free and never allocated

``TokenToKVPoolAllocator`` (page_size 1) appends freed slots to the *tail* of ``free_pages`` and allocates
from the head; ``PagedTokenToKVPoolAllocator`` *prepends* freed pages, so the most recently freed page is
reused first. Both keep SGLang's order exactly (the differential test compares the slots with SGLang's).

Differs on purpose: every allocator also keeps a per-page "free" mask, so a free of an index that is not
allocated (double free, padding slot, out of range) raises :class:`DoubleFreeError` at once instead of
corrupting the free list, ``alloc`` of a non page-aligned count raises instead of silently rounding down,
and ``check_invariants()`` proves free + used == capacity.

The hybrid (sliding-window) allocator, ``allocator/swa.py``, is :mod:`kvlab.mem_cache.swa_allocator`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from kvlab.errors import DoubleFreeError, InvariantError, require
from kvlab.mem_cache.memory_pool import DeviceLike, IndexLike, MHATokenToKVPool, index_device
from kvlab.units import div_ceil, tokens_to_pages

_I64 = torch.int64
_SLOT_TABLE_MAX = 1 << 23  # slots: a pool up to this size keeps a page-to-slots table (64 MiB at most)


def as_index(x: IndexLike, device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        if x.dtype is _I64 and x.device == device:
            return x if x.dim() == 1 else x.reshape(-1)
        return x.to(dtype=_I64, device=device).reshape(-1)
    return torch.as_tensor(list(x), dtype=_I64, device=device).reshape(-1)


def _host(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """A flat integer numpy view of a CPU tensor (a host copy of any other; a numpy array as it is): the free path
    reads its indices with numpy, whose calls cost a fraction of torch's on arrays this small."""
    if isinstance(x, np.ndarray):
        arr = x
    else:
        arr = x.numpy() if x.device.type == "cpu" else x.cpu().numpy()
    if arr.dtype.kind not in "iu":
        arr = arr.astype(np.int64)
    return arr.reshape(-1)


def _sorted_unique(values: np.ndarray) -> list[int]:
    """``torch.unique(values).tolist()`` (ascending, distinct), by a sort: numpy's unique hashes, slower at this size."""
    v = np.sort(values)
    if len(v) > 1:
        v = v[np.concatenate(([True], v[1:] != v[:-1]))]
    return v.tolist()


def as_ints(x: IndexLike) -> list[int]:
    """A host-side list of ints from a tensor or a sequence (the ``*_cpu`` arguments)."""
    if isinstance(x, torch.Tensor):
        return x.reshape(-1).tolist()
    return [int(v) for v in x]


@runtime_checkable
class KVAllocator(Protocol):
    """What a prefix cache and the allocation glue may ask of any token-slot allocator
    (:class:`TokenToKVPoolAllocator`, :class:`PagedTokenToKVPoolAllocator`, :class:`SWATokenToKVPoolAllocator`).

    Slots are token indices; ``page_size`` slots make a page, the unit of allocation and of freeing.
    ``alloc`` returns ``None`` (never a partial answer) when fewer than ``need_size`` slots are free; a free of a
    slot that is not allocated raises ``DoubleFreeError``. Frees inside ``free_group_begin`` / ``free_group_end``
    are staged and released together at the end."""

    page_size: int

    def available_size(self) -> int:
        """Free slots (a whole number of pages)."""
        ...

    def alloc(self, need_size: int) -> torch.Tensor | None: ...

    def free(self, free_index: IndexLike) -> None: ...

    def free_row(self, row_slots: torch.Tensor) -> None:
        """Free a slice of a request's row (int32 slots; page-aligned starts)."""
        ...

    def free_segment(self, free_index: IndexLike, *, start_pos: int) -> None:
        """Free the slots of row positions ``[start_pos, start_pos + len)`` (a partly held first page is kept)."""
        ...

    def free_group_begin(self) -> None: ...

    def free_group_end(self) -> None: ...

    def is_allocated(self, indices: IndexLike) -> torch.Tensor: ...

    def all_allocated(self, indices: torch.Tensor) -> bool: ...

    def get_kvcache(self) -> MHATokenToKVPool | None: ...

    def clear(self) -> None: ...

    def check_invariants(self) -> None: ...


class BaseTokenToKVPoolAllocator(abc.ABC):  # noqa: B024 (never instantiated; upstream is an ABC too)
    """State and free-path shared by the page-1 and the paged allocator (``allocator/base.py``).

    ``size`` is in tokens; with ``page_size > 1`` it must be a whole number of pages (SGLang's configurator
    always floors it to pages; here a misfit raises ``ValueError``). ``need_sort`` stages frees in
    ``release_pages`` and sorts them in when an alloc runs short (PD mode). ``device`` places the index
    tensors handed out (see ``memory_pool.index_device``).

    Differs on purpose in representation only: SGLang's free list is an int64 tensor that every free rebuilds
    with ``torch.cat``; here the page ids live in a host list (head last, so a take from the head and a free
    to the head are slices at the end) and the masks in bytearrays, and ``free_pages`` / ``release_pages``
    are read (and, for tests that corrupt them, written) as tensors in SGLang's order. The ids and their order
    are SGLang's; what a simulated step costs is a few list operations rather than a tensor rebuild."""

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, device: DeviceLike,
                 kvcache: MHATokenToKVPool | None, need_sort: bool):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if size < page_size or size % page_size:
            raise ValueError(
                f"size {size} tokens does not fit page_size {page_size}: the pool must hold a whole, "
                f"non-zero number of pages (e.g. {max(page_size, size // page_size * page_size)})"
            )
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.dtype = dtype
        self.device = device
        self._index_device = index_device(device)
        self._kvcache = kvcache
        self.need_sort = need_sort
        self.clear()

    # -- state ---------------------------------------------------------------------------------
    def clear(self) -> None:
        n = self.num_pages
        self._stack: list[int] = list(range(n, 0, -1))  # the free list, head last: pages 1..n from the head
        self._staged: list[int] = []  # release_pages (need_sort), in release order
        self.free_group: list[list[int]] | None = None  # None: frees take effect at once
        self.free_page_ids_group: list[list[int]] = []
        self._pending_open = False
        # Page-granular bookkeeping kvlab adds: index 0 (padding) is neither free nor allocated. The bytearrays
        # are read by the free path; the tensors are views of the same bytes (the invariant checks read them).
        self._free_mask = bytearray(b"\x01") * (n + 1)
        self._free_mask[0] = 0
        self._pending_mask = bytearray(n + 1)
        self._page_free = torch.frombuffer(self._free_mask, dtype=torch.bool)
        self._page_pending = torch.frombuffer(self._pending_mask, dtype=torch.bool)
        self._slot_table: np.ndarray | None = None  # row p: the slots of page p (see _page_slots)

    def __getstate__(self) -> dict:  # pickle / deepcopy: the tensor views are rebuilt over the copied bytearrays
        state = self.__dict__.copy()
        del state["_page_free"], state["_page_pending"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._page_free = torch.frombuffer(self._free_mask, dtype=torch.bool)
        self._page_pending = torch.frombuffer(self._pending_mask, dtype=torch.bool)

    @property
    def free_pages(self) -> torch.Tensor:
        """SGLang's free list (int64 tensor, head first), built from the host list on each read."""
        return torch.tensor(self._stack[::-1], dtype=_I64, device=self._index_device)

    @free_pages.setter
    def free_pages(self, pages: torch.Tensor) -> None:
        self._stack = as_ints(pages)[::-1]

    @property
    def release_pages(self) -> torch.Tensor:
        """Frees staged by ``need_sort`` (int64 tensor, in release order)."""
        return torch.tensor(self._staged, dtype=_I64, device=self._index_device)

    @release_pages.setter
    def release_pages(self, pages: torch.Tensor) -> None:
        self._staged = as_ints(pages)

    def free_list_pages(self) -> int:
        """Pages on the free list proper (``len(free_pages)``; staged ``release_pages`` not counted)."""
        return len(self._stack)

    def available_size(self) -> int:
        """Free tokens: ``(len(free_pages) + len(release_pages)) * page_size``."""
        return (len(self._stack) + len(self._staged)) * self.page_size

    def used_size(self) -> int:
        """Tokens handed out and not yet freed (pending frees of an open group count as used)."""
        return self.size - self.available_size()

    def get_kvcache(self) -> MHATokenToKVPool | None:
        return self._kvcache

    def is_allocated(self, indices: IndexLike) -> torch.Tensor:
        """Per slot index: is its page currently handed out? (Padding and out-of-range: False.)"""
        idx = as_index(indices, torch.device("cpu"))
        pages = idx // self.page_size
        ok = (pages >= 1) & (pages <= self.num_pages)
        out = torch.zeros_like(ok)
        out[ok] = ~self._page_free[pages[ok]]
        return out.to(self._index_device)

    def all_allocated(self, indices: torch.Tensor) -> bool:
        """``is_allocated(indices).all()``, cheaper (invariant checks call it after every op)."""
        if indices.numel() == 0:
            return True
        pages = indices.cpu() // self.page_size
        if int(pages.min()) < 1 or int(pages.max()) > self.num_pages:
            return False
        return not bool(self._page_free[pages].any())

    # -- alloc ---------------------------------------------------------------------------------
    def merge_and_sort_free(self) -> None:
        if self._staged:
            self._stack = sorted(self._stack + self._staged, reverse=True)
            self._staged = []

    def _take_page_ids(self, num_pages: int) -> list[int] | None:
        """``num_pages`` page ids from the head of the free list (merging staged frees when short), or None."""
        stack = self._stack
        if num_pages > len(stack):
            self.merge_and_sort_free()
            stack = self._stack
            if num_pages > len(stack):
                return None
        if num_pages == 0:
            return []
        pages = stack[-num_pages:]
        del stack[-num_pages:]
        pages.reverse()
        mask = self._free_mask
        for p in pages:
            mask[p] = 0
        return pages

    def _page_slots(self, pages: list[int]) -> np.ndarray:
        """Every slot of ``pages``, page by page (a new int64 array). Pools up to ``_SLOT_TABLE_MAX`` slots read the
        rows of a page-to-slots table (one gather, built on first use), larger ones compute them."""
        ps = self.page_size
        if ps == 1:
            return np.array(pages, dtype=np.int64)
        table = self._slot_table
        if table is None:
            if (self.num_pages + 1) * ps > _SLOT_TABLE_MAX:
                return (np.array(pages, dtype=np.int64)[:, None] * ps + np.arange(ps, dtype=np.int64)).reshape(-1)
            table = self._slot_table = np.arange((self.num_pages + 1) * ps, dtype=np.int64).reshape(-1, ps)
        return table[pages].reshape(-1)

    def _index_tensor(self, arr: np.ndarray) -> torch.Tensor:
        """An int64 index tensor on the index device (sharing ``arr``'s memory on the CPU)."""
        out = torch.from_numpy(arr)
        return out if self._index_device.type == "cpu" else out.to(self._index_device)

    def _pages_to_tokens(self, pages: list[int]) -> torch.Tensor:
        return self._index_tensor(self._page_slots(pages))

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slot indices (whole pages), or None if fewer are free. Takes from the head."""
        if need_size < 0 or need_size % self.page_size:
            raise ValueError(f"alloc({need_size}): need a non-negative multiple of page_size {self.page_size}")
        pages = self._take_page_ids(need_size // self.page_size)
        return None if pages is None else self._pages_to_tokens(pages)

    def alloc_extend(self, *args, **kwargs):
        raise NotImplementedError("alloc_extend is only for the paged allocator (page_size > 1); use alloc(n)")

    def alloc_decode(self, *args, **kwargs):
        raise NotImplementedError("alloc_decode is only for the paged allocator (page_size > 1); use alloc(n)")

    # -- free ----------------------------------------------------------------------------------
    def _check_releasable(self, pages: list[int], what: str, distinct: bool = False) -> None:
        """Raise :class:`DoubleFreeError` naming the first page (in ``pages`` order) that is padding, out of
        range, already free or already queued in the open free group, or a page named twice."""
        if not pages:
            return
        n_pages, free = self.num_pages, self._free_mask
        if min(pages) >= 1 and max(pages) <= n_pages:
            if not any(free[p] for p in pages):
                if not (self._pending_open and any(self._pending_mask[p] for p in pages)):
                    if distinct or len(pages) == 1 or len(set(pages)) == len(pages):
                        return
                    raise DoubleFreeError(f"{what}: the same {'slot' if self.page_size == 1 else 'page'} "
                                          "appears twice in one free")
        for p in pages:
            if p < 1 or p > n_pages:
                raise DoubleFreeError(
                    f"{what}: page {p} is {'the padding page' if p == 0 else 'out of range'} "
                    f"(pages 1..{n_pages} are allocatable)"
                )
        for p in pages:
            if free[p] or (self._pending_open and self._pending_mask[p]):
                why = "already free" if free[p] else "already queued in the open free group"
                raise DoubleFreeError(
                    f"{what}: double free of {'slot' if self.page_size == 1 else 'page'} {p} ({why})")

    def _release(self, pages: list[int], pile: list | None, what: str, distinct: bool = False) -> None:
        """Return allocated ``pages`` (``distinct``: known to be) to the free list, or queue them on ``pile``."""
        self._check_releasable(pages, what, distinct)
        if self.free_group is not None:
            pending = self._pending_mask
            for p in pages:
                pending[p] = 1
            pile.append(list(pages))
            return
        free = self._free_mask
        for p in pages:
            free[p] = 1
        if self.need_sort:
            self._staged.extend(pages)
        elif self.page_size == 1:
            self._stack[0:0] = pages[::-1]  # tail: FIFO-ish reuse
        else:
            self._stack.extend(reversed(pages))  # head: LIFO reuse

    def free(self, free_index: IndexLike) -> None:
        """Free slot indices; with ``page_size > 1`` any index inside a page frees the whole page."""
        ps = self.page_size
        if isinstance(free_index, (torch.Tensor, np.ndarray)):
            if free_index.size == 0 if isinstance(free_index, np.ndarray) else free_index.numel() == 0:
                return
            slots = _host(free_index)
            pages = slots.tolist() if ps == 1 else _sorted_unique(slots // ps)
        else:
            listed = [int(v) for v in free_index]
            if not listed:
                return
            pages = listed if ps == 1 else sorted({s // ps for s in listed})
        self._release(pages, self.free_group, "free")

    def free_row(self, row_slots: torch.Tensor | np.ndarray) -> None:
        """:meth:`free` of a row segment starting at a page-aligned position (the tree's request flows): each
        run of ``page_size`` holds one page's slots in order, so the pages are ``row_slots[::page_size] //
        page_size`` (same pages, same order); runs whose ends do not sit at page bounds go through free.
        ``row_slots`` may be a numpy view of the row (``ReqToTokenPool.rows``)."""
        if (n := row_slots.size if isinstance(row_slots, np.ndarray) else row_slots.numel()) == 0:
            return
        ps = self.page_size
        if ps == 1:
            return self.free(row_slots)
        slots = _host(row_slots)
        heads, tails = slots[::ps].tolist(), slots[ps - 1 :: ps].tolist()
        if (int(slots[-1]) - heads[-1] != (n - 1) % ps or any(h % ps for h in heads)
                or tails != [h + ps - 1 for h in heads[: len(tails)]]):
            return self.free(row_slots)  # not laid out as a row
        self._release(sorted({h // ps for h in heads}), self.free_group, "free", distinct=True)

    def free_segment(self, free_index: IndexLike, *, start_pos: int) -> None:
        """Free ``kv_row[start_pos : start_pos + n]`` (page-aligned start, contiguous pages): 0.5.23's free for tree
        values and rows; ``free_index[::page_size]`` names each page once, in row order (no sort, unlike free)."""
        ps = self.page_size
        if start_pos % ps:
            raise ValueError(f"segment start {start_pos} is not page-aligned (page_size {ps})")
        if isinstance(free_index, torch.Tensor):
            heads = _host(free_index)[::ps].tolist()
        else:
            heads = [int(v) for v in list(free_index)[::ps]]
        if not heads:
            return
        if ps == 1:
            self._release(heads, self.free_group, "free_segment")
        else:  # free_page_ids of the segment's pages
            self._release([h // ps for h in heads], self.free_page_ids_group, "free_page_ids")

    def free_page_ids(self, page_ids: IndexLike) -> None:
        """Free exactly these pages (no dedup)."""
        pages = as_ints(page_ids)
        if not pages:
            return
        pile = self.free_group if self.page_size == 1 else self.free_page_ids_group
        self._release(pages, pile, "free_page_ids")

    def free_group_begin(self) -> None:
        """Defer frees until :meth:`free_group_end` (one batch's results as a group; not in available_size)."""
        if self.free_group is not None:
            raise RuntimeError("free groups cannot be nested")
        self.free_group = []
        self.free_page_ids_group = []
        self._pending_open = True

    def free_group_end(self) -> None:
        if self.free_group is None:
            raise RuntimeError("free_group_end() without free_group_begin()")
        piles = [self.free_group, self.free_page_ids_group]
        self.free_group, self.free_page_ids_group = None, []
        pending = self._pending_mask
        for i, pile in enumerate(piles):
            if not pile:
                continue
            pages = [p for part in pile for p in part]
            if self.page_size > 1 and i == 0:
                pages = sorted(set(pages))  # SGLang re-frees the group's tokens through free() (torch.unique)
            for p in pages:
                pending[p] = 0
            self._release(pages, None, "free_group_end")
        self._pending_open = False

    # -- invariants ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        name = type(self).__name__
        listed = torch.tensor(self._stack[::-1] + self._staged, dtype=_I64)
        n_free = len(listed)
        if n_free:
            distinct = torch.unique(listed)
            if len(distinct) != n_free:
                raise InvariantError(f"{name}: no page is on the free list twice", listed=n_free,
                                     distinct=len(distinct))
            lo, hi = int(listed.min()), int(listed.max())
            require(lo >= 1 and hi <= self.num_pages, f"{name}: the free list holds pages 1..num_pages only "
                    "(never the padding page 0)", min_page=lo, max_page=hi, num_pages=self.num_pages)
            taken = listed[~self._page_free[listed]]
            if len(taken):
                raise InvariantError(f"{name}: every page on the free list is marked free", pages=taken.tolist())
        marked = int(self._page_free.sum())
        require(marked == n_free, f"{name}: pages marked free == pages listed free", marked=marked, listed=n_free)
        require(not bool(self._page_free[0]) and not bool(self._page_pending[0]),
                f"{name}: the padding page is never free or pending", free=bool(self._page_free[0]),
                pending=bool(self._page_pending[0]))
        both = torch.nonzero(self._page_free & self._page_pending).reshape(-1)
        if len(both):
            raise InvariantError(f"{name}: no page is both free and pending in a free group", pages=both.tolist())
        if self.free_group is None:
            pending = torch.nonzero(self._page_pending).reshape(-1)
            if len(pending):
                raise InvariantError(f"{name}: pages are pending only inside an open free group",
                                     pages=pending.tolist())
        used_pages = self.num_pages - n_free
        require(used_pages >= 0 and (used_pages + n_free) * self.page_size == self.size,
                f"{name}: used + free pages == num_pages", used_pages=used_pages, free_pages=n_free,
                num_pages=self.num_pages, page_size=self.page_size, size=self.size)
        available, used = self.available_size(), self.used_size()
        require(available + used == self.size, f"{name}: available + used == size", available=available, used=used,
                size=self.size)


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """page_size 1 (``allocator/token.py``): slots 1..size are allocatable, slot 0 is padding."""

    def __init__(self, size: int, dtype: torch.dtype = torch.bfloat16, device: DeviceLike = "cpu",
                 kvcache: MHATokenToKVPool | None = None, need_sort: bool = False):
        super().__init__(size, 1, dtype, device, kvcache, need_sort)

    def free_page_ids(self, page_ids: IndexLike) -> None:
        self.free(page_ids)  # page ids are slot ids


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Whole pages (``allocator/paged.py``): pages 1..size/page_size, page 0 is padding. ``alloc_extend`` /
    ``alloc_decode`` follow SGLang's three-phase layout (continue the current partial page at ``last_loc + 1``,
    then whole new pages, then one partial new page), with plain torch ops in place of the Triton kernel."""

    def __init__(self, size: int, page_size: int, dtype: torch.dtype = torch.bfloat16, device: DeviceLike = "cpu",
                 kvcache: MHATokenToKVPool | None = None, need_sort: bool = False):
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)

    def num_new_pages(self, prefix_lens: Sequence[int], seq_lens: Sequence[int]) -> int:
        """``utils.common.get_num_new_pages``: sum of ceil(seq/ps) - ceil(prefix/ps)."""
        ps = self.page_size
        return sum(tokens_to_pages(s, ps) - tokens_to_pages(p, ps) for p, s in zip(prefix_lens, seq_lens))

    def num_decode_pages(self, seq_lens: Sequence[int]) -> int:
        """Decode's ``get_num_new_pages``: requests whose new token opens a page (seq % ps == 1)."""
        return sum(s % self.page_size == 1 for s in seq_lens)

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                     extend_num_tokens: int, num_new_pages: int | None = None) -> torch.Tensor | None:
        """Slots for tokens ``[prefix_len, seq_len)`` of each request, concatenated in batch order. ``last_loc[i]``
        is the slot of request i's last prefix token (-1 if none). None if the free pages do not cover
        ``num_new_pages``. Mirrors ``PagedTokenToKVPoolAllocator.alloc_extend``."""
        ps = self.page_size
        pre, seq, last = as_ints(prefix_lens_cpu), as_ints(seq_lens_cpu), as_ints(last_loc)
        if sum(s - p for p, s in zip(pre, seq)) != extend_num_tokens:
            raise ValueError(f"extend_num_tokens {extend_num_tokens} != sum(seq_lens - prefix_lens)")
        for p, loc in zip(pre, last):
            if (loc + 1) % ps != p % ps:
                raise ValueError(f"last_loc {loc} is not where a prefix of {p} tokens ends (page_size {ps})")
        if num_new_pages is None:
            num_new_pages = self.num_new_pages(pre, seq)
        if extend_num_tokens // ps + len(pre) + 1 > len(self._stack):
            self.merge_and_sort_free()  # 0.5.23 merges when its cheap bound cannot prove the fit
        pages = self._take_page_ids(num_new_pages)
        if pages is None:
            return None
        slots = self._page_slots(pages)  # every new page's slots, in take order
        out: list[np.ndarray] = []
        k = 0  # new slots used so far, in batch order (whole pages)
        for p, s, loc in zip(pre, seq, last):
            cont = min(s, div_ceil(p, ps) * ps)  # phase 1: finish the page the prefix ends in
            if cont > p:
                out.append(np.arange(loc + 1, loc + 1 + cont - p, dtype=np.int64))
            n = s - cont  # phases 2 + 3: whole new pages, then a partial one (cont is page-aligned)
            if n > 0:
                out.append(slots[k : k + n])
                k += tokens_to_pages(n, ps) * ps
        if not out:
            return torch.empty(0, dtype=_I64, device=self._index_device)
        return self._index_tensor(out[0] if len(out) == 1 else np.concatenate(out))

    def alloc_decode_page_ids(self, batch_size: int, num_pages: int) -> list[int] | None:
        """The page take of :meth:`alloc_decode`, by count: ``num_pages`` page ids from the head of the free
        list (the requests whose new token opens a page, in batch order), or None if fewer are free.

        Staged frees are merged first when ``batch_size`` outnumbers the free pages (0.5.23's bound: every request
        may open a page). A decode round that knows its openers calls this; :meth:`alloc_decode` makes slots."""
        if batch_size < 0 or num_pages < 0 or num_pages > batch_size:
            raise ValueError(f"alloc_decode_pages(batch_size={batch_size}, num_pages={num_pages}): "
                             "need 0 <= num_pages <= batch_size")
        if batch_size > len(self._stack):
            self.merge_and_sort_free()
        return self._take_page_ids(num_pages)

    def alloc_decode_pages(self, batch_size: int, num_pages: int) -> torch.Tensor | None:
        """:meth:`alloc_decode_page_ids` as an int64 tensor (SGLang's type)."""
        pages = self.alloc_decode_page_ids(batch_size, num_pages)
        return None if pages is None else torch.tensor(pages, dtype=_I64, device=self._index_device)

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc) -> torch.Tensor | None:
        """One slot per request for its token at position ``seq_len - 1`` (``seq_lens`` = new lengths): a request
        whose new token opens a page (``seq_len % page_size == 1``) gets the next free page's first slot, the
        others ``last_loc + 1``. None if pages run short."""
        ps = self.page_size
        seq, last = as_ints(seq_lens_cpu), as_ints(last_loc)
        need = [s % ps == 1 for s in seq]
        pages = self.alloc_decode_page_ids(len(seq), self.num_decode_pages(seq))
        if pages is None:
            return None
        it = iter(pages)
        out = [next(it) * ps if n else loc + 1 for n, loc in zip(need, last)]
        return torch.tensor(out, dtype=_I64, device=self._index_device)
