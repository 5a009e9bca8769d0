"""The exercises of notebooks 01 and 02: kvlab's real scenario, run with the learner's function plugged in.

- Notebook 01, :func:`check_measure`: the learner writes the reading SGLang sizes its KV pool from,
  ``my_measure(devices) -> free bytes``. The start-up of ``kv_pool_sizing`` runs with it in place of
  ``get_available_gpu_memory``: the same weights and loader (with its reference cycle) on the same
  simulated ranks, so whether the learner's ``gc.collect()`` frees the staging is decided by Python's
  real collector, not by a flag.
- Notebook 02, :func:`check_shortfall`: the learner writes how many tokens to ask the tree for,
  ``my_shortfall(num_tokens, available) -> tokens`` (the notebook's starter is SGLang 0.5.16's standard arm:
  ``num_tokens`` when ``available < num_tokens``, else nothing). Four allocations under different pressure run on
  a real ``RadixCache`` over a ``TokenToKVPoolAllocator``, evicting what the learner asks for, and are
  compared with ``evict_from_tree_cache(..., mode="shortfall")`` on an identical tree.

Both return a :class:`kvlab.labs.CheckResult` (never raise for a wrong answer); the solutions are
:class:`kvlab.labs.Solution` objects, hidden unless ``KVLAB_SOLUTIONS=1``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.labs import CheckLine, CheckResult, Solution, compare

# ---- notebook 01: measure after collecting -------------------------------------------------------

MEASURE_SOLUTION = Solution(
    "collect, then empty the cache, then read",
    '''import gc

def my_measure(devices):
    gc.collect()          # break the loader's reference cycle: its staging tensors die ...
    for d in devices:
        d.empty_cache()   # ... so their now-unreferenced blocks can go back to the driver
    return min(d.mem_get_info()[0] for d in devices)  # free bytes; SGLang takes the MIN over TP ranks
''')


@dataclass(frozen=True)
class MeasuredStartup:
    """The start-up's outcome with one measurement function (rank-0 view, as ``KVPoolResult``)."""

    free_bytes: int | None  # what the measurement returned (None: it raised or returned no int)
    max_total_num_tokens: int
    accepted: bool
    error: str | None  # SGLang's refusal, or what went wrong with the learner's function
    function_error: str | None = None


class _LearnerError(Exception):
    """What the learner's function raised or returned wrong, carried out of the start-up."""


def run_with_measure(measure: Callable[[Sequence[Any]], Any], scenario: Any = "sglang-pr-4xh200") -> MeasuredStartup:
    """``kv_pool_sizing.run``'s start-up with ``measure(devices)`` as the post-load reading.

    ``devices``: the scenario's tensor-parallel ranks (kvlab devices: ``empty_cache()``,
    ``mem_get_info() -> (free, total)``, ``memory_allocated()``...). ``measure`` returns free bytes
    (an int) or a ``MemoryReading``. The automatic collector is paused as in ``run`` (an explicit
    ``gc.collect()`` still works), so only what ``measure`` does decides what is freed.
    """
    from kvlab.device.measure import MemoryReading
    from kvlab.experiments import kv_pool_sizing

    def guarded(ranks):
        try:
            given = measure(ranks)
        except Exception as exc:  # the learner's code: report it, do not raise
            raise _LearnerError(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(given, MemoryReading) or (isinstance(given, numbers.Integral) and not isinstance(given, bool)):
            return given
        raise _LearnerError(f"it returned {given!r}; return the free bytes, an int (mem_get_info()[0])")

    try:
        result = kv_pool_sizing.run(scenario, measure=guarded)
    except _LearnerError as exc:
        return MeasuredStartup(None, 0, False, None, str(exc))
    tokens = result.budget.max_total_num_tokens if result.budget is not None else 0
    return MeasuredStartup(result.reading.free_bytes, tokens, result.accepted, result.error)


_REFERENCE: dict[tuple[str, bool], Any] = {}


def _reference(scenario_name: str, gc_before_measure: bool):
    from kvlab.experiments import kv_pool_sizing

    key = (scenario_name, gc_before_measure)
    if key not in _REFERENCE:  # deterministic (seeded model), so one run per arm is enough
        _REFERENCE[key] = kv_pool_sizing.run(scenario_name, gc_before_measure=gc_before_measure)
    return _REFERENCE[key]


def check_measure(measure: Callable[[Sequence[Any]], Any], scenario: str = "sglang-pr-4xh200") -> CheckResult:
    """Run the start-up with ``measure`` and compare with SGLang's fixed reading (gc, empty_cache, read)."""
    from kvlab.experiments import kv_pool_sizing

    sc = kv_pool_sizing.get_scenario(scenario)
    title = f"my_measure in the {sc.name} start-up ({sc.tp_size} ranks)"
    mine = run_with_measure(measure, sc)
    if mine.function_error is not None:
        return CheckResult(title, (CheckLine("my_measure(devices)", False, given=mine.function_error,
                                             expected="free bytes (an int)",
                                             hint="fix the error and run the cell again"),))
    ref = _reference(sc.name, True)
    hint = ""
    if mine.free_bytes != ref.reading.free_bytes:
        no_gc = _reference(sc.name, False)
        if mine.free_bytes == no_gc.reading.free_bytes:
            hint = ("that is SGLang's reading before the fix: the loader's staging is still held by a reference "
                    "cycle when empty_cache() runs. What frees a cycle, and when must it run?")
        elif mine.free_bytes > ref.reading.free_bytes:
            hint = "more than the devices have free: return mem_get_info()[0], the minimum over the ranks"
        else:
            hint = ("less than is free: did every rank empty its cache after the collection? "
                    "Blocks freed after empty_cache() stay reserved in PyTorch's cache")
    lines = (
        compare("free bytes your measurement read", mine.free_bytes, ref.reading.free_bytes, hint),
        compare("max_total_num_tokens", mine.max_total_num_tokens, ref.max_total_num_tokens,
                "the pool follows from the reading: rest = available − pre_load × (1 − fraction)"),
        compare(f"a {sc.prompt_tokens:,}-token prompt accepted", mine.accepted, True,
                mine.error or ""),
    )
    note = ("The weights, the loader's reference cycle and the allocator are real; only your function "
            "decides what is collected and emptied before the reading.")
    return CheckResult(title, lines, note)


# ---- notebook 02: evict only the shortfall ---------------------------------------------------------

SHORTFALL_SOLUTION = Solution(
    "ask the tree only for what is missing",
    '''def my_shortfall(num_tokens, available):
    return max(0, num_tokens - available)  # the `available` free slots already count toward num_tokens
''')

SHORTFALL_CASES = ((600, 300), (500, 100), (300, 300), (200, 300))  # (num_tokens, free slots)


def conversation_tree(free_tokens: int, capacity_tokens: int = 4096):
    """``shortfall_eviction.conversation_tree`` with running requests holding all but ``free_tokens``
    slots. Returns (cache, allocator, holder of the running requests' slots)."""
    from kvlab.experiments.shortfall_eviction import conversation_tree as build

    tree, alloc, _names = build(capacity_tokens)
    if not 0 <= free_tokens <= alloc.available_size():
        raise ValueError(f"conversation_tree: free_tokens must be in 0..{alloc.available_size()}, got {free_tokens}")
    held = alloc.alloc(alloc.available_size() - free_tokens) if alloc.available_size() > free_tokens else None
    return tree, alloc, held


def _evict_with(fn: Callable[[int, int], Any], num_tokens: int, free: int):
    from kvlab.mem_cache.evict_policy import EvictParams

    tree, alloc, held = conversation_tree(free)
    available = alloc.available_size()
    asked = fn(num_tokens, available)
    if not isinstance(asked, numbers.Integral) or isinstance(asked, bool):
        raise TypeError(f"my_shortfall({num_tokens}, {available}) returned {asked!r}; return a number of tokens (an int)")
    evicted = tree.evict(EvictParams(num_tokens=int(asked))).evicted_tokens if asked > 0 else 0
    tree.check_invariants()
    fits = alloc.alloc(num_tokens) is not None
    del held
    return int(asked), evicted, fits


def _reference_eviction(num_tokens: int, free: int) -> int:
    from kvlab.mem_cache.common import evict_from_tree_cache

    tree, _alloc, _held = conversation_tree(free)
    return evict_from_tree_cache(tree, num_tokens, "shortfall").evicted_tokens


def check_shortfall(shortfall: Callable[[int, int], Any]) -> CheckResult:
    """Evict what ``shortfall(num_tokens, available)`` asks for in four allocations; compare the tokens
    evicted with SGLang >= 0.5.17 on the same tree."""
    title = "my_shortfall on a real radix cache, four allocations"
    lines = []
    for num, free in SHORTFALL_CASES:
        label = f"need {num:,} with {free:,} free: tokens evicted"
        try:
            asked, evicted, fits = _evict_with(shortfall, num, free)
        except Exception as exc:  # the learner's code: report it, do not raise
            lines.append(CheckLine(label, False, given=f"{type(exc).__name__}: {exc}",
                                   expected=_reference_eviction(num, free), hint="fix the error and run it again"))
            continue
        expected = _reference_eviction(num, free)
        missing = max(0, num - free)
        if evicted == expected:
            hint = ""
        elif not fits:
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
