"""What a simulation is asked to do: :class:`SchedulerConfig`, SGLang's two scheduler constants, and the smallest
pool a request can run in (:func:`min_kv_tokens`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.mem_cache.common import EVICTION_MODES
from kvlab.sched.cost import CostModel
from kvlab.units import align_down, align_up

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py: future tokens counted per request, at most
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS


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
    max_steps: int = 10_000_000

    def __post_init__(self) -> None:
        if self.eviction not in EVICTION_MODES:
            raise ValueError(f"eviction must be one of {EVICTION_MODES}, got {self.eviction!r}")
        for name in ("kv_tokens", "page_size", "max_running", "chunked_prefill_size", "max_prefill_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.kv_tokens % self.page_size:
            raise ValueError(
                f"kv_tokens={self.kv_tokens} is not a multiple of page_size={self.page_size}: "
                f"use {align_down(self.kv_tokens, self.page_size) or self.page_size} tokens or another page size")
        if self.chunked_prefill_size < self.page_size:
            raise ValueError(f"chunked_prefill_size={self.chunked_prefill_size} is smaller than one page ({self.page_size})")


def min_kv_tokens(prompt_len: int, output_len: int, page_size: int = 1) -> int:
    """The smallest KV pool (tokens, whole pages) that can run one request alone: its prompt and every
    output token (at least one) page-aligned plus the padding page, and room for admission, which
    wants ``prompt + clipped output + page_size < free + evictable`` (``PrefillAdder``'s budget)."""
    out = max(1, output_len)
    hold = align_up(prompt_len + out, page_size) + page_size
    admit = align_up(prompt_len + min(out, CLIP_MAX_NEW_TOKENS) + page_size + 1, page_size)
    return max(hold, admit)
