"""The solutions switch: a lab's :class:`Solution` is hidden by default.

Instructors run a notebook with ``KVLAB_SOLUTIONS=1`` (or call :func:`set_solutions`) to show them,
e.g. ``KVLAB_SOLUTIONS=1 jupyter lab``.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass

_SOLUTIONS_ENV = "KVLAB_SOLUTIONS"
_solutions_override: bool | None = None


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
