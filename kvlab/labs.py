"""Lab steps and exercises: what a ``check()`` cell returns, and the solutions switch.

A check compares a learner's prediction (or their function's output) with what kvlab's model
computes and says, line by line, what is right and what is not. It never raises for a wrong
answer (the learner should read the feedback, not a traceback); :meth:`CheckResult.raise_if_wrong`
is for tests and for instructors who want a hard stop.

Solutions are hidden by default. Instructors run a notebook with ``KVLAB_SOLUTIONS=1`` (or call
:func:`set_solutions`) to show them, e.g. ``KVLAB_SOLUTIONS=1 jupyter lab``.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from typing import Any

_SOLUTIONS_ENV = "KVLAB_SOLUTIONS"
_solutions_override: bool | None = None


class ExerciseError(AssertionError):
    """A check that failed, raised only by :meth:`CheckResult.raise_if_wrong`."""


@dataclass(frozen=True)
class CheckLine:
    """One compared quantity: what the learner gave, what the model says, and whether they agree."""

    label: str
    ok: bool
    given: Any = None
    expected: Any = None
    hint: str = ""

    def text(self) -> str:
        mark = "✔" if self.ok else "✘"
        if self.ok:
            return f"{mark} {self.label}: {_fmt(self.given)}"
        extra = f" — {self.hint}" if self.hint else ""
        if self.given is None and self.expected is None:  # nothing predicted yet; the answer stays hidden
            return f"{mark} {self.label}: no answer yet{extra}"
        return f"{mark} {self.label}: you gave {_fmt(self.given)}, the model says {_fmt(self.expected)}{extra}"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one ``check()``: all lines must be ok for the step to pass."""

    title: str
    lines: tuple[CheckLine, ...] = field(default_factory=tuple)
    note: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.lines) and all(line.ok for line in self.lines)

    @property
    def wrong(self) -> tuple[CheckLine, ...]:
        return tuple(line for line in self.lines if not line.ok)

    def text(self) -> str:
        head = f"{'PASS' if self.ok else 'NOT YET'} · {self.title}"
        body = [line.text() for line in self.lines]
        if self.note:
            body.append(self.note)
        return "\n".join([head, *("  " + b for b in body)])

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.ok else "#b35900"
        rows = "".join(
            f"<li style='color:{'#1a7f37' if line.ok else '#b35900'}'>{html.escape(line.text())}</li>"
            for line in self.lines)
        note = f"<div>{html.escape(self.note)}</div>" if self.note else ""
        status = "PASS" if self.ok else "NOT YET"
        return (f"<div class='kvlab-check kvlab-check-{'pass' if self.ok else 'fail'}' "
                f"style='border-left:4px solid {colour};padding:4px 10px'>"
                f"<b style='color:{colour}'>{status}</b> · {html.escape(self.title)}<ul>{rows}</ul>{note}</div>")

    def raise_if_wrong(self) -> CheckResult:
        if not self.ok:
            raise ExerciseError(self.text())
        return self


def compare(label: str, given: Any, expected: Any, hint: str = "") -> CheckLine:
    """A :class:`CheckLine` for ``given == expected`` (exact: kvlab's numbers are integers)."""
    return CheckLine(label=label, ok=given == expected, given=given, expected=expected, hint=hint)


def solutions_enabled() -> bool:
    """True when solutions should be shown: :func:`set_solutions` wins, else ``KVLAB_SOLUTIONS``."""
    if _solutions_override is not None:
        return _solutions_override
    return os.environ.get(_SOLUTIONS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def set_solutions(enabled: bool | None) -> None:
    """Force solutions on/off for this kernel; ``None`` goes back to the environment variable."""
    global _solutions_override
    _solutions_override = enabled


@dataclass(frozen=True)
class Solution:
    """A solution shown only when solutions are enabled; otherwise a one-line placeholder."""

    title: str
    code: str

    def _repr_html_(self) -> str:
        if not solutions_enabled():
            return ("<div class='kvlab-solution-hidden'><i>Solution hidden. Instructors: run with "
                    f"<code>{_SOLUTIONS_ENV}=1</code> to show it.</i></div>")
        return (f"<details open class='kvlab-solution'><summary>Solution · {html.escape(self.title)}</summary>"
                f"<pre>{html.escape(self.code)}</pre></details>")

    def __repr__(self) -> str:
        if not solutions_enabled():
            return f"Solution hidden (run with {_SOLUTIONS_ENV}=1 to show it)."
        return f"Solution · {self.title}\n{self.code}"


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return repr(value)
