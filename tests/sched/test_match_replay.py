"""A page-engine match memo replayed though the tree changed since its walk (``PageKV._current_memo``): when the node
the walk ended at is still in the tree and nothing was inserted where the walk stopped, the walk is replayed
(``restamp_path``) instead of walked again. The runs below take that shortcut thousands of times (counted) and must
equal, row by row, the token-level memory, whose every match is a real walk: without a host tier, with one, and with
a storage tier whose arrival matches go stale before admission. The shortcut refuses a memo whose node was evicted or
below which a node was inserted at the next page, and then walks."""

from dataclasses import replace

import pytest
from sim_twins import assert_same

from kvlab.sched import SchedulerConfig, simulate
from kvlab.sched.page_kv import PageKV

from .test_storage_sched import turns

TIERS = {
    "none": {},
    "host": dict(hicache_ratio=1.0),
    "storage": dict(hicache_ratio=1.0, hicache_storage_backend="file"),
}


def counted(monkeypatch):
    """Count ``_current_memo``'s answers, a memo made current (True) or None (False); the real method runs."""
    answers = {True: 0, False: 0}
    real = PageKV._current_memo

    def current_memo(self, req, memo):
        answer = real(self, req, memo)
        answers[answer is not None] += 1
        return answer

    monkeypatch.setattr(PageKV, "_current_memo", current_memo)
    return answers


@pytest.mark.parametrize("mode", ["shortfall", "full"])
@pytest.mark.parametrize("tier", list(TIERS))
def test_a_stale_match_replayed_equals_the_token_level_walks(monkeypatch, tier, mode):
    answers = counted(monkeypatch)
    cfg = SchedulerConfig(kv_tokens=2048, page_size=64, max_running=8, eviction=mode, **TIERS[tier])
    reqs = turns(clients=12, rounds=3, gap=0.5)  # (heads turned down while others' inserts change the tree)
    token = simulate(reqs, replace(cfg, page_engine=False), progress=False)
    page = simulate(reqs, replace(cfg, debug=True), progress=False)
    assert isinstance(page.memory, PageKV)
    assert_same(token, page)  # rows, totals, the final tree and its clock
    assert answers[True] > 0  # (the shortcut was taken)
    if tier == "storage":  # (and refused where the tree had moved under an arrival's match)
        assert answers[False] > 0


def test_without_the_shortcut_the_run_is_the_same(monkeypatch):
    """The same run with every stale memo walked again: identical rows and tree (the shortcut changes nothing but
    the work)."""
    cfg = SchedulerConfig(kv_tokens=2048, page_size=64, max_running=8, **TIERS["storage"])
    reqs = turns(clients=12, rounds=3, gap=0.5)
    fast = simulate(reqs, cfg, progress=False)
    monkeypatch.setattr(PageKV, "_current_memo", lambda self, req, memo: None)
    walked = simulate(reqs, cfg, progress=False)
    assert_same(walked, fast)
