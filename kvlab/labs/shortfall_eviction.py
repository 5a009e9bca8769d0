"""Notebook 02's exercise, :data:`shortfall`: how many tokens to ask the radix tree for, written by the learner.

The learner writes ``my_shortfall(num_tokens, available) -> tokens`` (the notebook's starter is SGLang
0.5.16's standard arm: ``num_tokens`` when ``available < num_tokens``, else nothing). Four allocations under
different pressure (:data:`SHORTFALL_CASES`) run on a real ``RadixCache`` over a ``TokenToKVPoolAllocator``,
evicting what the learner asks for, and are compared with ``evict_from_tree_cache(..., mode="shortfall")`` on an
identical tree.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlab.experiments.shortfall_eviction import conversation_tree as _pressure_tree
from kvlab.labs.check import CheckLine, CheckResult, compare
from kvlab.labs.lab import Exercise
from kvlab.labs.solution import Solution
from kvlab.mem_cache.common import evict_from_tree_cache
from kvlab.mem_cache.evict_policy import EvictParams

SHORTFALL_CASES = ((600, 300), (500, 100), (300, 300), (200, 300))  # (num_tokens, free slots)


def conversation_tree(free_tokens: int, capacity_tokens: int = 4096):
    """``shortfall_eviction.conversation_tree`` with running requests holding all but ``free_tokens``
    slots. Returns (cache, allocator, holder of the running requests' slots)."""
    tree, alloc, _names = _pressure_tree(capacity_tokens)
    if not 0 <= free_tokens <= alloc.available_size():
        raise ValueError(f"conversation_tree: free_tokens must be in 0..{alloc.available_size()}, got {free_tokens}")
    held = alloc.alloc(alloc.available_size() - free_tokens) if alloc.available_size() > free_tokens else None
    return tree, alloc, held


@dataclass(frozen=True)
class ShortfallAllocation:
    """One allocation of :func:`run_with_shortfall`: what the learner's function asked the tree for, what the
    tree evicted, and whether the allocation then fit. ``error``: what the function raised or returned wrong
    (then the other outcomes are ``None``)."""

    num_tokens: int
    free_tokens: int
    asked_tokens: int | None = None
    evicted_tokens: int | None = None
    fits: bool | None = None
    error: str | None = None


def _evict_with(fn: Callable[[int, int], Any], num_tokens: int, free: int) -> ShortfallAllocation:
    tree, alloc, held = conversation_tree(free)
    available = alloc.available_size()
    asked = fn(num_tokens, available)
    if not isinstance(asked, numbers.Integral) or isinstance(asked, bool):
        raise TypeError(f"my_shortfall({num_tokens}, {available}) returned {asked!r}; return a number of tokens (an int)")
    evicted = tree.evict(EvictParams(num_tokens=int(asked))).evicted_tokens if asked > 0 else 0
    tree.check_invariants()
    fits = alloc.alloc(num_tokens) is not None
    del held
    return ShortfallAllocation(num_tokens, free, int(asked), evicted, fits)


def run_with_shortfall(shortfall: Callable[[int, int], Any]) -> tuple[ShortfallAllocation, ...]:
    """Each of :data:`SHORTFALL_CASES` on a fresh tree: ask ``shortfall(num_tokens, available)``, evict that
    many tokens (whole leaves, LRU first), then allocate ``num_tokens``."""
    outcomes = []
    for num, free in SHORTFALL_CASES:
        try:
            outcomes.append(_evict_with(shortfall, num, free))
        except Exception as exc:  # the learner's code: report it, do not raise
            outcomes.append(ShortfallAllocation(num, free, error=f"{type(exc).__name__}: {exc}"))
    return tuple(outcomes)


def _reference_eviction(num_tokens: int, free: int) -> int:
    tree, _alloc, _held = conversation_tree(free)
    return evict_from_tree_cache(tree, num_tokens, "shortfall").evicted_tokens


def check_shortfall(shortfall: Callable[[int, int], Any]) -> CheckResult:
    """Evict what ``shortfall(num_tokens, available)`` asks for in four allocations; compare the tokens
    evicted with SGLang >= 0.5.17 on the same tree."""
    title = "my_shortfall on a real radix cache, four allocations"
    lines = []
    for mine in run_with_shortfall(shortfall):
        num, free = mine.num_tokens, mine.free_tokens
        label = f"need {num:,} with {free:,} free: tokens evicted"
        expected = _reference_eviction(num, free)
        if mine.error is not None:
            lines.append(CheckLine(label, False, given=mine.error, expected=expected,
                                   hint="fix the error and run it again"))
            continue
        asked, evicted = mine.asked_tokens, mine.evicted_tokens
        missing = max(0, num - free)
        if evicted == expected:
            hint = ""
        elif not mine.fits:
            hint = f"you asked for {asked:,}: too little, the {num:,}-slot allocation still does not fit"
        elif missing == 0:
            hint = (f"nothing was missing: {free:,} slots free for {num:,} needed, so no SGLang version evicts "
                    f"here (0.5.16 neither: it evicted only when available < num_tokens); ask for 0")
        elif asked >= num and free > 0:
            hint = (f"you asked the tree for all {num:,} tokens, as SGLang ≤ 0.5.16 did when short (the bug): "
                    f"{free:,} slots were already free, so only {missing:,} were missing")
        else:
            hint = f"you asked for {asked:,}; only {missing:,} were missing"
        lines.append(compare(label, evicted, expected, hint))
    note = ("Whole leaves are evicted (least recently used first), so the tree may free a little more than "
            "it was asked for; what counts is asking for no more than is missing.")
    return CheckResult(title, tuple(lines), note)


shortfall = Exercise(
    "shortfall", "evict only the shortfall", "my_shortfall",
    Solution("ask the tree only for what is missing", """def my_shortfall(num_tokens, available):
    return max(0, num_tokens - available)  # the `available` free slots already count toward num_tokens
"""),
    runner=run_with_shortfall, checker=check_shortfall,
)
LABS = (shortfall,)
