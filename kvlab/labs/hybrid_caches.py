"""Notebook 03's exercise, :data:`resume`: where a Mamba hit may resume, written by the learner.

The learner writes ``resume_point(path) -> tokens``: given the edges a request matched from the root,
``[(tokens_on_edge, has_state), ...]``, how many tokens it may reuse. The queries of
``hybrid_caches.resume_scenario`` run on its Mamba tree; each answer is compared with
``MambaRadixCache.match_prefix``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlab.experiments.hybrid_caches import matched_path, resume_scenario
from kvlab.labs.check import CheckLine, CheckResult, compare
from kvlab.labs.lab import Exercise
from kvlab.labs.solution import Solution


@dataclass(frozen=True)
class ResumeQuery:
    """One query of :func:`run_with_resume_point`: the path the learner's function was given, what it
    answered (or ``error``: what it raised), and where ``match_prefix`` resumed."""

    path: list[tuple[int, bool]]
    given: Any
    matched_tokens: int
    error: str | None = None


def run_with_resume_point(fn: Callable[[list[tuple[int, bool]]], Any], seed: int = 0) -> tuple[ResumeQuery, ...]:
    """Walk each query of ``resume_scenario(seed)``, ask ``fn(path)``, and let the tree match it."""
    cache, queries = resume_scenario(seed)
    out = []
    for q in queries:
        path = matched_path(cache, q)
        matched = cache.match_prefix(q).device_prefix_len  # may split an edge: the next path sees it
        try:
            out.append(ResumeQuery(path, fn(path), matched))
        except Exception as e:  # the learner's code: report, do not raise
            out.append(ResumeQuery(path, None, matched, f"{type(e).__name__}: {e}"))
    return tuple(out)


def check_resume_point(fn: Callable[[list[tuple[int, bool]]], Any], seed: int = 0) -> CheckResult:
    """Run the learner's ``fn(path) -> tokens`` on ``resume_scenario``'s queries and compare with
    ``MambaRadixCache.match_prefix``."""
    lines = []
    for q in run_with_resume_point(fn, seed):
        if q.error is not None:
            lines.append(CheckLine(f"path {q.path}", False, q.error, q.matched_tokens))
            continue
        kv_len = sum(t for t, _ in q.path)
        hint = ("that is every matched KV token; the state exists only where has_state is True"
                if q.given == kv_len != q.matched_tokens else "")
        lines.append(compare(f"path {q.path}", q.given, q.matched_tokens, hint))
    return CheckResult("resume_point: tokens a Mamba hit may resume from", tuple(lines))


resume = Exercise(
    "resume", "where may a Mamba hit resume?", "resume_point",
    Solution("resume_point", """def resume_point(path):
    # path: [(tokens_on_edge, has_state), ...] from the root down the matched edges.
    best = matched = 0
    for tokens, has_state in path:
        matched += tokens
        if has_state:          # a snapshot exists exactly here
            best = matched
    return best                # KV matched past the last snapshot cannot be used
"""),
    runner=run_with_resume_point, checker=check_resume_point,
)
LABS = (resume,)
