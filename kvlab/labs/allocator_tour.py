"""Notebook 00's six lab steps: predict a number, ``run()`` an allocation script, ``check()`` the prediction.

The scripts are ``kvlab.experiments.allocator_tour``'s (they run on any device and return a ``StepRun``);
each :class:`TourStep` adds what the learner predicts, the hints and the solution. A check compares the
predictions with the *model*: the same step replayed on a simulated device (:data:`MODEL_DEVICE`). When the
shown run came from a real GPU, the check also says whether the GPU agreed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kvlab.experiments.allocator_tour import (
    StepRun,
    run_expandable,
    run_fragmentation,
    run_gc_cycle,
    run_pools,
    run_rounding,
    run_splitting,
)
from kvlab.labs.check import CheckLine, CheckResult, compare
from kvlab.labs.lab import solution_namespace
from kvlab.labs.solution import Solution
from kvlab.units import KiB, MiB

MODEL_DEVICE = "sim:h200"  # what check() compares with


def _predicted(name: str) -> str:
    return f"predicted_{name}"


def _label(name: str) -> str:
    return name.removesuffix("_bytes").replace("_", " ") + (" (bytes)" if name.endswith("_bytes") else "")


@dataclass(frozen=True)
class TourStep:
    """One lab step (a :class:`kvlab.labs.Lab`): ``run()`` it (any device), then ``check()`` your predictions
    against the model.

    ``predictions`` are fact names; the learner's variables are ``predicted_<name>``."""

    key: str
    title: str
    script: Callable[..., StepRun]
    predictions: tuple[str, ...]
    hints: dict[str, str]
    solution_code: str

    def run(self, device_name: str | None = None, **options: Any) -> StepRun:
        return self.script(device_name, **options)

    def model_facts(self) -> dict[str, int]:
        """The facts of this step on the model (``MODEL_DEVICE``), computed once per kernel."""
        return dict(_model_facts(self.key))

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(_predicted(name) for name in self.predictions)

    def check(self, run: StepRun | None = None, **predicted: Any) -> CheckResult:
        """Compare ``predicted_<name>=...`` keywords with the model. ``None`` means "not written yet"
        (the step is NOT YET passed, nothing is revealed). With ``run`` from a real GPU, one more
        line says whether that GPU gave the model's numbers."""
        unknown = sorted(set(predicted) - set(self.variables))
        if unknown:
            raise TypeError(f"{self.key}.check(): unknown prediction(s) {unknown}; expected {list(self.variables)}")
        expected = self.model_facts()
        lines: list[CheckLine] = []
        missing = []
        for name in self.predictions:
            given = predicted.get(_predicted(name))
            if given is None:
                missing.append(_predicted(name))
                lines.append(CheckLine(_label(name), False, None, None,
                                       f"write your prediction: {_predicted(name)} = ..."))
            elif isinstance(given, bool) or not isinstance(given, (int, float)):
                lines.append(CheckLine(_label(name), False, given, "a number",
                                       f"{_predicted(name)} must be a number (bytes or a count), "
                                       f"got {type(given).__name__}"))
            else:
                lines.append(compare(_label(name), given, expected[name], self.hints.get(name, "")))
        if run is not None and run.device_kind != "sim":
            shown = {k: run.facts[k] for k in expected}
            lines.append(CheckLine(f"{run.device_name} agrees with the model", shown == expected, shown, expected,
                                   "the real allocator differs from kvlab's model: please report it"))
        note = ("Write your predictions in the cell above (" + ", ".join(missing) + "), then run both cells again."
                if missing else "")
        return CheckResult(self.title, tuple(lines), note)

    @property
    def solution(self) -> Solution:
        return Solution(self.title, self.solution_code)

    def answer(self) -> dict[str, Any]:
        """The solution's predictions, ``{"predicted_<name>": value}`` (its code runs with ``KiB``/``MiB``)."""
        namespace = solution_namespace(self.solution, KiB=KiB, MiB=MiB)
        return {name: namespace[name] for name in self.variables}

    def check_solution(self) -> CheckResult:
        return self.check(**self.answer())


@cache
def _model_facts(key: str) -> tuple[tuple[str, int], ...]:
    return tuple(STEPS[key].run(MODEL_DEVICE).facts.items())


rounding = TourStep(
    "rounding", "1 · 512 B rounding", run_rounding, ("allocated_bytes", "reserved_bytes"),
    {
        "allocated_bytes": "each request rounds up to a multiple of 512 B (1 B -> 512 B, 513 B -> 1024 B); "
                           "memory_allocated() sums the rounded sizes",
        "reserved_bytes": "all five are small requests (<= 1 MiB): they share one 2 MiB small segment",
    },
    "predicted_allocated_bytes = 512 + 512 + 1024 + 1024 + 4608  # = 7,680: round_size to 512 B\n"
    "predicted_reserved_bytes = 2 * MiB  # one small-pool segment holds them all",
)
pools = TourStep(
    "pools", "2 · small and large pools", run_pools, ("small_segments", "large_segments", "reserved_bytes"),
    {
        "small_segments": "1 MiB exactly is still small (<= 1 MiB); 300 KiB fits in the same 2 MiB segment",
        "large_segments": "1 MiB + 1 B rounds to 1 MiB + 512 B: large pool, a 20 MiB segment; 25 MiB does not fit "
                          "its ~19 MiB rest and gets a new segment",
        "reserved_bytes": "2 MiB (small) + 20 MiB (large, for requests < 10 MiB) + 26 MiB (25 MiB rounded up to 2 MiB)",
    },
    "predicted_small_segments = 1  # 1 MiB and 300 KiB share one 2 MiB segment\n"
    "predicted_large_segments = 2  # 1 MiB + 512 B -> 20 MiB segment; 25 MiB -> its own 26 MiB segment\n"
    "predicted_reserved_bytes = (2 + 20 + 26) * MiB  # = 48 MiB",
)
splitting = TourStep(
    "splitting", "3 · splitting, and a live block pins its segment", run_splitting,
    ("reserved_bytes", "largest_free_block_bytes"),
    {
        "reserved_bytes": "empty_cache() only releases segments with no live block; the 2 MiB block pins all 20 MiB",
        "largest_free_block_bytes": "the free 8 MiB and 10 MiB pieces sit on either side of the live 2 MiB block and "
                                    "cannot merge: 18 MiB free, but 10 MiB contiguous",
    },
    "predicted_reserved_bytes = 20 * MiB  # the whole segment stays: 'pin' lives in it\n"
    "predicted_largest_free_block_bytes = 10 * MiB  # [8 MiB free | 2 MiB pin | 10 MiB free]",
)
fragmentation = TourStep(
    "fragmentation", "4 · fragmentation: same bytes, different order", run_fragmentation,
    ("reserved_ascending_bytes", "reserved_descending_bytes"),
    {
        "reserved_ascending_bytes": "2 MiB opens a 20 MiB segment; 4 MiB and then 14 MiB fill its rest exactly",
        "reserved_descending_bytes": "14 MiB (>= 10 MiB) gets a segment of exactly 14 MiB; 4 MiB then needs a new "
                                     "20 MiB segment, which 2 MiB shares: 14 + 20",
    },
    "predicted_reserved_ascending_bytes = 20 * MiB  # 2 + 4 + 14 fill one 20 MiB segment\n"
    "predicted_reserved_descending_bytes = 34 * MiB  # a 14 MiB segment, then a 20 MiB one",
)
gc_cycle = TourStep(
    "gc_cycle", "5 · empty_cache before and after gc.collect()", run_gc_cycle,
    ("reserved_before_gc_bytes", "reserved_after_gc_bytes"),
    {
        "reserved_before_gc_bytes": "after `del` the cycle still references the tensor, so its block is allocated and "
                                    "empty_cache() cannot release its 40 MiB segment",
        "reserved_after_gc_bytes": "gc.collect() breaks the cycle, the storage dies, the block is freed and the next "
                                   "empty_cache() returns the segment",
    },
    "predicted_reserved_before_gc_bytes = 40 * MiB  # still referenced by the cycle: allocated, pinned\n"
    "predicted_reserved_after_gc_bytes = 0  # collected, freed, released",
)
expandable = TourStep(
    "expandable", "6 · expandable segments off and on", run_expandable, ("reserved_off_bytes", "reserved_on_bytes"),
    {
        "reserved_off_bytes": "each cached block is too small for the next, bigger buffer: a new segment each time "
                              "(30 + 32 + 34 MiB)",
        "reserved_on_bytes": "one segment grows by 20 MiB pages: 30 MiB maps 2 pages (40 MiB) and 32 and 34 MiB "
                             "reuse them",
    },
    "predicted_reserved_off_bytes = (30 + 32 + 34) * MiB  # = 96 MiB, two of them cached and useless\n"
    "predicted_reserved_on_bytes = 40 * MiB  # two 20 MiB pages, reused",
)

STEPS: dict[str, TourStep] = {s.key: s for s in (rounding, pools, splitting, fragmentation, gc_cycle, expandable)}
LABS = tuple(STEPS.values())
