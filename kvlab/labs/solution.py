"""The solutions switch: a lab's :class:`Solution` is hidden by default.

Instructors run a notebook with ``KVLAB_SOLUTIONS=1`` (or call :func:`set_solutions`) to show them,
e.g. ``KVLAB_SOLUTIONS=1 jupyter lab``, or serve it with ``kvlab app 02 --solutions`` (a workshop).

In ``kvlab app`` (``KVLAB_APP=1``, set by :func:`kvlab.app.app_env`) the page hides the code, so a learner cannot
edit an exercise there: a solution is offered folded ("show the solution", a ``<details>`` they open when they
want it), and a hidden one says how the instructor serves the page with solutions.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass

_SOLUTIONS_ENV = "KVLAB_SOLUTIONS"
APP_ENV = "KVLAB_APP"  # = kvlab.app.APP_ENV (that module imports kvlab.report; this one stays light)
APP_NOTEBOOK_ENV = "KVLAB_APP_NOTEBOOK"  # the notebook's number in `kvlab app` (kvlab.app.app_env), e.g. "02"
_solutions_override: bool | None = None


def solutions_enabled() -> bool:
    """True when solutions should be shown: :func:`set_solutions` wins, else ``KVLAB_SOLUTIONS``."""
    if _solutions_override is not None:
        return _solutions_override
    return os.environ.get(_SOLUTIONS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def in_app() -> bool:
    """True in a kernel of ``kvlab app`` (a Voila page: outputs only, the code hidden)."""
    return os.environ.get(APP_ENV, "") == "1"


def app_command() -> str:
    """The command that serves this page with solutions: ``kvlab app 02 --solutions`` (the number from
    ``KVLAB_APP_NOTEBOOK``; without it, the notebook's name is left to the reader)."""
    number = os.environ.get(APP_NOTEBOOK_ENV, "").strip()
    return f"kvlab app {number} --solutions" if number.isdigit() else "kvlab app <notebook number> --solutions"


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
            how = (f"serve this page with <code>{html.escape(app_command())}</code>" if in_app() else
                   f"run with <code>{_SOLUTIONS_ENV}=1</code>")
            return f"<div class='kvlab-solution-hidden'><i>Solution hidden. Instructors: {how} to show it.</i></div>"
        if in_app():  # a workshop page: folded, the learner opens it when they want it
            return (f"<details class='kvlab-solution'><summary><b>Show the solution</b> · {html.escape(self.title)}"
                    f"</summary><pre>{html.escape(self.code)}</pre></details>")
        return (f"<details open class='kvlab-solution'><summary>Solution · {html.escape(self.title)}</summary>"
                f"<pre>{html.escape(self.code)}</pre></details>")

    def __repr__(self) -> str:
        if not solutions_enabled():
            return f"Solution hidden (run with {_SOLUTIONS_ENV}=1 to show it)."
        return f"Solution · {self.title}\n{self.code}"
