"""Notebook 01's exercise, :data:`measure`: the reading SGLang sizes its KV pool from, written by the learner.

The learner writes ``my_measure(devices) -> free bytes``. The start-up of ``kv_pool_sizing`` runs with it in
place of ``get_available_gpu_memory``: the same weights and loader (with its reference cycle) on the same
simulated ranks, so whether the learner's ``gc.collect()`` frees the staging is decided by Python's real
collector, not by a flag.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.device.measure import MemoryReading
from kvlab.experiments import kv_pool_sizing as experiment
from kvlab.labs.check import CheckLine, CheckResult, compare
from kvlab.labs.lab import Exercise
from kvlab.labs.solution import Solution


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
    """``kvlab.experiments.kv_pool_sizing.run``'s start-up with ``measure(devices)`` as the post-load reading.

    ``devices``: the scenario's tensor-parallel ranks (kvlab devices: ``empty_cache()``,
    ``mem_get_info() -> (free, total)``, ``memory_allocated()``...). ``measure`` returns free bytes
    (an int) or a ``MemoryReading``. The automatic collector is paused as in ``run`` (an explicit
    ``gc.collect()`` still works), so only what ``measure`` does decides what is freed.
    """
    def guarded(ranks):
        try:
            given = measure(ranks)
        except Exception as exc:  # the learner's code: report it, do not raise
            raise _LearnerError(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(given, MemoryReading) or (isinstance(given, numbers.Integral) and not isinstance(given, bool)):
            return given
        raise _LearnerError(f"it returned {given!r}; return the free bytes, an int (mem_get_info()[0])")

    try:
        result = experiment.run(scenario, measure=guarded)
    except _LearnerError as exc:
        return MeasuredStartup(None, 0, False, None, str(exc))
    tokens = result.budget.max_total_num_tokens if result.budget is not None else 0
    return MeasuredStartup(result.reading.free_bytes, tokens, result.accepted, result.error)


_REFERENCE: dict[tuple[str, bool], Any] = {}


def _reference(scenario_name: str, gc_before_measure: bool):
    key = (scenario_name, gc_before_measure)
    if key not in _REFERENCE:  # deterministic (seeded model), so one run per arm is enough
        _REFERENCE[key] = experiment.run(scenario_name, gc_before_measure=gc_before_measure)
    return _REFERENCE[key]


def check_measure(measure: Callable[[Sequence[Any]], Any], scenario: str = "sglang-pr-4xh200") -> CheckResult:
    """Run the start-up with ``measure`` and compare with SGLang's fixed reading (gc, empty_cache, read)."""
    sc = experiment.get_scenario(scenario)
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


measure = Exercise(
    "measure", "measure after collecting", "my_measure",
    Solution("collect, then empty the cache, then read", """import gc

def my_measure(devices):
    gc.collect()          # break the loader's reference cycle: its staging tensors die ...
    for d in devices:
        d.empty_cache()   # ... so their now-unreferenced blocks can go back to the driver
    return min(d.mem_get_info()[0] for d in devices)  # free bytes; SGLang takes the MIN over TP ranks
"""),
    runner=run_with_measure, checker=check_measure,
)
LABS = (measure,)
