"""argparse value types shared by kvlab's command lines (``kvlab`` and ``python -m kvlab.experiments.*``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum``, else a message naming the value given."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = f"int>={minimum}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)
