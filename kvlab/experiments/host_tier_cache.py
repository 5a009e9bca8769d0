"""The host tier's hand-sized two-tier cache and one request served on it, shared by the pressure events
(:mod:`kvlab.experiments.host_tier_events`), the scripts (:mod:`kvlab.experiments.host_tier`) and the stepper
(:mod:`kvlab.experiments.host_tier_demo`): :func:`make_cache`, :func:`evict_for` (finding 2's rule on a two-tier
tree) and :func:`serve`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlab.experiments.arguments import HelperArgumentError, check_int, check_number
from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
from kvlab.mem_cache.base_prefix_cache import EvictResult
from kvlab.mem_cache.common import EVICTION_MODES
from kvlab.mem_cache.hicache.cache_controller import WRITE_POLICIES
from kvlab.mem_cache.hicache.hiradix_cache import HiEvictResult, HiRadixCache
from kvlab.mem_cache.hicache.memory_pool_host import HostKVCache
from kvlab.mem_cache.shortfall import shortfall_tokens, tokens_to_evict
from kvlab.sched.config import MAX_HICACHE
from kvlab.sched.cost import DEFAULT_HOST_LINK_BYTES_PER_S

MODES = EVICTION_MODES  # ("shortfall", "full")
MODE_LABELS = {"shortfall": "shortfall (the fix)", "full": "full (the bug)"}
POLICIES = WRITE_POLICIES  # ("write_through", "write_through_selective", "write_back")
# Llama-3-8B in bf16: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 128 KiB of KV per token
SIZE_PER_TOKEN_BYTES = 32 * 8 * 128 * 2 * 2
# the host link every copy of notebook 07 is priced at (the hand-sized trees, the live panel and `kvlab simulate`)
HOST_LINK_BYTES_PER_S = DEFAULT_HOST_LINK_BYTES_PER_S
STEP_S = 0.02  # modelled time of one request in the scripts: the clock moves this much after each one


# the largest hand-sized caches and scripts the helpers take (the notebook's: 4,096 slots, a host pool of 2x, 60
# requests): far beyond them, and within seconds
MAX_CAPACITY_TOKENS = 1_048_576  # 2^20 tokens
MAX_HOST_TOKENS = 1 << 24
MAX_SCRIPT_REQUESTS = 500
MAX_SCRIPT_TOKENS = 1 << 19  # num_requests × a quarter of capacity_tokens (the longest a conversation grows)


def make_cache(capacity_tokens: int = 4096, *, host_ratio: float = 2.0, write_policy: str = "write_through",
               mode: str = "shortfall", size_per_token: int = SIZE_PER_TOKEN_BYTES,
               bytes_per_s: float = HOST_LINK_BYTES_PER_S) -> tuple[HiRadixCache, TokenToKVPoolAllocator]:
    """A page-1 two-tier cache: a device pool of ``capacity_tokens`` slots and a host pool sized as SGLang sizes
    it for ``--hicache-ratio host_ratio`` (``int(capacity × ratio)`` rounded up by a page). ``mode`` is also the
    load-back's eviction rule."""
    if write_policy not in POLICIES:
        raise ValueError(f"write_policy must be one of {', '.join(POLICIES)}, got {write_policy!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be 'shortfall' (the fix) or 'full' (the bug), got {mode!r}")
    check_int("make_cache", "capacity_tokens", capacity_tokens, 1, MAX_CAPACITY_TOKENS, "a hand-sized cache")
    check_number("make_cache", "host_ratio", host_ratio, MAX_HICACHE["hicache_ratio"], "SGLang's --hicache-ratio")
    if capacity_tokens * host_ratio > MAX_HOST_TOKENS:
        raise HelperArgumentError(f"make_cache(capacity_tokens={capacity_tokens}, host_ratio={host_ratio!r}): a host "
                                  f"pool of {int(capacity_tokens * host_ratio):,} tokens; at most {MAX_HOST_TOKENS:,} "
                                  "in a hand-sized cache")
    alloc = TokenToKVPoolAllocator(capacity_tokens)
    host = HostKVCache(capacity_tokens, size_per_token, 1, hicache_ratio=host_ratio)
    cache = HiRadixCache(None, alloc, host, 1, write_policy=write_policy, load_back_evict_mode=mode,
                         d2h_bytes_per_s=bytes_per_s, h2d_bytes_per_s=bytes_per_s)
    return cache, alloc


def host_link_text() -> str:
    """The one host-link bandwidth notebook 07 prices copies at, in words (shown once, in section 1)."""
    return (f"Every copy between host and device in this notebook (sections 1 to 4, the live panel, and `kvlab "
            f"simulate`) is priced at {HOST_LINK_BYTES_PER_S / 1e9:g} GB/s each way (1 GB/s = 10^9 bytes per second), an "
            "H100's PCIe Gen5 x16 link for pinned copies. Sizes are binary: MiB and GiB (KV of Llama-3-8B, 128 KiB "
            "per token).")


def evict_for(cache: HiRadixCache, num_tokens: int, mode: str) -> HiEvictResult | EvictResult:
    """``evict_from_tree_cache`` on a two-tier cache, keeping the tree's :class:`HiEvictResult` (demoted, written
    back, destroyed): ask for the shortfall (``"shortfall"``) or for all of ``num_tokens`` when short (``"full"``)."""
    available = cache.token_to_kv_pool_allocator.available_size()
    requested = tokens_to_evict(num_tokens, available, mode)
    if not requested:
        return EvictResult()
    shortfall = shortfall_tokens(num_tokens, available)
    res = cache.evict(requested)
    base = EvictResult.of(shortfall, requested, res.evicted_tokens)
    return HiEvictResult(**base.__dict__, demoted_tokens=res.demoted_tokens,
                         written_back_tokens=res.written_back_tokens, destroyed_tokens=res.destroyed_tokens,
                         host_evicted_tokens=res.host_evicted_tokens)


def serve(cache: HiRadixCache, key: Sequence[int], mode: str = "shortfall") -> ServeStep:
    """One request straight against the two-tier cache, as SGLang's scheduler serves it: ``match_prefix``; a host
    hit is loaded back (``init_load_back``: all or nothing, may evict in ``mode``); lock the device prefix, evict
    for the rest (``mode``), allocate, ``insert`` the whole key, unlock; then the transfer clock moves
    :data:`STEP_S` (copies issued so far finish, their nodes unlock). Returns what it did."""
    alloc = cache.token_to_kv_pool_allocator
    ctl = cache.cache_controller.totals
    written0, loaded0 = ctl.written_tokens, ctl.loaded_tokens
    m = cache.match_prefix(key)
    device_hit, host_hit = m.device_prefix_len, m.host_hit_length
    load_evict = EvictResult()
    if host_hit:
        lb = cache.load_back(m.last_host_node)
        load_evict = lb.evict
        m = cache.match_prefix(key)
    lock = cache.lock(m.last_device_node)
    need = len(key) - m.device_prefix_len
    ev = evict_for(cache, need, mode)
    kv = alloc.alloc(need)
    if kv is None:
        cache.unlock(lock)
        cache.advance(STEP_S)
        return ServeStep(len(key), device_hit, host_hit, ctl.loaded_tokens - loaded0, 0, ev, load_evict,
                         ctl.written_tokens - written0, rejected=True)
    cache.insert_slots(key, torch.cat([m.device_indices, kv]), prev_prefix_len=m.device_prefix_len)
    cache.unlock(lock)
    cache.advance(STEP_S)
    cache.check_invariants()
    return ServeStep(len(key), device_hit, host_hit, ctl.loaded_tokens - loaded0, need, ev, load_evict,
                     ctl.written_tokens - written0)


@dataclass(frozen=True)
class ServeStep:
    """One request of :func:`serve`. ``device_hit_tokens``: matched on the device; ``host_hit_tokens``: matched
    on host only; ``loaded_back_tokens``: of those, loaded back (0 when the load was skipped or did not fit);
    ``computed_tokens``: prefilled; ``evict`` / ``load_evict``: the allocation's and the load-back's eviction;
    ``written_tokens``: host copies issued during the request."""

    tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    loaded_back_tokens: int
    computed_tokens: int
    evict: EvictResult
    load_evict: EvictResult
    written_tokens: int
    rejected: bool = False
