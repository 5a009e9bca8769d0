"""Argument checks for the helpers the notebooks call (``host_tier.make_cache``, ``run_script``, ``pressure_event``):
a value a learner might type (``num_tokens=5000``, ``host_ratio=1e6``, ``num_requests=10**7``) is refused at the
call, naming the helper, the argument, its value and the range, instead of failing deep inside (``alloc(-1778)``,
``MemoryError``) or running for minutes."""

from __future__ import annotations

import math
from typing import Any

from kvlab.errors import KvlabError


class HelperArgumentError(KvlabError, ValueError):
    """A notebook helper given an argument out of its range; the message names the helper and the argument."""


def check_int(helper: str, name: str, value: Any, lo: int, hi: int, why: str = "") -> int:
    """``value`` if it is an int in [``lo``, ``hi``], else :class:`HelperArgumentError` (``why``: what the range
    comes from, said after it)."""
    if type(value) is not int or not lo <= value <= hi:
        raise HelperArgumentError(f"{helper}({name}={value!r}): expected an integer from {lo:,} to {hi:,}"
                                  f"{'; ' + why if why else ''}")
    return value


def check_number(helper: str, name: str, value: Any, hi: float, why: str = "") -> float:
    """``value`` if it is a finite number in (0, ``hi``], else :class:`HelperArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= hi:
        raise HelperArgumentError(f"{helper}({name}={value!r}): expected a number in (0, {hi:,g}]"
                                  f"{'; ' + why if why else ''}")
    return value


def check_event_tokens(helper: str, num_tokens: Any, capacity: int, free: int) -> int:
    """A pressure event's allocation: running requests keep ``num_tokens // 2`` of the ``free`` slots the tree
    leaves, so ``num_tokens`` is at most ``2 * free + 1``."""
    return check_int(helper, "num_tokens", num_tokens, 1, 2 * free + 1,
                     f"the tree leaves {free:,} of capacity={capacity:,} slots free, and the event keeps num_tokens "
                     "// 2 of them free; raise capacity for a larger event")
