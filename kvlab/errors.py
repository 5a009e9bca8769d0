"""kvlab's error types that more than one layer raises.

``KvlabError`` is the base of errors a user can act on (a bad file, a bad value); ``InvariantError``
is what every ``check_invariants()`` raises when the bookkeeping is inconsistent (a kvlab bug, not a
user error). Invariant checks never use ``assert``: ``python -O`` strips asserts, and a check that
vanishes under ``-O`` is no check. ``require`` is the one way they test a rule.
"""

from __future__ import annotations

from typing import Any


class KvlabError(Exception):
    """Base of kvlab's own errors."""


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
