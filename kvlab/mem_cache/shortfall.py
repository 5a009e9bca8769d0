"""Finding 2 in one place: how much the radix cache is asked to evict when the KV pool is short.

When a request needs ``num_tokens`` free slots and only ``available`` are free, SGLang evicts cached prefixes
from the tree to make room. The fix (SGLang >= 0.5.17, PR #32016) asks the tree for the **shortfall**,
``num_tokens - available``; SGLang <= 0.5.16 asked for all of ``num_tokens`` (the bug), destroying up to
``available`` extra cached tokens per pressure event. :func:`tokens_to_evict` is that rule, and every engine in
kvlab calls it:

- ``common.evict_from_tree_cache`` (the token-level memory, the reference loop, the notebooks' trees),
- ``kvlab/sched/page_kv.py::PageKV.evict`` (the page engine: the README headline, notebook 02's panel and
  ``kvlab simulate``),
- ``HiRadixCache.load_back`` (the host tier's load-back into a short device pool),
- ``kvlab/experiments/host_tier_cache.py::evict_for`` (notebook 07's pressure events).

:func:`over_evicted_tokens` is the one piece of arithmetic that measures the bug's damage. Torch-free: the page
engine imports it without torch.
"""

from __future__ import annotations

from kvlab.mem_cache.options import EVICTION_MODES


def shortfall_tokens(num_tokens: int, available: int) -> int:
    """What is truly missing when ``num_tokens`` slots are needed and ``available`` are free (0 when none is)."""
    return max(0, num_tokens - available)


def tokens_to_evict(num_tokens: int, available: int, mode: str = "shortfall") -> int:
    """The tokens to ask the tree for when ``num_tokens`` slots are needed and ``available`` are free: 0 when
    nothing is missing; else the shortfall ``num_tokens - available`` (``mode="shortfall"``, the fix) or all of
    ``num_tokens`` (``mode="full"``, SGLang <= 0.5.16)."""
    if num_tokens <= available:  # nothing is missing: no version evicts
        return 0
    return num_tokens - available if mode == "shortfall" else num_tokens  # finding 2: the bug asked for num_tokens


def over_evicted_tokens(evicted: int, requested: int, shortfall: int) -> int:
    """Tokens evicted only because more than the shortfall was asked for (the bug's damage):
    ``max(0, min(evicted, requested) - shortfall)``; always 0 in ``"shortfall"`` mode."""
    return max(0, min(evicted, requested) - shortfall)


def check_mode(mode: str, where: str) -> str:
    """``mode`` if it is one of :data:`EVICTION_MODES`; else a ``ValueError`` naming ``where`` and both modes."""
    if mode not in EVICTION_MODES:
        raise ValueError(f"{where}: unknown eviction mode {mode!r}; use 'shortfall' (SGLang >= 0.5.17) "
                         f"or 'full' (SGLang <= 0.5.16)")
    return mode


__all__ = ["EVICTION_MODES", "check_mode", "over_evicted_tokens", "shortfall_tokens", "tokens_to_evict"]
