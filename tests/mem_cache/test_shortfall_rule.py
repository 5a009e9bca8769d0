"""Finding 2's rule is written once (``kvlab/mem_cache/shortfall.py``) and every engine runs that one line.

- the rule's arithmetic against its definition (hypothesis);
- each caller (the token-level memory through ``evict_from_tree_cache``, the page engine, the host tier's
  load-back, notebook 07's pressure events) calls it, and a caller's result follows it: swap the rule for the
  bug's inside that one module and the fixed mode over-evicts exactly as the buggy mode does;
- no other module of the memory, scheduler or experiments layers subtracts the free slots from a need (a second
  copy of the rule would).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_twins import Req

import kvlab.experiments.host_tier as host_tier
import kvlab.experiments.host_tier_cache as host_tier_cache
import kvlab.mem_cache.common as common
import kvlab.mem_cache.hicache.tier_moves as tier_moves
import kvlab.sched.page_kv as page_kv
from kvlab.mem_cache import shortfall
from kvlab.sched import SchedulerConfig, simulate
from mem_cache.test_hiradix_cache import demoted_chain, serve

KVLAB = Path(shortfall.__file__).resolve().parents[1]
sizes = st.integers(min_value=0, max_value=10**9)


@given(sizes, sizes)
def test_the_rule_asks_for_the_shortfall_and_the_bug_for_everything(need, available):
    missing = max(0, need - available)
    assert shortfall.shortfall_tokens(need, available) == missing
    assert shortfall.tokens_to_evict(need, available, "shortfall") == missing
    assert shortfall.tokens_to_evict(need, available, "full") == (need if missing else 0)


@given(sizes, sizes, sizes)
def test_over_eviction_is_zero_when_only_the_shortfall_is_asked(need, available, evicted):
    missing = shortfall.shortfall_tokens(need, available)
    asked = shortfall.tokens_to_evict(need, available, "shortfall")
    assert shortfall.over_evicted_tokens(evicted, asked, missing) == 0
    bug = shortfall.tokens_to_evict(need, available, "full")
    assert shortfall.over_evicted_tokens(evicted, bug, missing) == max(0, min(evicted, bug) - missing)


def test_an_unknown_mode_is_named():
    with pytest.raises(ValueError, match="unknown eviction mode 'half'"):
        shortfall.check_mode("half", "here")


def _chat(turns: int = 14, conversations: int = 6, turn_tokens: int = 96, output: int = 24):
    """Multi-turn chats whose later turns resend the earlier ones: a prefix worth keeping, in a pool too small to
    keep it all."""
    reqs, t = [], 0.0
    for turn in range(turns):
        for c in range(conversations):
            prompt = tuple(range(100_000 * (c + 1), 100_000 * (c + 1) + turn_tokens * (turn + 1)))
            reqs.append(Req(f"c{c}-t{turn}", t, prompt, output))
            t += 0.05
    return reqs


def _run(**config):
    cfg = SchedulerConfig(kv_tokens=config.pop("kv_tokens"), max_running=4, **config)
    return simulate(_chat(), cfg, progress=False).totals()


def _load_back(mode: str) -> dict:
    """A 10-token load-back into a device pool with 5 slots free (tests/mem_cache/test_hiradix_cache.py's case)."""
    alloc, host, cache = demoted_chain(lb_mode=mode, size=40)
    for tokens in ([40 + i] * 5 for i in range(3)):
        serve(cache, alloc, tokens)
    cache.drain()
    cache.match_prefix(list(range(10)) + [77] * 10)
    r = cache.load_back(cache.match_prefix(list(range(20))).last_host_node)
    assert r.loaded_tokens == 10
    return {"over_evicted_tokens": r.evict.over_evicted_tokens}


CALLERS = {  # caller module: a run whose over-eviction it decides
    "page engine (PageKV.evict)": (page_kv, lambda mode: _run(kv_tokens=2048, page_size=16, eviction=mode)),
    "token-level memory (evict_from_tree_cache)": (common, lambda mode: _run(kv_tokens=2048, page_size=1,
                                                                             eviction=mode)),
    "host tier's load-back (HiRadixCache)": (tier_moves, lambda mode: _load_back(mode)),
    "notebook 07's pressure event (evict_for)": (  # evict_for is host_tier_cache's (host_tier re-exports it)
        host_tier_cache, lambda mode: {"over_evicted_tokens": host_tier.pressure_event(mode).evict.over_evicted_tokens}),
}


@pytest.mark.parametrize("caller", list(CALLERS))
def test_every_caller_runs_the_one_rule(caller, monkeypatch):
    module, run = CALLERS[caller]
    calls = []
    real = shortfall.tokens_to_evict

    def spy(num_tokens, available, mode="shortfall"):
        calls.append((num_tokens, available, mode))
        return real(num_tokens, available, mode)

    monkeypatch.setattr(module, "tokens_to_evict", spy)
    fixed = run("shortfall")
    assert calls, f"{caller} never asked the rule how much to evict"
    assert fixed["over_evicted_tokens"] == 0
    buggy = run("full")
    assert buggy["over_evicted_tokens"] > 0, "the scenario must put the pool under pressure"

    # the rule swapped for the bug's in this one module: the fixed mode now over-evicts as the bug does
    monkeypatch.setattr(module, "tokens_to_evict", lambda n, a, mode="shortfall": real(n, a, "full"))
    swapped = run("shortfall")
    assert swapped["over_evicted_tokens"] > 0


def _subtracts_free_slots(node: ast.AST) -> bool:
    """``need - available`` / ``need - x.available_size()``: the shape of the rule (``size - available_size()``, a
    pool's used slots, is not)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)):
        return False
    if isinstance(node.left, ast.Attribute) and node.left.attr == "size":
        return False
    right = node.right
    if isinstance(right, ast.Call):
        right = right.func
    name = right.id if isinstance(right, ast.Name) else right.attr if isinstance(right, ast.Attribute) else ""
    return "available" in name


def test_no_second_copy_of_the_rule():
    found = []
    for layer in ("mem_cache", "sched", "experiments"):
        for path in sorted((KVLAB / layer).rglob("*.py")):
            if path.name == "shortfall.py":
                continue
            tree = ast.parse(path.read_text(), str(path))
            found += [f"{path.relative_to(KVLAB)}:{n.lineno}" for n in ast.walk(tree) if _subtracts_free_slots(n)]
    assert not found, f"the shortfall computed outside kvlab/mem_cache/shortfall.py: {found}"
    definitions = [p for p in KVLAB.rglob("*.py") if "def tokens_to_evict" in p.read_text()]
    assert [p.name for p in definitions] == ["shortfall.py"]
