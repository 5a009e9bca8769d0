"""What a simulation is asked to do: :class:`SchedulerConfig`, SGLang's two scheduler constants, and the smallest
pool a request can run in (:func:`min_kv_tokens`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from kvlab.mem_cache.hicache.storage import PREFETCH_POLICIES, STORAGE_BACKENDS  # (no torch)
from kvlab.mem_cache.options import EVICTION_MODES, WRITE_POLICIES, HostPoolSize, host_pool_size  # no torch
from kvlab.sched.arrivals import ClosedLoop
from kvlab.sched.cost import CostModel
from kvlab.units import GB, POW2_40, GiB, align_down, align_up

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py: future tokens counted per request, at most
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
# the largest host pool a run takes: 1000 times the device pool, or 64 TiB (far beyond any host's memory; the
# simulator keeps a flag per host slot)
MAX_HOST_POOL_TOKENS = 1 << 27  # a flag and an index per host slot: about 1.2 GB of simulator state
MAX_HICACHE = {"hicache_ratio": 1000.0, "hicache_size_gib": 65_536.0}
#: the largest pool the token-level memory takes (page size 1, the reference loop): 2^26 tokens is about 1.3 GB of
#: its state and far beyond any real pool (2^27 took 2.6 GB; 10^20 was a traceback, issue 26)
MAX_POOL_TOKENS = 1 << 26
#: the largest pool the page engine takes (page size > 1 on the fast path): it holds counts, not tables, so a pool
#: is a number and "how much would an unlimited cache hit?" can be asked of a real-size trace; 2^40 tokens (10^12)
#: still refuses absurd values
MAX_PAGE_ENGINE_POOL_TOKENS = POW2_40


def max_pool_tokens(page_size: int, counts_only: bool = True) -> tuple[int, str]:
    """The largest pool a run takes, and its bound's name: the page engine's (``counts_only`` at page size > 1)
    or the token-level memory's."""
    if counts_only and page_size > 1:
        return MAX_PAGE_ENGINE_POOL_TOKENS, "2^40, the page engine's"
    return MAX_POOL_TOKENS, "2^26, the token-level memory's"


@dataclass(frozen=True)
class SchedulerConfig:
    """One simulation's settings, checked on construction (``ValueError`` naming the field and value)."""

    kv_tokens: int  # KV pool size in tokens (a multiple of page_size)
    page_size: int = 1
    max_running: int = 256
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    eviction: str = "shortfall"  # "shortfall" (the fix) | "full" (the bug)
    policy: str = "lru"
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    cost: CostModel = field(default_factory=CostModel)
    debug: bool = False  # check every invariant after every step
    # Event-driven decode rounds (page_size > 1, kvlab.sched.fast_decode): the same steps, rows and
    # totals as the plain loop (fast_decode=False, the reference the tests compare against), at a cost
    # per round that grows with what happens in it rather than with the running batch.
    fast_decode: bool = True
    # The fast path at page_size > 1 without HiCache runs on the page engine (kvlab.sched.page_kv: page ids and
    # counts, no token or slot tensors); False keeps it on the token-level memory, the one HiCache runs on
    # (benchmarks/bench_hicache.py compares the host tier's cost on one engine).
    page_engine: bool = True
    max_steps: int = 10_000_000
    # HiCache (SGLang's --enable-hierarchical-cache): a host pool beside the device pool, on when one of the two
    # sizes is given (SGLang's --hicache-ratio, or --hicache-size in GiB here where SGLang reads decimal GB), sized
    # as SGLang sizes it (kvlab.mem_cache.hicache.memory_pool_host.host_pool_size); off (None, None) by default.
    hicache_ratio: float | None = None
    hicache_size_gib: float | None = None
    hicache_write_policy: str = "write_through"  # write_through | write_through_selective | write_back
    # a closed-loop workload (SGLang's bench_multiturn.py, kvlab.sched.arrivals): a client's next round arrives
    # when its previous response does; None: the requests arrive at their own times
    closed_loop: ClosedLoop | None = None

    @property
    def counts_only(self) -> bool:
        """Whether the run's memory is the page engine's counts (``kvlab.sched.page_kv.PageKV``): the fast path at
        page size > 1, with or without a host tier; else the token-level memory (slot tables)."""
        return self.fast_decode and self.page_engine and self.page_size > 1
    # HiCache's storage tier (L3; SGLang's --hicache-storage-backend), beside a host tier only: a backend preset
    # (kvlab.mem_cache.hicache.storage.STORAGE_PRESETS), its capacity in decimal GB (None: the preset's; 0:
    # unbounded), the prefetch policy and SGLang's prefetch knobs (--hicache-storage-backend-extra-config).
    hicache_storage_backend: str | None = None
    hicache_storage_size_gb: float | None = None
    hicache_storage_prefetch_policy: str = "best_effort"  # best_effort | wait_complete | timeout
    prefetch_threshold: int = 256  # tokens
    prefetch_timeout_base: float = 2.0  # seconds
    prefetch_timeout_per_ki_token: float = 0.1  # seconds per 1024 tokens
    prefetch_timeout_max: float = 30.0  # seconds

    @property
    def hicache(self) -> bool:
        """Whether the run has a host tier (HiRadixCache over a host pool) instead of a RadixCache."""
        return self.hicache_ratio is not None or self.hicache_size_gib is not None

    def host_pool(self) -> HostPoolSize:
        """The host pool SGLang would make for this device pool (``HostKVCache``'s rule: the ratio times the device
        pool, or the size over ``cost.kv_bytes_per_token``; then one page more than the whole pages)."""
        return host_pool_size(self.kv_tokens, self.cost.kv_bytes_per_token, self.page_size,
                              self.hicache_ratio or 2.0, self.hicache_size_gb)

    @property
    def hicache_size_gb(self) -> float:
        """``hicache_size_gib`` in SGLang's unit (decimal GB, what ``host_pool_size`` reads); 0 when not given."""
        return 0.0 if self.hicache_size_gib is None else self.hicache_size_gib * GiB / GB

    def __post_init__(self) -> None:
        if self.eviction not in EVICTION_MODES:
            raise ValueError(f"eviction must be one of {EVICTION_MODES}, got {self.eviction!r}")
        for name in ("kv_tokens", "page_size", "max_running", "chunked_prefill_size", "max_prefill_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        bound, name = max_pool_tokens(self.page_size, self.counts_only)
        if self.kv_tokens > bound:
            raise ValueError(f"kv_tokens={self.kv_tokens} is more than the {bound:,} ({name}) tokens the "
                             "simulator takes")
        if self.kv_tokens % self.page_size:
            raise ValueError(
                f"kv_tokens={self.kv_tokens} is not a multiple of page_size={self.page_size}: "
                f"use {align_down(self.kv_tokens, self.page_size) or self.page_size} tokens or another page size")
        if self.chunked_prefill_size < self.page_size:
            raise ValueError(f"chunked_prefill_size={self.chunked_prefill_size} is smaller than one page ({self.page_size})")
        self._check_hicache()

    def _check_hicache(self) -> None:
        if self.hicache_ratio is not None and self.hicache_size_gib is not None:
            raise ValueError(f"give hicache_ratio or hicache_size_gib, not both (hicache_ratio={self.hicache_ratio}, "
                             f"hicache_size_gib={self.hicache_size_gib})")
        for name in ("hicache_ratio", "hicache_size_gib"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 < value <= MAX_HICACHE[name]:
                raise ValueError(f"{name} must be a number in (0, {MAX_HICACHE[name]:g}], got {value!r}")
        # (the page engine's host pool is a count: the ratio's and the size's own bounds are its only ones)
        if self.hicache and not self.counts_only and self.host_pool().size_tokens > MAX_HOST_POOL_TOKENS:
            field = "hicache_ratio" if self.hicache_ratio is not None else "hicache_size_gib"
            raise ValueError(f"{field}={getattr(self, field)} makes a host pool of {self.host_pool().size_tokens:,} "
                             f"tokens: at most {MAX_HOST_POOL_TOKENS:,} (2^27)")
        if self.hicache_write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy must be one of {', '.join(WRITE_POLICIES)}, "
                             f"got {self.hicache_write_policy!r}")
        self._check_storage()

    def _check_storage(self) -> None:
        if self.hicache_storage_backend is None:
            return
        if self.hicache_storage_backend not in STORAGE_BACKENDS:
            raise ValueError(f"hicache_storage_backend must be one of {', '.join(STORAGE_BACKENDS)}, "
                             f"got {self.hicache_storage_backend!r}")
        if not self.hicache:
            raise ValueError(f"hicache_storage_backend={self.hicache_storage_backend} needs a host tier (as SGLang's "
                             "--hicache-storage-backend needs --enable-hierarchical-cache): give hicache_ratio or "
                             "hicache_size_gib")
        if self.hicache_storage_prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(f"hicache_storage_prefetch_policy must be one of {', '.join(PREFETCH_POLICIES)}, "
                             f"got {self.hicache_storage_prefetch_policy!r}")
        for name in ("hicache_storage_size_gb", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
                     "prefetch_timeout_max"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.prefetch_threshold, bool) or not isinstance(self.prefetch_threshold, int) \
                or self.prefetch_threshold < 0:
            raise ValueError(f"prefetch_threshold must be an int >= 0 (tokens), got {self.prefetch_threshold!r}")

    @property
    def hicache_storage(self) -> bool:
        """Whether the run has a storage tier (L3) behind its host tier."""
        return self.hicache_storage_backend is not None


def min_kv_tokens(prompt_len: int, output_len: int, page_size: int = 1) -> int:
    """The smallest KV pool (tokens, whole pages) that can run one request alone: its prompt and every
    output token (at least one) page-aligned plus the padding page, and room for admission, which
    wants ``prompt + clipped output + page_size < free + evictable`` (``PrefillAdder``'s budget)."""
    out = max(1, output_len)
    hold = align_up(prompt_len + out, page_size) + page_size
    admit = align_up(prompt_len + min(out, CLIP_MAX_NEW_TOKENS) + page_size + 1, page_size)
    return max(hold, admit)



class Extent(NamedTuple):
    """The two requests that need the largest pool at any page size (:func:`min_kv_tokens`'s two terms): the
    longest prompt + output, and the longest prompt + output as admission counts it (at most
    ``CLIP_MAX_NEW_TOKENS`` of the output). Each is ``(rid, prompt_len, output_len)``."""

    hold: tuple
    admit: tuple


def request_extent(requests) -> Extent:
    """The :class:`Extent` of ``requests`` (one pass; every pool and page size is then checked in O(1))."""
    def key(r, clip):
        return len(r.prompt_token_ids) + min(max(1, r.output_len), clip)

    hold = max(requests, key=lambda r: key(r, math.inf))
    admit = max(requests, key=lambda r: key(r, CLIP_MAX_NEW_TOKENS))
    return Extent(*((r.rid, len(r.prompt_token_ids), r.output_len) for r in (hold, admit)))


def pool_need(prompt_len: int, output_len: int, page_size: int) -> tuple[int, str]:
    """:func:`min_kv_tokens` and how it comes about, page rounding included, e.g. "48 pages of 64 = 3,072 tokens:
    prompt 1,344 + output 1,664 = 3,008 tokens are 47 pages of 64, plus one padding page"."""
    out, ps = max(1, output_len), page_size
    need = min_kv_tokens(prompt_len, output_len, ps)
    total = f"{need // ps:,} pages of {ps} = {need:,} tokens" if ps > 1 else f"{need:,} tokens"
    if need == align_up(prompt_len + out, ps) + ps:
        pages = f" are {align_up(prompt_len + out, ps) // ps:,} pages of {ps}," if ps > 1 else ""
        return need, (f"{total}: prompt {prompt_len:,} + output {out:,} = {prompt_len + out:,} tokens{pages} plus "
                      f"one padding {'page' if ps > 1 else 'token'}")
    counted = min(out, CLIP_MAX_NEW_TOKENS)
    clip = f" (at most {CLIP_MAX_NEW_TOKENS:,} counted)" if out > CLIP_MAX_NEW_TOKENS else ""
    return need, (f"{total}: to be admitted, prompt {prompt_len:,} + output {counted:,}{clip} + one page ({ps}) "
                  f"must be less than the pool, so the pool is at least {prompt_len + counted + ps + 1:,} tokens"
                  f"{', in whole pages' if ps > 1 else ''}")


def check_pool(extent: Extent, *, page_size: int, kv_tokens: int, page_flag: str, pool_flag: str,
               chunked_prefill_size: int = SchedulerConfig.chunked_prefill_size) -> None:
    """Whether a run of requests of ``extent`` can start at this page size and pool: the one check ``kvlab
    simulate`` and every point of ``kvlab sweep`` go through before anything runs. A ``ValueError`` names each
    setting as the user gave it: ``page_flag`` ("--page-size 10000", "page size 1 (the default)") and
    ``pool_flag`` ("--kv-pages 30", "the default pool")."""
    if page_size > chunked_prefill_size:
        raise ValueError(f"{page_flag}: a page must fit in one prefill chunk (chunked_prefill_size), so at most "
                         f"{chunked_prefill_size:,} tokens")
    bound, name = max_pool_tokens(page_size)
    if kv_tokens > bound:
        raise ValueError(f"{pool_flag} at {page_flag} is {kv_tokens:,} tokens: at most {bound:,} ({name})")
    if kv_tokens % page_size:
        raise ValueError(f"{pool_flag} is not a whole number of pages at {page_flag}: use "
                         f"{align_down(kv_tokens, page_size) or page_size:,} or {align_up(kv_tokens, page_size):,} "
                         "tokens")
    rid, need, why = max(((r[0], *pool_need(r[1], r[2], page_size)) for r in extent), key=lambda t: t[1])
    if kv_tokens < need:
        raise ValueError(f"{pool_flag} at {page_flag} ({kv_tokens:,} tokens) is smaller than one request: {rid!r} "
                         f"needs {why}")
