"""Text from user files, made safe to print on a terminal.

A model name, a snapshot key, a file name or a trace field can hold terminal control sequences: printed raw,
``ESC[2J`` clears the screen (and could hide what came before "all checks passed"), ``ESC]...`` retitles the
window, a carriage return overwrites the line, a bidi override reorders it. :func:`printable` writes each such
character as its Python escape (``\\x1b``, ``\\r``, ``\\u202e``), so the text reads as what the file holds.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL; the Unicode bidi embeddings, overrides and isolates; line/paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    return repr(match.group())[1:-1]


def printable(text: object, *, lines: bool = False) -> str:
    """``str(text)`` with every control character written as its escape (``ESC`` → ``\\x1b``). ``lines=True`` keeps
    newlines and tabs (for kvlab's own multi-line output that embeds user strings); the default escapes them too,
    so a one-line value cannot start a line of its own."""
    return (_CONTROL_BUT_LINES if lines else _CONTROL).sub(_escape, str(text))


__all__ = ["printable"]
