"""kvlab's error types that more than one layer raises.

``KvlabError`` is the base of errors a user can act on (a bad file, a bad value); ``InvariantError``
is what every ``check_invariants()`` raises when the bookkeeping is inconsistent (a kvlab bug, not a
user error). ``DoubleFreeError`` and ``LockRefError`` are misuse of the KV memory API (pools,
allocators, prefix caches): they keep their builtin bases, so ``except ValueError`` /
``except RuntimeError`` still catch them. Invariant checks never use ``assert``: ``python -O`` strips asserts, and a check that
vanishes under ``-O`` is no check. ``require`` is the one way they test a rule.
"""

from __future__ import annotations

import sys
from typing import Any

from kvlab.safe_text import printable


class KvlabError(Exception):
    """Base of kvlab's own errors."""


def fail(message: object) -> int:
    """The one way a ``kvlab`` subcommand reports an error the user can act on: ``kvlab: error: …`` on stderr.

    Returns 2, the exit status of a usage error, so a command can ``return fail(exc)``."""
    print(f"kvlab: error: {printable(message, lines=True)}", file=sys.stderr)  # a file's ESC[2J is shown, not obeyed
    return 2


class InvariantError(KvlabError, AssertionError):
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


class DoubleFreeError(ValueError):
    """An index (KV slot, page, request row or recurrent-state slot) was freed that is not currently
    allocated. SGLang frees silently and would later hand the index out twice."""


class LockRefError(RuntimeError):
    """``inc_lock_ref`` / ``dec_lock_ref`` misuse: unlocking an unlocked node, or a node that was
    evicted or belongs to another tree (SGLang lets ``lock_ref`` go negative)."""
