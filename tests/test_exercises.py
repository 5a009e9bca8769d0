"""The exercises of notebooks 01, 02, 03 and 07 (kvlab.labs): kvlab's real scenarios with a learner's function plugged in.

The stubs are read from the notebooks themselves, so what a learner starts from is what is tested.
"""

import gc
from pathlib import Path

import jupytext
import pytest

from kvlab.device.measure import get_available_gpu_memory
from kvlab.experiments import hybrid_caches, kv_pool_sizing
from kvlab.labs import host_tier as lab07
from kvlab.labs import hybrid_caches as lab03
from kvlab.labs import kv_pool_sizing as lab01
from kvlab.labs import shortfall_eviction as lab02
from kvlab.mem_cache.common import evict_from_tree_cache

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _notebook_function(notebook: str, name: str):
    """Exec the notebook cell that defines ``name`` and return the function."""
    cells = [c.source for c in jupytext.read(NOTEBOOKS / notebook).cells if c.cell_type == "code"]
    source = next(s for s in cells if f"def {name}(" in s)
    namespace: dict = {}
    exec(source, namespace)
    return namespace[name]


def _solution_function(solution, name: str):
    namespace: dict = {}
    exec(solution.code, namespace)
    return namespace[name]


# ---- notebook 01 ----------------------------------------------------------------------------

@pytest.mark.slow
def test_the_notebook_stub_is_sglangs_reading_before_the_fix():
    stub = _notebook_function("01_kv_pool_sizing.py", "my_measure")
    result = lab01.measure.check(stub)
    no_gc = kv_pool_sizing.run("sglang-pr-4xh200", gc_before_measure=False)
    assert not result.ok and len(result.wrong) == 3
    free = result.lines[0]
    assert free.given == no_gc.reading.free_bytes and "reference cycle" in free.hint
    assert result.lines[1].given == no_gc.max_total_num_tokens
    assert "exceeds the maximum allowed length" in result.lines[2].hint  # SGLang's own refusal text
    assert "NOT YET" in result._repr_html_() and "kvlab-check-fail" in result._repr_html_()


@pytest.mark.slow
def test_the_solution_passes_and_reads_what_kvlabs_fixed_reading_does():
    result = lab01.measure.check(_solution_function(lab01.measure.solution, "my_measure"))
    with_gc = kv_pool_sizing.run("sglang-pr-4xh200", gc_before_measure=True)
    assert result.ok, result.text()
    assert result.lines[0].given == with_gc.reading.free_bytes
    assert result.lines[1].given == with_gc.max_total_num_tokens > 100 * 1_890


def test_run_is_the_startup_with_the_function_plugged_in():
    """``run`` returns what the start-up did with the learner's reading; ``check`` compares exactly that."""
    no_gc = kv_pool_sizing.run("llama-8b-l4", gc_before_measure=False)
    stub = lab01.measure.run(_notebook_function("01_kv_pool_sizing.py", "my_measure"), scenario="llama-8b-l4")
    assert (stub.free_bytes, stub.max_total_num_tokens) == (no_gc.reading.free_bytes, no_gc.max_total_num_tokens)
    assert stub.function_error is None
    broken = lab01.measure.run(lambda ds: 1 / 0, scenario="llama-8b-l4")
    assert broken.free_bytes is None and broken.function_error == "ZeroDivisionError: division by zero"


def test_collecting_after_empty_cache_is_too_late():
    """The gc is real: collected blocks land in the allocator's cache, still reserved, if nothing empties it after."""
    def late(devices):
        for d in devices:
            d.empty_cache()
        gc.collect()
        return min(d.mem_get_info()[0] for d in devices)

    result = lab01.measure.check(late)
    assert not result.ok and "when must it run" in result.lines[0].hint


@pytest.mark.slow
def test_a_memory_reading_is_accepted_and_only_the_collecting_one_passes():
    assert lab01.measure.check(lambda ds: get_available_gpu_memory(ds, gc_collect=True)).ok
    assert not lab01.measure.check(lambda ds: get_available_gpu_memory(ds, gc_collect=False)).ok


def test_one_rank_only_is_enough_here_but_too_much_is_named():
    # the four simulated ranks are identical, so rank 0's reading is the minimum; an over-read is flagged
    def over(devices):
        gc.collect()
        for d in devices:
            d.empty_cache()
        return devices[0].mem_get_info()[1]  # total, not free

    result = lab01.measure.check(over)
    assert not result.ok and "more than the devices have free" in result.lines[0].hint
    assert "does not fit" in result.lines[2].hint  # the pool sized from it hits a real out-of-memory


@pytest.mark.parametrize("bad, shown", [(lambda ds: 1 / 0, "ZeroDivisionError: division by zero"),
                                        (lambda ds: None, "returned None"),
                                        (lambda ds: (1, 2), "returned (1, 2)"),
                                        (lambda ds: True, "returned True")])
def test_a_broken_function_gets_feedback_not_a_traceback(bad, shown):
    result = lab01.measure.check(bad, scenario="llama-8b-l4")
    assert not result.ok and len(result.lines) == 1 and shown in result.lines[0].given
    assert gc.isenabled()  # the scenario's pause of the automatic collector was undone


def test_an_unknown_scenario_is_named():
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        lab01.measure.check(lambda ds: 0, scenario="nope")


# ---- notebook 02 ----------------------------------------------------------------------------

def test_the_notebook_stub_is_sglang_0516s_full_eviction():
    """The starter is 0.5.16's standard arm: all of num_tokens when short, nothing otherwise. So it is
    wrong exactly where the pool was short, and right where 0.5.16 did not evict either."""
    stub = _notebook_function("02_shortfall_eviction.py", "my_shortfall")
    for num, free in lab02.SHORTFALL_CASES + ((100, 0), (1, 1)):
        assert stub(num, free) == (num if free < num else 0)
    result = lab02.shortfall.check(stub)
    assert not result.ok and [line.ok for line in result.lines] == [False, False, True, True]
    first = result.lines[0]
    assert (first.given, first.expected) == (750, 450) and "0.5.16" in first.hint and "only 300 were missing" in first.hint
    tree, _alloc, _held = lab02.conversation_tree(300)
    assert first.given == evict_from_tree_cache(tree, 600, "full").evicted_tokens  # what 0.5.16 evicted


def test_asking_when_nothing_is_missing_does_not_blame_0516():
    always = lab02.shortfall.check(lambda n, a: n)
    assert [line.ok for line in always.lines] == [False, False, False, False]
    for line in always.lines[2:]:
        assert "nothing was missing" in line.hint and "0.5.16 neither" in line.hint and "bug" not in line.hint


def test_the_solution_passes_and_matches_evict_from_tree_cache():
    fn = _solution_function(lab02.shortfall.solution, "my_shortfall")
    result = lab02.shortfall.check(fn)
    assert result.ok, result.text()
    for line, (num, free) in zip(result.lines, lab02.SHORTFALL_CASES):
        tree, _alloc, _held = lab02.conversation_tree(free)
        assert line.given == evict_from_tree_cache(tree, num, "shortfall").evicted_tokens


def test_run_evicts_what_the_function_asks_for_case_by_case():
    calls = []
    outcomes = lab02.shortfall.run(lambda n, a: calls.append((n, a)) or 0)
    assert calls == list(lab02.SHORTFALL_CASES)  # the function sees each case's free slots
    assert [(o.num_tokens, o.free_tokens) for o in outcomes] == list(lab02.SHORTFALL_CASES)
    assert [(o.asked_tokens, o.evicted_tokens, o.fits) for o in outcomes] == [(0, 0, False), (0, 0, False),
                                                                            (0, 0, True), (0, 0, True)]
    everything = lab02.shortfall.run(lambda n, a: n)[0]
    tree, _alloc, _held = lab02.conversation_tree(300)
    assert (everything.asked_tokens, everything.fits) == (600, True) and everything.error is None
    assert everything.evicted_tokens == evict_from_tree_cache(tree, 600, "full").evicted_tokens
    assert lab02.shortfall.run(lambda n, a: "x")[0].error.startswith("TypeError: my_shortfall(600, 300) returned 'x'")


def test_a_negative_ask_evicts_nothing_and_passes_too():
    assert lab02.shortfall.check(lambda n, a: n - a).ok


def test_too_little_is_named_and_a_bad_return_is_feedback():
    half = lab02.shortfall.check(lambda n, a: (n - a) // 2)
    assert not half.ok and "too little" in half.lines[0].hint
    assert half.lines[2].ok and half.lines[3].ok  # nothing missing: 0 either way
    none = lab02.shortfall.check(lambda n, a: None)
    assert not none.ok and "returned None" in none.lines[0].given
    floats = lab02.shortfall.check(lambda n, a: float(n - a))
    assert not floats.ok and "an int" in floats.lines[0].given


def test_conversation_tree_is_the_pressure_event_tree():
    tree, alloc, _held = lab02.conversation_tree(300)
    tree.check_invariants()
    alloc.check_invariants()
    assert alloc.available_size() == 300
    assert tree.evictable_size() == 1024 + 200 + 250 + 300 + 400 + 500 + 700  # system prompt + six tails
    with pytest.raises(ValueError, match="free_tokens must be in 0..722, got 5000"):
        lab02.conversation_tree(5000)


# ---- notebook 03 ----------------------------------------------------------------------------

def test_the_resume_stub_is_not_yet_and_the_solution_passes():
    stub = lab03.resume.check(_notebook_function("03_hybrid_caches.py", "resume_point"))
    assert not stub.ok and "NOT YET" in stub.text()
    assert any("every matched KV token" in line.hint for line in stub.wrong)
    assert lab03.resume.check(_solution_function(lab03.resume.solution, "resume_point")).ok
    broken = lab03.resume.check(lambda path: 1 / 0)
    assert not broken.ok and "ZeroDivisionError" in broken.text()


def test_resume_run_gives_each_query_its_path_and_the_trees_answer():
    """The paths are the tree's (``matched_path``), and the tree's answer is ``match_prefix``, query by query on
    one tree (a match may split an edge that a later path then walks)."""
    seen = []
    queries = lab03.resume.run(lambda path: seen.append(list(path)) or 0)
    cache, keys = hybrid_caches.resume_scenario()
    assert len(queries) == len(keys) == len(seen)
    for query, key, path in zip(queries, keys, seen):
        assert query.path == path == hybrid_caches.matched_path(cache, key)
        assert query.matched_tokens == cache.match_prefix(key).device_prefix_len
        assert query.given == 0 and query.error is None
    assert any(q.matched_tokens < sum(t for t, _ in q.path) for q in queries)  # a hit past the last state


# ---- notebook 07 ----------------------------------------------------------------------------

def test_the_write_back_stub_is_the_write_through_rule_and_not_yet():
    stub = lab07.write_back.check(_notebook_function("07_host_tier.py", "my_write_back_evict"))
    assert not stub.ok and "NOT YET" in stub.text()
    # the write-through rule destroys what write_back writes first: exactly the two cases with room on host
    assert [line.ok for line in stub.lines] == [False, True, True, False, True]
    assert all("write_back has not written this one yet" in line.hint for line in stub.wrong)
    assert "what could host eviction free?" in stub.lines[3].hint


def test_the_write_back_check_hints_and_does_not_give_the_rule_away():
    """Issue 35: the stub's first failing line printed the whole rule. A failing check asks; it states the rule
    (written first, destroyed only when no room even after host eviction) only once every case passes."""
    solution = _solution_function(lab07.write_back.solution, "my_write_back_evict")
    rule = ("written to host before", "no room even after", "host_free_tokens + host_evictable_tokens",
            "enough for its", "does not fit")
    for fn in (_notebook_function("07_host_tier.py", "my_write_back_evict"),
               lambda b, n, free, ev: "demote" if b else "write then demote", lambda *a: "destroy"):
        text = lab07.write_back.check(fn).text()
        assert "NOT YET" in text and not [r for r in rule if r in text], text
        assert all(line.hint.endswith("?") for line in lab07.write_back.check(fn).wrong)
    assert "no room even after" in lab07.write_back.check(solution).text()


def test_the_write_back_solution_passes_and_wrong_answers_are_named():
    solved = lab07.write_back.check(_solution_function(lab07.write_back.solution, "my_write_back_evict"))
    assert solved.ok, solved.text()
    always_write = lab07.write_back.check(lambda b, n, free, ev: "demote" if b else "write then demote")
    assert [line.ok for line in always_write.lines] == [True, True, False, True, False]
    assert "could the host pool make room for 300 tokens here?" == always_write.lines[2].hint
    assert "counting what host eviction frees" in always_write.lines[4].hint
    free_only = lab07.write_back.check(  # forgets that host eviction makes room
        lambda b, n, free, ev: "demote" if b else ("write then demote" if n <= free else "destroy"))
    assert [line.ok for line in free_only.lines] == [True, True, True, False, True]
    typo = lab07.write_back.check(lambda *a: "evict")
    assert not typo.ok and "answer one of 'demote', 'write then demote', 'destroy'" in typo.lines[0].hint
    broken = lab07.write_back.check(lambda *a: 1 / 0)
    assert not broken.ok and "ZeroDivisionError" in broken.lines[0].given


def test_write_back_run_reports_the_real_trees_outcome_per_case():
    seen = []
    answers = lab07.write_back.run(lambda *case: seen.append(case) or "destroy")
    assert [a.case for a in answers] == list(lab07.WRITE_BACK_CASES) == seen
    assert [a.outcome for a in answers] == ["write then demote", "demote", "destroy", "write then demote", "destroy"]
    assert [a.host_evicted_tokens for a in answers] == [0, 0, 0, 250, 150]
