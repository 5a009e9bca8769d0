"""Glue between the tree and the allocator: evict-then-allocate (``sglang/srt/mem_cache/common.py``
and ``allocation.py``).

``evict_from_tree_cache`` is where SGLang's eviction bug lived, and ``mode`` is the toggle that sits
exactly there (the rule itself is :func:`kvlab.mem_cache.shortfall.tokens_to_evict`, which every engine calls):

- ``mode="shortfall"`` (SGLang >= 0.5.17, PR #32016): evict ``num_tokens - available``.
- ``mode="full"`` (SGLang <= 0.5.16): evict all of ``num_tokens`` whenever ``available <
  num_tokens``, destroying up to ``available`` extra cached tokens per pressure event.

Whether the allocation then fits is the same in both modes; only cache hits are lost. The SWA arm
always evicted per-pool shortfalls, in both versions, and does so here in both modes.

``match_alloc_insert`` is the whole sequence a request goes through when it is served straight
against a tree (no scheduler): match, lock the match, evict + allocate the rest, insert, free the
duplicates, unlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from kvlab.mem_cache.base_prefix_cache import BasePrefixCache, EvictParams, EvictResult, HybridEvictResult
from kvlab.mem_cache.mamba_radix_cache import MambaRadixCache
from kvlab.mem_cache.options import EVICTION_MODES as EVICTION_MODES  # re-exported: its home is the torch-free options
from kvlab.mem_cache.radix_cache import RadixCache
from kvlab.mem_cache.request_flows import Req
from kvlab.mem_cache.shortfall import check_mode, shortfall_tokens, tokens_to_evict
from kvlab.mem_cache.swa_allocator import SWATokenToKVPoolAllocator

_NOTHING = EvictResult()  # frozen: the one result of every call that finds enough free slots


def evict_from_tree_cache(tree_cache: BasePrefixCache | None, num_tokens: int, mode: str = "shortfall") -> EvictResult:
    """Make room for ``num_tokens`` new KV slots by evicting from ``tree_cache``.

    Standard allocator: ``shortfall = max(0, num_tokens - available_size())``; nothing happens when
    it is 0. Otherwise the tree is asked for the shortfall (``"shortfall"``) or for ``num_tokens``
    (``"full"``, the bug). SWA allocator: ``max(0, num_tokens - full_available)`` from the full
    pool and ``max(0, num_tokens - swa_available)`` from the SWA pool, in both modes.
    The :class:`EvictResult` separates the shortfall, the request, what was evicted, the bug's
    over-eviction and the leaf-granularity overshoot. Mirrors ``common.py::evict_from_tree_cache``
    (0.5.16 for ``"full"``, 0.5.17-0.5.18 for ``"shortfall"``; 0.5.23 routes the same arithmetic
    through ``allocator.evict_to_free_tokens``).
    """
    check_mode(mode, "evict_from_tree_cache")
    if tree_cache is None or getattr(tree_cache, "disable", False):
        return EvictResult()
    allocator = tree_cache.token_to_kv_pool_allocator
    if isinstance(allocator, SWATokenToKVPoolAllocator):
        full_available = allocator.full_available_size()
        swa_available = allocator.swa_available_size()
        if full_available >= num_tokens and swa_available >= num_tokens:
            return EvictResult()
        full_short = tokens_to_evict(num_tokens, full_available)  # the SWA arm: the shortfall in both modes
        swa_short = tokens_to_evict(num_tokens, swa_available)
        res = tree_cache.evict(EvictParams(num_tokens=full_short, swa_num_tokens=swa_short))
        return _with_hybrid(EvictResult.of(full_short, full_short, res.evicted_tokens, swa_short, swa_short), res)
    available = allocator.available_size()
    requested = tokens_to_evict(num_tokens, available, mode)
    if not requested:
        return _NOTHING
    shortfall = shortfall_tokens(num_tokens, available)
    res = tree_cache.evict(EvictParams(num_tokens=requested))
    return _with_hybrid(EvictResult.of(shortfall, requested, res.evicted_tokens), res)


def _with_hybrid(base: EvictResult, res: EvictResult) -> EvictResult:
    """Hybrid trees (SWARadixCache, MambaRadixCache) also report what the second pool lost: keep
    those fields; a plain RadixCache result stays a plain :class:`EvictResult`."""
    if not isinstance(res, HybridEvictResult):
        return base
    return HybridEvictResult(**base.__dict__, swa_evicted_tokens=res.swa_evicted_tokens,
                             mamba_shortfall=res.mamba_shortfall, mamba_num_evicted=res.mamba_num_evicted)


class AllocResult(NamedTuple):
    """Slots handed out (``None`` when the pool stayed short even after eviction) and the eviction
    that preceded the allocation."""

    out_cache_loc: torch.Tensor | None
    evict: EvictResult


def ensure_mamba_capacity(tree_cache: MambaRadixCache, num_states: int) -> EvictResult:
    """MambaRadixCache: free recurrent-state slots until ``num_states`` are available
    (``ensure_mamba_capacity``: ``EvictParams(num_tokens=0, mamba_num=needed - available)``; always
    the shortfall, in SGLang and here). Returns the tree's :class:`HybridEvictResult`."""
    if num_states < 0:
        raise ValueError(f"ensure_mamba_capacity: num_states must be >= 0, got {num_states}")
    pool = tree_cache.mamba_pool
    short = shortfall_tokens(num_states, pool.available_size())
    if not short:
        return EvictResult()
    return tree_cache.evict(0, mamba_num=short)


def alloc_token_slots(tree_cache: BasePrefixCache, num_tokens: int, mode: str = "shortfall") -> AllocResult:
    """``allocation.py::alloc_token_slots``: evict for ``num_tokens``, then ``alloc(num_tokens)``.
    SGLang raises "Out of memory" where this returns ``out_cache_loc=None``."""
    ev = evict_from_tree_cache(tree_cache, num_tokens, mode)
    return AllocResult(tree_cache.token_to_kv_pool_allocator.alloc(num_tokens), ev)


def alloc_paged_token_slots_extend(tree_cache: BasePrefixCache, prefix_lens: Sequence[int], seq_lens: Sequence[int],
                                   last_loc: Sequence[int], mode: str = "shortfall") -> AllocResult:
    """``allocation.py::alloc_paged_token_slots_extend`` (CPU lengths): evict for
    ``extend_num_tokens + batch_size * page_size`` (SGLang's over-estimate: every request may open
    a page), then ``alloc_extend``."""
    allocator = tree_cache.token_to_kv_pool_allocator
    pre, seq, last = _ints(prefix_lens), _ints(seq_lens), _ints(last_loc)  # the allocator reads host lists
    extend = sum(seq) - sum(pre)
    ev = evict_from_tree_cache(tree_cache, extend + len(seq) * allocator.page_size, mode)
    return AllocResult(allocator.alloc_extend(pre, pre, seq, seq, last, extend), ev)


def _ints(values: Sequence[int] | torch.Tensor) -> list[int]:
    return values.reshape(-1).tolist() if isinstance(values, torch.Tensor) else [int(v) for v in values]


def alloc_paged_token_slots_decode(tree_cache: BasePrefixCache, seq_lens: Sequence[int], last_loc: Sequence[int],
                                   mode: str = "shortfall") -> AllocResult:
    """``allocation.py::alloc_paged_token_slots_decode``: evict for ``batch_size * page_size``,
    then ``alloc_decode`` (``seq_lens`` are the lengths *after* this step's token)."""
    allocator = tree_cache.token_to_kv_pool_allocator
    seq = torch.as_tensor(list(seq_lens), dtype=torch.int64)
    last = torch.as_tensor(list(last_loc), dtype=torch.int64)
    ev = evict_from_tree_cache(tree_cache, len(seq) * allocator.page_size, mode)
    return AllocResult(allocator.alloc_decode(seq, seq, last), ev)


def release_kv_cache(req: Req, tree_cache: RadixCache, is_insert: bool = True,
                     kv_len_to_handle: int | None = None) -> None:
    """0.5.16 ``common.py::release_kv_cache``: ``cache_finished_req`` then free the request's row."""
    tree_cache.cache_finished_req(req, is_insert=is_insert, kv_len_to_handle=kv_len_to_handle)
    tree_cache.req_to_token_pool.free(req)


class MatchAllocInsertResult(NamedTuple):
    """What :func:`match_alloc_insert` did.

    - ``prefix_len``: tokens the match found (the cache hit, reused without computing).
    - ``out_cache_loc``: the KV slots allocated for the rest; None when the pool (or the Mamba state
      pool) stayed short even after eviction: then nothing was inserted.
    - ``cached_len``: tokens ``insert`` found already cached (``>= prefix_len``; 0 when nothing was
      inserted). Past ``prefix_len`` those are duplicates, already freed.
    - ``evict``: the token eviction before the allocation; ``mamba_evict``: the state eviction
      (``ensure_mamba_capacity``; an empty :class:`EvictResult` on other trees).
    - ``mamba_exist``: Mamba only, the final node already had a state (the new one was freed).
    """

    prefix_len: int
    out_cache_loc: torch.Tensor | None
    cached_len: int
    evict: EvictResult
    mamba_evict: EvictResult
    mamba_exist: bool = False


def match_alloc_insert(tree_cache: BasePrefixCache, key: Sequence[int], *, max_prefix_len: int | None = None,
                       mode: str = "shortfall") -> MatchAllocInsertResult:
    """Serve ``key`` straight against ``tree_cache``: the request flow of SGLang's scheduler without
    the scheduler (``match_prefix`` in ``init_next_round_input``, ``inc_lock_ref`` at admission,
    ``alloc_token_slots`` for the extend, ``cache_finished_req``'s insert and duplicate free, then
    ``dec_lock_ref``).

    1. ``match_prefix(key[:max_prefix_len])`` (SGLang matches at most ``len - 1`` tokens so the last
       one is computed; default: the whole key);
    2. lock the match, so this request's own eviction cannot take its prefix;
    3. evict for ``len(key) - prefix_len`` tokens (``evict_from_tree_cache``, ``mode``) and, on a
       Mamba tree, for one state slot (``ensure_mamba_capacity``); allocate both;
    4. insert ``key`` with the matched slots + the new ones, and free the duplicates: RadixCache
       leaves ``value[prefix_len:cached_len]`` to the caller, the SWA and Mamba trees free theirs
       (and a Mamba tree that already holds a state at the final node hands the new slot back);
    5. unlock.

    ``key`` must be whole pages. Nothing stays locked; if the allocation fails, nothing is inserted
    and no slot is kept.
    """
    if len(key) % tree_cache.page_size:
        raise ValueError(f"match_alloc_insert: {len(key)} tokens is not a whole number of pages "
                         f"(page_size {tree_cache.page_size})")
    m = tree_cache.match_prefix(key if max_prefix_len is None else key[:max_prefix_len])
    prefix_len = m.device_prefix_len
    lock = tree_cache.lock(m.last_device_node)
    need = len(key) - prefix_len
    ev = evict_from_tree_cache(tree_cache, need, mode)
    states = tree_cache.state_pool  # a Mamba tree: one recurrent state per inserted sequence
    state_ev = ensure_mamba_capacity(tree_cache, 1) if states is not None else EvictResult()
    allocator = tree_cache.token_to_kv_pool_allocator
    kv = allocator.alloc(need)
    slot = states.alloc(1) if states is not None and kv is not None else None
    if kv is None or (states is not None and slot is None):
        if kv is not None:
            allocator.free(kv)
        tree_cache.unlock(lock)
        return MatchAllocInsertResult(prefix_len, None, 0, ev, state_ev)
    value = torch.cat([m.device_indices, kv])
    res = tree_cache.insert_slots(key, value, prev_prefix_len=prefix_len,
                                  state_slot=None if slot is None else int(slot[0]))
    if res.state_exist:
        states.free(slot)
    tree_cache.unlock(lock)
    return MatchAllocInsertResult(prefix_len, kv, res.prefix_len, ev, state_ev, res.state_exist)
