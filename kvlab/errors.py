"""kvlab's error types that more than one layer raises: two kinds, a user's mistake and a kvlab bug.

``KvlabError`` is the base of errors a user can act on (a bad file, a bad value, a scenario that runs out
of memory): the CLI prints them as one ``kvlab: error:`` line and exits 2. ``KvlabBug`` is the base of
errors that mean kvlab itself is wrong, never the user: ``InvariantError`` (what every
``check_invariants()`` raises when the bookkeeping is inconsistent), ``DoubleFreeError`` and
``LockRefError`` (misuse of the KV memory API by kvlab's own code). The CLI never reports a ``KvlabBug``
as a user error: like any unexpected exception it prints one line, saves the traceback and exits 3
(kvlab/cli/__init__.py ``main``). The bugs keep their builtin bases (``AssertionError``, ``ValueError``,
``RuntimeError``) so code that catches those still catches them. Invariant checks never use ``assert``: ``python -O`` strips asserts, and a check that
vanishes under ``-O`` is no check. ``require`` is the one way they test a rule.
"""

from __future__ import annotations

import sys
from typing import Any

from kvlab.safe_text import printable


class KvlabError(Exception):
    """Base of the errors a user can act on: a bad input (naming the file, line or field) or a scenario
    the inputs make impossible."""


class KvlabBug(Exception):
    """Base of the errors that are kvlab's fault, never the user's (a broken invariant, a double free).

    Never a ``KvlabError``: the CLI gives them the unexpected-error path (exit 3, traceback saved)."""


def fail(message: object) -> int:
    """The one way a ``kvlab`` subcommand reports an error the user can act on: ``kvlab: error: …`` on stderr.

    Returns 2, the exit status of a usage error, so a command can ``return fail(exc)``."""
    print(f"kvlab: error: {printable(message, lines=True)}", file=sys.stderr)  # a file's ESC[2J is shown, not obeyed
    return 2


class InvariantError(KvlabBug, AssertionError):
    """A ``check_invariants()`` found a broken rule.

    ``invariant`` names the rule in words and ``values`` holds the numbers that broke it. It stays an
    ``AssertionError`` so code that caught the old asserts keeps working.
    """

    def __init__(self, invariant: str, **values: Any) -> None:
        self.invariant = invariant
        self.values = values
        detail = ", ".join(f"{k}={v!r}" for k, v in values.items())
        super().__init__(f"invariant broken: {invariant}" + (f" ({detail})" if detail else ""))


def require(condition: object, invariant: str, **values: Any) -> None:
    """Raise ``InvariantError(invariant, **values)`` unless ``condition`` holds (survives ``python -O``)."""
    if not condition:
        raise InvariantError(invariant, **values)


class DoubleFreeError(KvlabBug, ValueError):
    """An index (KV slot, page, request row or recurrent-state slot) was freed that is not currently
    allocated. SGLang frees silently and would later hand the index out twice."""


class LockRefError(KvlabBug, RuntimeError):
    """``inc_lock_ref`` / ``dec_lock_ref`` misuse: unlocking an unlocked node, or a node that was
    evicted or belongs to another tree (SGLang lets ``lock_ref`` go negative)."""
