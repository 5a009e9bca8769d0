"""What a ``check()`` cell returns: one :class:`CheckLine` per compared quantity, gathered in a :class:`CheckResult`.

A check compares a learner's prediction (or their function's output) with what kvlab's model
computes and says, line by line, what is right and what is not. It never raises for a wrong
answer (the learner should read the feedback, not a traceback); :meth:`CheckResult.raise_if_wrong`
is for tests and for instructors who want a hard stop.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from kvlab.labs.solution import app_command, in_app, solutions_enabled


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

    def app_note(self) -> str:
        """On a ``kvlab app`` page (code hidden) a step not yet passed says where its code can be changed."""
        if self.ok or not in_app():
            return ""
        if solutions_enabled():
            return "Open the solution below to read its code; to change your own, open the notebook in JupyterLab."
        return ("The code of this exercise is hidden on this page: open the notebook in JupyterLab to change it"
                f" (the instructor can serve the page with {app_command()}).")

    def text(self) -> str:
        head = f"{'PASS' if self.ok else 'NOT YET'} · {self.title}"
        body = [line.text() for line in self.lines]
        body += [n for n in (self.note, self.app_note()) if n]
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
        if self.app_note():
            note += f"<div class='kvlab-app-note'><i>{html.escape(self.app_note())}</i></div>"
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


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return repr(value)
