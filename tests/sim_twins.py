"""What the scheduler tests share: a minimal request (``RequestLike``'s four fields) and the comparison of a run of
the fast path (``fast_decode=True``: the page engine at page size > 1) with the reference loop."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvlab.mem_cache.tree_view import tree_frame
from kvlab.sched import simulate


@dataclass(frozen=True)
class Req:
    rid: str
    arrival_time_s: float
    prompt_token_ids: tuple
    output_len: int


def run_both(reqs, cfg):
    """(the reference loop's result, the fast path's) on ``cfg`` otherwise."""
    plain = simulate(reqs, replace(cfg, fast_decode=False), progress=False)
    fast = simulate(reqs, replace(cfg, fast_decode=True), progress=False)
    return plain, fast


def assert_same(plain, fast):
    """Every total and row, the final tree and its clock equal; the fast run's tree consistent."""
    assert fast.totals() == plain.totals()
    assert len(fast.rows) == len(plain.rows)
    for a, b in zip(plain.rows, fast.rows):
        assert b == a, f"step {a['step']} differs"
    assert tree_frame(fast.tree).equals(tree_frame(plain.tree))
    assert fast.tree.clock.now == plain.tree.clock.now
    fast.tree.check_invariants()
