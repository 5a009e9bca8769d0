"""Notebook 07's exercise, :data:`write_back`: what device eviction does to a leaf under ``write_back``.

The learner writes ``my_write_back_evict(backed_up, node_tokens, host_free_tokens, host_evictable_tokens)``
returning one of ``"demote"``, ``"write then demote"`` or ``"destroy"`` (the notebook's starter is the rule of the
write-through policies: demote what is backed up, destroy the rest). Each case of :data:`WRITE_BACK_CASES` is built
on a real ``HiRadixCache`` (``host_tier.write_back_leaf_eviction``): one unlocked device leaf, a host pool with
``host_free_tokens`` free and a host-only leaf of ``host_evictable_tokens`` it may evict; the tree evicts the leaf
and the learner's answer is compared with what became of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlab.experiments.host_tier import DEMOTE, DESTROY, EVICTION_OUTCOMES, WRITE_THEN_DEMOTE, write_back_leaf_eviction
from kvlab.labs.check import CheckLine, CheckResult, compare
from kvlab.labs.lab import Exercise
from kvlab.labs.solution import Solution

# (backed_up, node_tokens, host_free_tokens, host_evictable_tokens)
WRITE_BACK_CASES = (
    (False, 300, 1000, 0),  # room on host: written, then demoted
    (True, 300, 0, 0),  # already on host: demoted, nothing to write, however full the host pool is
    (False, 300, 100, 0),  # no room, nothing to evict on host: destroyed
    (False, 300, 100, 250),  # room once a host-only leaf is evicted: written, then demoted
    (False, 300, 100, 150),  # not even then: destroyed (and the host leaf was evicted for nothing)
)


@dataclass(frozen=True)
class WriteBackAnswer:
    """One case of :func:`run_with_write_back`: the learner's answer (or ``error``) and the real outcome."""

    case: tuple[bool, int, int, int]
    given: Any
    outcome: str
    host_evicted_tokens: int
    error: str | None = None


def run_with_write_back(fn: Callable[[bool, int, int, int], Any]) -> tuple[WriteBackAnswer, ...]:
    """Each of :data:`WRITE_BACK_CASES`: ask ``fn(*case)``, and evict the leaf on a real ``HiRadixCache``."""
    out = []
    for case in WRITE_BACK_CASES:
        real = write_back_leaf_eviction(*case)
        try:
            out.append(WriteBackAnswer(case, fn(*case), real.outcome, real.host_evicted_tokens))
        except Exception as exc:  # the learner's code: report it, do not raise
            out.append(WriteBackAnswer(case, None, real.outcome, real.host_evicted_tokens,
                                       f"{type(exc).__name__}: {exc}"))
    return tuple(out)


def _hint(a: WriteBackAnswer) -> str:
    """A nudge towards the case's outcome, never the rule itself (the check's note states it once passed)."""
    backed_up, n, free, evictable = a.case
    if a.given not in EVICTION_OUTCOMES:
        return f"answer one of {', '.join(repr(o) for o in EVICTION_OUTCOMES)}"
    if a.outcome == DEMOTE:
        return "this leaf already has a host copy: what is left to do before its device slots are freed?"
    if a.outcome == WRITE_THEN_DEMOTE:
        if a.given == DESTROY:
            more = " (and what could host eviction free?)" if evictable else ""
            return (f"write_through destroys a leaf without a host copy; write_back has not written this one yet. "
                    f"Is there room on host for its {n:,} tokens{more}?")
        return "it has no host copy yet: something must happen before it can live on host"
    return f"could the host pool make room for {n:,} tokens here{', counting what host eviction frees' if evictable else ''}?"


def check_write_back(fn: Callable[[bool, int, int, int], Any]) -> CheckResult:
    """Compare ``fn``'s answer with a real ``HiRadixCache`` under ``write_back`` in each case. A wrong line gets a
    hint, a question; the rule is stated in the note only once every case passes."""
    lines = []
    for a in run_with_write_back(fn):
        backed_up, n, free, evictable = a.case
        label = (f"{'backed-up' if backed_up else 'unbacked'} leaf of {n:,} tokens, host {free:,} free"
                 f"{f' + {evictable:,} in a host-only leaf' if evictable else ''}")
        if a.error is not None:
            lines.append(CheckLine(label, False, given=a.error, expected=a.outcome,
                                   hint="fix the error and run it again"))
            continue
        lines.append(compare(label, a.given, a.outcome, "" if a.given == a.outcome else _hint(a)))
    note = ("write_through and write_through_selective never write at eviction time: an unbacked leaf is simply "
            "destroyed there. write_back writes it, and destroys it only when the host pool has no room even after "
            "evicting host-only leaves.") if all(line.ok for line in lines) else ""
    return CheckResult("my_write_back_evict on a real HiRadixCache (write_back), five leaves", tuple(lines), note)


write_back = Exercise(
    "write_back", "device eviction under write_back", "my_write_back_evict",
    Solution("demote if backed up; else write if it fits (after host eviction); else destroy",
             """def my_write_back_evict(backed_up, node_tokens, host_free_tokens, host_evictable_tokens):
    if backed_up:  # a host copy exists: free the device slots, keep the node on host
        return "demote"
    if node_tokens <= host_free_tokens + host_evictable_tokens:  # evict_host makes room, then write it
        return "write then demote"
    return "destroy"  # the host pool stays full: dropped from both tiers
"""),
    runner=run_with_write_back, checker=check_write_back,
)
LABS = (write_back,)

__all__ = ["DEMOTE", "DESTROY", "LABS", "WRITE_BACK_CASES", "WRITE_THEN_DEMOTE", "check_write_back",
           "run_with_write_back", "write_back"]
