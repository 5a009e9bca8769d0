"""argparse value types shared by kvlab's command lines (``kvlab`` and ``python -m kvlab.experiments.*``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

#: the largest count any kvlab flag takes (tokens, pages, requests): 2^31 - 1, far above any real pool, and small enough
#: that a value is never an overflow deep inside torch or numpy (which was a traceback, issue 26)
MAX_COUNT = (1 << 31) - 1


def int_at_least(minimum: int, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [``minimum``, ``maximum``], else a message naming the value given."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected at most {maximum:,}, got {text.strip()[:40]}")
        return value

    parse.__name__ = f"int>={minimum}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)
