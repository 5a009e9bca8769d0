"""The one shape of every lab step and exercise: ``run``, ``check``, ``solution``.

A notebook cell asks a learner for something (a predicted number, or a function), then:

- ``lab.run(...)`` does the experiment and returns what happened (a tour step's allocation script on a
  device; kvlab's real scenario with the learner's function plugged in);
- ``lab.check(...)`` compares the learner's answer with kvlab's model and returns a
  :class:`~kvlab.labs.check.CheckResult` (a wrong answer, or a learner function that raises, is feedback, never
  a traceback);
- ``lab.solution`` is the reference answer as code, a :class:`~kvlab.labs.solution.Solution` hidden unless
  solutions are enabled. It is an attribute, not a call, so a cell that ends with it displays it.

``answer()`` gives the values the solution's code defines under the names the learner's cell defines, and
``check_solution()`` checks them: the reference must pass its own check (instructors and tests use it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvlab.labs.check import CheckResult
from kvlab.labs.solution import Solution


@runtime_checkable
class Lab(Protocol):
    """What every lab step and exercise offers (``TourStep`` and :class:`Exercise` are the two kinds)."""

    key: str
    title: str

    @property
    def solution(self) -> Solution: ...

    def run(self, *args: Any, **kwargs: Any) -> Any: ...

    def check(self, *args: Any, **kwargs: Any) -> CheckResult: ...

    def answer(self) -> dict[str, Any]: ...

    def check_solution(self) -> CheckResult: ...


def solution_namespace(solution: Solution, **given: Any) -> dict[str, Any]:
    """Execute a solution's code (with ``given`` names in scope, e.g. ``MiB``) and return its namespace."""
    namespace: dict[str, Any] = dict(given)
    exec(solution.code, namespace)
    return namespace


@dataclass(frozen=True)
class Exercise:
    """A lab step whose answer is a function the learner writes (its name: ``function``, e.g. ``my_measure``).

    ``run(fn, **options)`` plugs ``fn`` into the scenario (``runner``); ``check(fn, **options)`` compares it
    with the reference (``checker``); both take the learner's function first."""

    key: str
    title: str
    function: str
    solution: Solution
    runner: Callable[..., Any]
    checker: Callable[..., CheckResult]

    def run(self, fn: Callable[..., Any], **options: Any) -> Any:
        return self.runner(fn, **options)

    def check(self, fn: Callable[..., Any], **options: Any) -> CheckResult:
        return self.checker(fn, **options)

    def answer(self) -> dict[str, Any]:
        return {self.function: solution_namespace(self.solution)[self.function]}

    def check_solution(self) -> CheckResult:
        return self.check(self.answer()[self.function])
