"""The hybrid sliding-window allocator: a full-attention pool and an SWA pool, paired slot by slot
(``sglang/srt/mem_cache/allocator/swa.py::SWATokenToKVPoolAllocator``).

Each side is a :mod:`kvlab.mem_cache.allocator` pool (``TokenToKVPoolAllocator`` at page size 1, else
``PagedTokenToKVPoolAllocator``); see :class:`SWATokenToKVPoolAllocator` for what differs on purpose.
"""

from __future__ import annotations

import torch

from kvlab.errors import DoubleFreeError, InvariantError, require
from kvlab.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator, as_index, as_ints
from kvlab.mem_cache.memory_pool import DeviceLike, IndexLike, MHATokenToKVPool

_I64 = torch.int64


class SWATokenToKVPoolAllocator:
    """Hybrid sliding-window models: a full-attention pool and an SWA pool (``allocator/swa.py``).

    Requests and the tree hold *full* indices; ``full_to_swa_index_mapping[full] = swa`` pairs each with its
    SWA slot (0 = unmapped; the trailing entry is -1 so a ``last_loc`` of -1 translates to -1).
    ``available_size()`` is the smaller side. ``free`` releases the SWA peer first (it reads the mapping), then
    the full slot; ``free_swa`` alone drops only the SWA KV (sliding-window tombstoning). Differs on purpose:
    no per-request SWA ring, no registration with a KV pool unless ``kvcache`` has ``register_mapping``;
    ``alloc`` works at any page size."""

    def __init__(self, size: int, size_swa: int, page_size: int, dtype: torch.dtype = torch.bfloat16,
                 device: DeviceLike = "cpu", kvcache: MHATokenToKVPool | None = None, need_sort: bool = False):
        inner = TokenToKVPoolAllocator if page_size == 1 else PagedTokenToKVPoolAllocator
        args = () if page_size == 1 else (page_size,)
        self.full_attn_allocator = inner(size, *args, dtype=dtype, device=device, need_sort=need_sort)
        self.swa_attn_allocator = inner(size_swa, *args, dtype=dtype, device=device, need_sort=need_sort)
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.need_sort = need_sort
        self.size_full, self.size_swa = size, size_swa  # each side's slots, as an allocator's size
        self._kvcache = kvcache
        self._index_device = self.full_attn_allocator._index_device
        self.full_to_swa_index_mapping = torch.cat(
            [torch.zeros(size + page_size, dtype=_I64, device=self._index_device),
             torch.tensor([-1], dtype=_I64, device=self._index_device)]
        )
        self.clear()
        if kvcache is not None and hasattr(kvcache, "register_mapping"):
            kvcache.register_mapping(self.full_to_swa_index_mapping)

    @property
    def size(self) -> int:
        return min(self.size_full, self.size_swa)

    def clear(self) -> None:
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping[:-1] = 0
        self.free_group: list | None = None

    def get_kvcache(self) -> MHATokenToKVPool | None:
        return self._kvcache

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def is_allocated(self, indices: IndexLike) -> torch.Tensor:
        return self.full_attn_allocator.is_allocated(indices)

    def all_allocated(self, indices: torch.Tensor) -> bool:
        return self.full_attn_allocator.all_allocated(indices)

    def translate_loc_from_full_to_swa(self, kv_indices: IndexLike) -> torch.Tensor:
        return self.full_to_swa_index_mapping[as_index(kv_indices, self._index_device)]

    def _pair(self, full: torch.Tensor | None, swa: torch.Tensor | None) -> torch.Tensor | None:
        if full is None or swa is None:
            raise InvariantError("SWA allocator: both sides allocate once both were checked to have room",
                                 full_allocated=full is not None, swa_allocated=swa is not None)
        self.full_to_swa_index_mapping[full] = swa
        return full

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > self.full_available_size() or need_size > self.swa_available_size():
            return None
        return self._pair(self.full_attn_allocator.alloc(need_size), self.swa_attn_allocator.alloc(need_size))

    def new_pages_available(self, num_pages: int) -> bool:
        """Both sides page in step (one seq_lens drives them), so both need ``num_pages``."""
        ps = self.page_size
        return num_pages <= self.full_available_size() // ps and num_pages <= self.swa_available_size() // ps

    def _require_paged(self, what: str) -> None:
        if self.page_size == 1:
            raise NotImplementedError(f"{what} is only for page_size > 1 (as in SGLang); use alloc(n)")

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens):
        self._require_paged("alloc_extend")
        full_alloc = self.full_attn_allocator
        pre, seq = as_ints(prefix_lens_cpu), as_ints(seq_lens_cpu)
        n = full_alloc.num_new_pages(pre, seq)
        if not self.new_pages_available(n):
            return None
        swa_last = self.translate_loc_from_full_to_swa(last_loc)
        full = full_alloc.alloc_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                                       extend_num_tokens, num_new_pages=n)
        swa = self.swa_attn_allocator.alloc_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu,
                                                   swa_last, extend_num_tokens, num_new_pages=n)
        return self._pair(full, swa)

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        self._require_paged("alloc_decode")
        seq = as_ints(seq_lens_cpu)
        if not self.new_pages_available(self.full_attn_allocator.num_decode_pages(seq)):
            return None
        swa_last = self.translate_loc_from_full_to_swa(last_loc)
        full = self.full_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, last_loc)
        swa = self.swa_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, swa_last)
        return self._pair(full, swa)

    def _expand_to_pages(self, idx: torch.Tensor) -> torch.Tensor:
        ps = self.page_size
        if ps == 1:
            return idx
        pages = torch.unique(idx // ps)
        return (pages[:, None] * ps + torch.arange(ps, dtype=_I64, device=idx.device)).reshape(-1)

    def free_swa(self, free_index: IndexLike) -> None:
        """Release the SWA peers of these full slots (whole pages when paged); keep the full KV."""
        idx = as_index(free_index, self._index_device)
        if idx.numel() == 0:
            return
        full_slots = self._expand_to_pages(idx)
        swa = self.full_to_swa_index_mapping[full_slots]
        if self.page_size == 1 and bool((swa <= 0).any()):
            raise DoubleFreeError(f"free_swa: full slot {int(full_slots[swa <= 0][0])} has no SWA peer")
        self.full_to_swa_index_mapping[full_slots] = 0
        self.swa_attn_allocator.free(swa[swa > 0])

    def free_full(self, free_index: IndexLike) -> None:
        """Free full slots whose SWA peers are already released."""
        idx = as_index(free_index, self._index_device)
        if idx.numel() == 0:
            return
        if bool((self.full_to_swa_index_mapping[idx] != 0).any()):
            raise ValueError("free_full: a slot still has an SWA peer; use free() to release both")
        self.full_attn_allocator.free(idx)

    def free(self, free_index: IndexLike) -> None:
        self.free_swa(free_index)  # first: it reads the mapping
        self.free_full(free_index)

    def free_row(self, row_slots: torch.Tensor) -> None:
        """The tree's row free: both pools through :meth:`free` (the page-granular shortcut of the base class
        does not apply: a SWA free also reads and clears the full-to-SWA mapping)."""
        self.free(row_slots)

    def free_segment(self, free_index: IndexLike, *, start_pos: int) -> None:
        if start_pos % self.page_size:
            raise ValueError(f"segment start {start_pos} is not page-aligned (page_size {self.page_size})")
        self.free(free_index)

    def free_group_begin(self) -> None:
        if self.free_group is not None:
            raise RuntimeError("free groups cannot be nested")
        self.free_group = []
        self.full_attn_allocator.free_group_begin()
        self.swa_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        if self.free_group is None:
            raise RuntimeError("free_group_end() without free_group_begin()")
        self.free_group = None
        self.swa_attn_allocator.free_group_end()
        self.full_attn_allocator.free_group_end()

    def check_invariants(self) -> None:
        self.full_attn_allocator.check_invariants()
        self.swa_attn_allocator.check_invariants()
        m = self.full_to_swa_index_mapping
        if int(m[-1]) != -1 or bool((m[: self.page_size] != 0).any()):
            raise InvariantError("SWA allocator: the mapping's padding entries keep their values (0 for the padding "
                                 "page, -1 at the end)", padding=m[: self.page_size].tolist(), last=int(m[-1]))
        mapped = torch.nonzero(m[:-1] > 0).reshape(-1)
        if len(mapped):
            stale = mapped[~self.full_attn_allocator.is_allocated(mapped)]
            if len(stale):
                raise InvariantError("SWA allocator: only allocated full slots map to an SWA slot",
                                     free_full_slots=stale.tolist(), swa_slots=m[stale].tolist())
        swa = m[mapped]
        n_distinct = len(torch.unique(swa))
        require(n_distinct == len(swa), "SWA allocator: no two full slots share one SWA slot", mapped=len(swa),
                distinct_swa_slots=n_distinct)
        if len(swa):
            freed = swa[~self.swa_attn_allocator.is_allocated(swa)]
            if len(freed):
                raise InvariantError("SWA allocator: every mapped SWA slot is allocated", free_swa_slots=freed.tolist())
        if self.free_group is None:
            swa_used = self.swa_attn_allocator.used_size()
            paged_swa = len(torch.unique(swa // self.page_size)) * self.page_size if len(swa) else 0
            require(paged_swa == swa_used, "SWA allocator: every used SWA slot's page is reachable from the mapping",
                    swa_used=swa_used, reachable=paged_swa)
