"""Which readings of a start-up log were printed by the server and which were rebuilt (reconstructed) by someone.

A log kvlab renders from a public report shows numbers the report printed beside readings the report did not show
and kvlab chose (``kvlab.serving.examples``: vllm-project/vllm#21348's free memory before/after loading). Such a
log says so in one line of its own, which neither SGLang nor vLLM prints and both parsers skip::

    # kvlab-reconstructed: free_before_load, free_after_load — vllm#21348 did not print them; kvlab chose them

the names of the readings (``READINGS``; ``NAME@RANK`` for one worker's reading only), then, after " — ", why.
Every number derived from a named reading is marked *assumed* wherever it shows: a ``Finding`` or
``WaterfallTerm`` (``assumed``: the assumed inputs it rests on, in words; ``basis``: "assumed" or "read"), a
comparison ``Term`` and gap row, their text, figures and tables. A user's own log has no such line: all read.
"""

from __future__ import annotations

import re

from kvlab.errors import KvlabError

MARKER = "# kvlab-reconstructed:"
READINGS = {  # name in the marker line -> the reading in words
    "free_before_load": "free memory before loading ('Load weight begin' avail mem)",
    "free_after_load": "free memory after loading ('Load weight end' avail mem)",
    "model_loading": "what loading took ('Model loading took')",
    "available": "available KV cache memory ('Available KV cache memory')",
}


class MarkerError(KvlabError, ValueError):
    """A ``# kvlab-reconstructed:`` line naming a reading kvlab does not know; the message names file:line."""


_NAME = re.compile(r"^([a-z_]+)(?:@(\d{1,6}))?$")


def parse_reconstructed(text: str, path: str = "<log>") -> dict[str, str]:
    """``{name or name@rank: why}`` from the log's ``# kvlab-reconstructed:`` lines ({} where there are none);
    an unknown reading name is a :class:`MarkerError` naming file:line and the name."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith(MARKER):
            continue
        names, _, why = line[len(MARKER):].partition(" — ")
        why = why.strip() or "rebuilt, not printed by the server"
        for name in (n.strip() for n in names.split(",")):
            m = _NAME.match(name)
            if not m or m.group(1) not in READINGS:
                raise MarkerError(f"{path}:{number}: {MARKER} names {name[:40]!r}, not a reading kvlab knows "
                               f"(one of {', '.join(READINGS)}, optionally NAME@RANK)")
            out[name] = why
    return out


def marker_line(names, why: str) -> str:
    """The line a rendered log carries (see the module docstring)."""
    for name in names:
        m = _NAME.match(name)
        if not m or m.group(1) not in READINGS:
            raise ValueError(f"unknown reading {name!r}")
    return f"{MARKER} {', '.join(names)} — {why}"


def rebuilt_why(marks: dict[str, str], name: str, rank=None) -> str | None:
    """Why reading ``name`` (on worker ``rank`` where given) was rebuilt; None where it was read."""
    return marks.get(name) or (marks.get(f"{name}@{rank}") if rank is not None else None)


def assumed_words(name: str, value_gib: float | None) -> str:
    """One rebuilt reading in words, as findings, terms and tables list it (the why is printed once, apart)."""
    what = READINGS[name].split(" (")[0]
    shown = "" if value_gib is None else f" {value_gib:.2f} GiB"
    return f"{what}{shown} (rebuilt, not printed by the server)"
