"""Where KV lives: request rows (``ReqToTokenPool``) and per-layer K/V buffers (``MHATokenToKVPool``).

Mirrors ``sglang/srt/mem_cache/memory_pool.py`` (0.5.16 / 0.5.23)::

    req_to_token  [size+1, max_context_len] int32     row r, column p = KV slot of token p of the
                  row 0 = padding (CUDA-graph padded   request in row r
                  batches index it)
    k_buffer[l]   [size+page_size, head_num, head_dim]      slot s = one token's K for layer l
    v_buffer[l]   [size+page_size, head_num, v_head_dim]    page 0 (slots 0..page_size-1) = padding

The allocator (``allocator.py``) hands out slot indices into these buffers; this module only owns
the storage. The errors every pool, allocator and cache raises live in ``kvlab.errors``
(re-exported here under their old import path).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Protocol

import torch

from kvlab.errors import DoubleFreeError, InvariantError, require
from kvlab.mem_cache.options import PoolTooLargeError  # noqa: F401  (raised here; defined without torch)
from kvlab.units import GiB

__all__ = ["InvariantError", "DoubleFreeError", "ReqToTokenPool", "MHATokenToKVPool", "allocate_tensor", "index_device",
           "DeviceLike", "IndexLike", "RowHolder", "TensorFactory"]


class TensorFactory(Protocol):
    """A simulated GPU (``kvlab.device``): it accounts the bytes of the tensors it hands out."""

    def empty(self, shape: tuple[int, ...], *, dtype: torch.dtype, label: str) -> torch.Tensor: ...


class RowHolder(Protocol):
    """Anything that holds a request row (``request_flows.Req``, the scheduler's requests)."""

    req_pool_idx: int | None


DeviceLike = str | torch.device | TensorFactory  # where pools put their tensors
IndexLike = int | Sequence[int] | torch.Tensor  # slot / page / row indices, as callers pass them


def allocate_tensor(device: DeviceLike, shape: Sequence[int], dtype: torch.dtype, label: str) -> torch.Tensor:
    """``torch.empty`` on ``device``, or ``device.empty(shape, dtype=, label=)`` for a device object.

    kvlab's simulated GPUs pass themselves as ``device``: they account the bytes and return a real
    torch tensor (CPU storage when small, ``meta`` at model scale). A ``"meta"`` device costs no
    memory at all, which is how pools at model scale are built in tests.
    """
    if not isinstance(device, (str, torch.device)) and hasattr(device, "empty"):
        return device.empty(tuple(shape), dtype=dtype, label=label)
    if str(device) == "cpu":
        _check_fits(shape, dtype, label)
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def _check_fits(shape: Sequence[int], dtype: torch.dtype, label: str) -> None:
    total_bytes = math.prod(int(n) for n in shape) * torch.empty((), dtype=dtype).element_size()
    if total_bytes < GiB:
        return
    free_bytes = _available_bytes()
    if total_bytes > free_bytes // 2:  # half of what is free: the run needs room besides this table
        rows = " × ".join(f"{int(n):,}" for n in shape)
        raise PoolTooLargeError(f"the simulator's {label} table would take {rows} {dtype} = {total_bytes / GiB:,.1f} "
                                f"GiB, more than half of the {free_bytes / GiB:,.1f} GiB this machine has free (for "
                                f"req_to_token: rows = max running requests + 2, columns = the longest request's "
                                f"tokens, prompt + output): lower --max-running or the longest request")


def _available_bytes() -> int:
    """MemAvailable (Linux), else the physical memory; at most the process's address-space limit."""
    import resource

    found = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            found = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), found)
    except (OSError, ValueError, IndexError):
        pass
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return found if limit == resource.RLIM_INFINITY else min(found, limit)


def index_device(device: DeviceLike) -> torch.device:
    """The device for index bookkeeping (free lists, request rows' slot ids).

    Same rule as SGLang's ``RadixCache.__init__``: a str / torch.device is used as is, anything
    else (a simulated GPU object) keeps indices on the CPU. ``meta`` indices could not be read
    back, so ``meta`` also maps to the CPU.
    """
    if isinstance(device, (str, torch.device)):
        dev = torch.device(device)
        return torch.device("cpu") if dev.type == "meta" else dev
    return torch.device("cpu")


class ReqToTokenPool:
    """Request rows: ``req_to_token[row, pos]`` is the KV slot of token ``pos`` of that request.

    Mirrors ``memory_pool.py::ReqToTokenPool``. Row 0 is padding; rows ``1..size`` are handed out.
    ``alloc`` takes rows from the *tail* of ``free_slots`` as 0.5.23 does (0.5.16 took the head);
    ``free`` appends. Differs on purpose: freeing a row that is not allocated raises
    :class:`DoubleFreeError` (SGLang would silently hand the row out twice).

    ``alloc(reqs)`` binds rows to request objects (anything with a ``req_pool_idx`` attribute,
    see ``request_flows.Req``); ``alloc_rows(n)`` / ``free_rows(rows)`` work on bare row ids.
    """

    def __init__(
        self, size: int, max_context_len: int, device: DeviceLike = "cpu", enable_memory_saver: bool = False
    ):
        if size < 1 or max_context_len < 1:
            raise ValueError(f"ReqToTokenPool needs size >= 1 and max_context_len >= 1, got {size}, {max_context_len}")
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = allocate_tensor(device, (size + 1, max_context_len), torch.int32, "req_to_token")
        if self.req_to_token.device.type != "meta":
            self.req_to_token.zero_()
        # the same rows as a numpy view (same memory) on the CPU, else None: the request flows hand row slices to
        # the allocator's free through it, a fraction of a torch slice's cost each
        self.rows = self.req_to_token.numpy() if self.req_to_token.device.type == "cpu" else None
        self.req_generation = [0] * (size + 1)
        self.clear()

    def clear(self) -> None:
        self.free_slots = list(range(1, self.size + 1))
        self._allocated = [False] * (self.size + 1)

    def available_size(self) -> int:
        return len(self.free_slots)

    def write(self, indices, values) -> None:
        self.req_to_token[indices] = values

    def alloc_rows(self, need_size: int) -> list[int] | None:
        if need_size > len(self.free_slots):
            return None
        if need_size == 0:
            return []
        rows = self.free_slots[-need_size:]
        del self.free_slots[-need_size:]
        for r in rows:
            self._allocated[r] = True
            self.req_generation[r] += 1
        return rows

    def alloc(self, reqs: Sequence[RowHolder]) -> list[int] | None:
        """Give each request without a row a row; requests that hold one keep it (chunked prefill)."""
        new = [r for r in reqs if r.req_pool_idx is None]
        rows = self.alloc_rows(len(new))
        if rows is None:
            return None
        for r, row in zip(new, rows):
            r.req_pool_idx = row
        return [r.req_pool_idx for r in reqs]

    def free_rows(self, rows: Sequence[int]) -> None:
        for r in rows:
            if not (1 <= r <= self.size) or not self._allocated[r]:
                raise DoubleFreeError(f"request row {r} is not allocated (freed twice, or never allocated)")
            self._allocated[r] = False
        self.free_slots.extend(rows)

    def free(self, req: RowHolder) -> None:
        if req.req_pool_idx is None:
            raise DoubleFreeError(f"request {getattr(req, 'rid', req)!r} holds no row")
        self.free_rows([req.req_pool_idx])
        req.req_pool_idx = None

    def check_invariants(self) -> None:
        free = self.free_slots
        require(len(set(free)) == len(free), "ReqToTokenPool: no row is in free_slots twice", free_slots=len(free),
                distinct=len(set(free)))
        bad = [r for r in free if not (1 <= r <= self.size)]
        require(not bad, "ReqToTokenPool: free_slots holds rows 1..size only (never the padding row 0)", rows=bad,
                size=self.size)
        both = [r for r in free if self._allocated[r]]
        require(not both, "ReqToTokenPool: no row is both free and allocated", rows=both)
        used = sum(self._allocated)
        require(used + len(free) == self.size, "ReqToTokenPool: used + free == size", used=used, free=len(free),
                size=self.size)
        shape = tuple(self.req_to_token.shape)
        require(shape == (self.size + 1, self.max_context_len),
                "ReqToTokenPool: req_to_token is (size + 1) x max_context_len", shape=shape, size=self.size,
                max_context_len=self.max_context_len)


def _store_dtype(dtype: torch.dtype) -> torch.dtype:
    # SGLang stores fp8 KV as uint8: index_put is not implemented for the float8 dtypes.
    if dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
        return torch.uint8
    return dtype


class MHATokenToKVPool:
    """Per-layer K and V buffers, NHD layout: ``k_buffer[l][slot] -> [head_num, head_dim]``.

    Mirrors ``memory_pool.py::MHATokenToKVPool`` (default NHD layout, unquantized): each layer has
    ``size + page_size`` rows, the extra page being the padding page that holds slot 0. Bytes:
    ``layer_num * (size + page_size) * head_num * (head_dim + v_head_dim) * dtype bytes``, i.e.
    the per-token cell size times ``size + page_size``.

    ``device`` is a str / torch.device, or an object with ``empty(shape, dtype=, label=)`` (a
    kvlab simulated GPU). With ``device="meta"`` a pool at model scale allocates nothing.
    Differs on purpose: no fused K/V tensor, HND / AITER layouts, quantized recipes or streams.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: DeviceLike = "cpu",
        enable_memory_saver: bool = False,
        v_head_dim: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
    ):
        if min(size, page_size, head_num, head_dim, layer_num) < 1:
            raise ValueError("MHATokenToKVPool: size, page_size, head_num, head_dim, layer_num must be >= 1")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.store_dtype = _store_dtype(dtype)
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.layer_num = layer_num
        self.start_layer = start_layer or 0
        self.end_layer = end_layer if end_layer is not None else self.start_layer + layer_num - 1
        self.device = device
        rows = size + page_size
        self.k_buffer = [
            allocate_tensor(device, (rows, head_num, head_dim), self.store_dtype, f"k_buffer[{layer}]")
            for layer in range(layer_num)
        ]
        self.v_buffer = [
            allocate_tensor(device, (rows, head_num, self.v_head_dim), self.store_dtype, f"v_buffer[{layer}]")
            for layer in range(layer_num)
        ]

    @property
    def cell_size_bytes(self) -> int:
        """KV bytes per token slot over all layers (SGLang's ``cell_size`` for MHA)."""
        elem = torch.empty((), dtype=self.store_dtype).element_size()
        return self.head_num * (self.head_dim + self.v_head_dim) * self.layer_num * elem

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(k_bytes, v_bytes)`` over all layers, from the tensors themselves (as SGLang)."""
        k = sum(t.numel() * t.element_size() for t in self.k_buffer)
        v = sum(t.numel() * t.element_size() for t in self.v_buffer)
        return k, v

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id - self.start_layer]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id - self.start_layer]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        """Scatter one layer's K/V for the tokens at slots ``loc`` (shape ``[n, head_num, dim]``)."""
        i = layer_id - self.start_layer
        self.k_buffer[i][loc] = cache_k.to(self.store_dtype)
        self.v_buffer[i][loc] = cache_v.to(self.store_dtype)

    def check_invariants(self) -> None:
        rows = self.size + self.page_size
        for name, bufs, dim in (("k", self.k_buffer, self.head_dim), ("v", self.v_buffer, self.v_head_dim)):
            require(len(bufs) == self.layer_num, "MHATokenToKVPool: one K and one V buffer per layer", kind=name,
                    buffers=len(bufs), layers=self.layer_num)
            for layer, t in enumerate(bufs):
                require(tuple(t.shape) == (rows, self.head_num, dim) and t.dtype == self.store_dtype,
                        "MHATokenToKVPool: every buffer is rows x heads x head_dim of the store dtype",
                        buffer=f"{name}_buffer[{layer}]", shape=tuple(t.shape), dtype=t.dtype,
                        expected_shape=(rows, self.head_num, dim), expected_dtype=self.store_dtype)
        k, v = self.get_kv_size_bytes()
        require(k + v == self.cell_size_bytes * rows, "MHATokenToKVPool: buffer bytes == cell bytes x rows",
                bytes=k + v, cell_size_bytes=self.cell_size_bytes, rows=rows)
