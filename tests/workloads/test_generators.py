"""Synthetic workloads: determinism, exact shared-prefix structure, ordering, Poisson arrivals, registry."""

import hashlib
import math
import os
import statistics
import subprocess
import sys
from collections import defaultdict

import pytest

from kvlab.workloads import (
    WORKLOADS,
    few_shot,
    generated_shared_prefix,
    make_workload,
    multi_turn_chat,
    register_workload,
    requests_to_frame,
    workload_defaults,
)


def _lcp(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _digest(requests) -> str:
    h = hashlib.sha256()
    for r in requests:
        h.update(f"{r.rid}|{r.arrival_time_s!r}|{r.output_len}|{r.group_id}|{r.session_id}|".encode())
        h.update(r.prompt_token_ids.to_array().tobytes())
    return h.hexdigest()


SMALL = {
    "generated-shared-prefix": dict(num_groups=4, prompts_per_group=3, system_prompt_len=50, question_len=10,
                                    output_len=5, request_rate=4.0),
    "multi-turn-chat": dict(num_sessions=3, turns=3, system_prompt_len=20, user_len=8, output_len=6,
                            request_rate=2.0),
    "few-shot": dict(num_requests=10, num_examples=3, example_len=16, question_len=8, output_len=4,
                     request_rate=5.0),
}


def test_registry_names_are_the_cli_contract():
    assert set(WORKLOADS) == {"generated-shared-prefix", "multi-turn-chat", "few-shot", "multiturn"}
    assert WORKLOADS["few-shot"] is few_shot


@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_seed_same_workload_other_seed_other_tokens(name):
    a = make_workload(name, seed=3, **SMALL[name])
    b = make_workload(name, seed=3, **SMALL[name])
    c = make_workload(name, seed=4, **SMALL[name])
    assert a == b and _digest(a) == _digest(b)
    assert [r.prompt_token_ids for r in a] != [r.prompt_token_ids for r in c]
    times = [r.arrival_time_s for r in a]
    assert times == sorted(times) and times[0] == 0.0
    assert len({r.rid for r in a}) == len(a)


def test_seeded_workloads_are_identical_in_another_process():
    """String-seeded random.Random streams do not depend on PYTHONHASHSEED or the process."""
    here = os.path.dirname(__file__)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from test_generators import _digest, SMALL; "
            "from kvlab.workloads import make_workload; "
            "print(' '.join(_digest(make_workload(n, seed=11, **SMALL[n])) for n in sorted(SMALL)))")
    out = subprocess.run([sys.executable, "-c", code, here], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.split()
    assert out == [_digest(make_workload(n, seed=11, **SMALL[n])) for n in sorted(SMALL)]


def test_generated_shared_prefix_defaults_are_bench_serving_defaults():
    d = workload_defaults("generated-shared-prefix")
    assert (d["num_groups"], d["prompts_per_group"], d["system_prompt_len"], d["question_len"],
            d["output_len"]) == (64, 16, 2048, 128, 256)
    reqs = make_workload("generated-shared-prefix")
    assert len(reqs) == 1024
    assert {r.prompt_len for r in reqs} == {2176} and {r.output_len for r in reqs} == {256}
    groups = defaultdict(list)
    for r in reqs:
        groups[r.group_id].append(r)
    assert len(groups) == 64 and {len(g) for g in groups.values()} == {16}
    _check_groups_share_exactly(groups, 2048)


def _check_groups_share_exactly(groups, system_len):
    """Within a group every pair shares exactly the system prompt; across groups nothing."""
    heads = []
    for members in groups.values():
        system = members[0].prompt_token_ids[:system_len]
        assert all(m.prompt_token_ids[:system_len] == system for m in members)
        # distinct token right after the prefix <=> every pair's common prefix is exactly system_len
        after = [m.prompt_token_ids[system_len] for m in members]
        assert len(set(after)) == len(after)
        heads.append(system[0])
    assert len(set(heads)) == len(heads)


def test_generated_shared_prefix_pairwise_common_prefix_brute_force():
    # vocab 8: plain random tokens would give many shared first tokens; the sibling re-draw rules them out
    reqs = generated_shared_prefix(num_groups=5, prompts_per_group=4, system_prompt_len=30, question_len=6,
                                   vocab_size=8, seed=1)
    for a in reqs:
        for b in reqs:
            if a is b:
                continue
            expect = 30 if a.group_id == b.group_id else 0
            assert _lcp(a.prompt_token_ids, b.prompt_token_ids) == expect, (a.rid, b.rid)


def test_generated_shared_prefix_is_shuffled_like_bench_serving_unless_ordered():
    kw = dict(num_groups=8, prompts_per_group=4, system_prompt_len=16, question_len=4, output_len=2, seed=5)
    ordered = generated_shared_prefix(ordered=True, **kw)
    shuffled = generated_shared_prefix(**kw)
    assert [r.rid for r in ordered] == [f"gsp-{i}" for i in range(32)]
    assert [r.group_id for r in ordered] == [f"gsp-group-{i // 4}" for i in range(32)]
    assert [r.rid for r in shuffled] != [r.rid for r in ordered]
    assert sorted(shuffled, key=lambda r: int(r.rid[4:])) == ordered  # same requests (all at t=0)


def test_generated_shared_prefix_range_ratio_and_zipf():
    reqs = generated_shared_prefix(num_groups=16, prompts_per_group=8, system_prompt_len=100, question_len=40,
                                   output_len=20, range_ratio=0.5, seed=2)
    assert all(10 <= r.output_len <= 20 for r in reqs) and len({r.output_len for r in reqs}) > 1
    assert all(50 + 20 <= r.prompt_len <= 140 for r in reqs)  # [int(full * 0.5), full] per part
    z = generated_shared_prefix(num_groups=10, prompts_per_group=50, system_prompt_len=8, question_len=4,
                                group_distribution="zipf", zipf_alpha=1.2, seed=0)
    counts = defaultdict(int)
    for r in z:
        counts[r.group_id] += 1
    assert counts["gsp-group-0"] == max(counts.values()) and counts["gsp-group-0"] > 500 / 10 * 2
    groups = defaultdict(list)
    for r in z:
        groups[r.group_id].append(r)
    _check_groups_share_exactly(groups, 8)
    with pytest.raises(ValueError, match="needs zipf_alpha"):
        generated_shared_prefix(group_distribution="zipf")
    with pytest.raises(ValueError, match="only meaningful with group_distribution='zipf'"):
        generated_shared_prefix(zipf_alpha=1.0)


def test_poisson_arrivals_mean_and_spread():
    reqs = few_shot(num_requests=20000, num_examples=1, example_len=4, question_len=1, output_len=1,
                    request_rate=10.0, seed=0)
    t = [r.arrival_time_s for r in reqs]
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert t[0] == 0.0 and all(g >= 0 for g in gaps)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.1, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, rel=0.05)  # exponential: CV = 1
    # arrivals come from their own stream: the rate does not change a token
    slow = few_shot(num_requests=50, request_rate=1.0, seed=0)
    burst = few_shot(num_requests=50, seed=0)
    assert [r.prompt_token_ids for r in slow] == [r.prompt_token_ids for r in burst]
    assert {r.arrival_time_s for r in burst} == {0.0}


def test_multi_turn_chat_each_turn_extends_the_whole_conversation():
    reqs = multi_turn_chat(num_sessions=5, turns=4, system_prompt_len=32, user_len=10, output_len=7,
                           think_time_s=3.0, request_rate=1.0, seed=9)
    assert len(reqs) == 20
    by_session = defaultdict(list)
    for r in reqs:
        by_session[r.session_id].append(r)
    for turns in by_session.values():
        assert [r.turn for r in turns] == [0, 1, 2, 3]  # arrive in order
        assert all(a.arrival_time_s < b.arrival_time_s for a, b in zip(turns, turns[1:]))
        for prev, cur in zip(turns, turns[1:]):
            history = prev.prompt_token_ids + prev.output_token_ids
            assert cur.prompt_token_ids[: len(history)] == history
            assert cur.prompt_len == len(history) + 10
        assert turns[0].prompt_len == 32 + 10
        assert all(len(r.output_token_ids) == r.output_len == 7 for r in turns)
    firsts = [t[0] for t in by_session.values()]
    for a in firsts:
        for b in firsts:
            if a is not b:
                assert _lcp(a.prompt_token_ids, b.prompt_token_ids) == 32  # only the system prompt


def test_few_shot_shares_exactly_the_examples():
    reqs = few_shot(num_requests=40, num_examples=4, example_len=25, question_len=9, output_len=3, seed=1)
    prefix = reqs[0].prompt_token_ids[:100]
    assert all(r.prompt_token_ids[:100] == prefix and r.prompt_len == 109 for r in reqs)
    assert len({r.prompt_token_ids[100] for r in reqs}) == 40
    assert [r.rid for r in reqs] == [f"few-shot-{i}" for i in range(40)]


def test_make_workload_errors_list_what_exists():
    with pytest.raises(ValueError) as e:
        make_workload("sharegpt")
    assert str(e.value) == ("unknown workload 'sharegpt'; known workloads: generated-shared-prefix, "
                            "multi-turn-chat, few-shot, multiturn")
    with pytest.raises(ValueError) as e:
        make_workload("few-shot", num_prompts=3, shots=2)
    assert str(e.value) == ("workload 'few-shot' has no parameter 'num_prompts', 'shots'; it accepts: "
                            "num_requests, num_examples, example_len, question_len, output_len, request_rate, "
                            "vocab_size")
    assert len(make_workload("few-shot", seed=1, num_requests=3)) == 3


@pytest.mark.parametrize("fn, kw, message", [
    (generated_shared_prefix, dict(num_groups=0), "num_groups must be an int >= 1, got 0"),
    (generated_shared_prefix, dict(question_len=-1), "question_len must be an int >= 0, got -1"),
    (generated_shared_prefix, dict(request_rate=0), "request_rate must be a number > 0"),
    (generated_shared_prefix, dict(system_prompt_len=0, question_len=0), "system_prompt_len + question_len"),
    (generated_shared_prefix, dict(num_groups=40, vocab_size=32), "vocab_size 32 is too small"),
    (multi_turn_chat, dict(think_time_s=-1.0), "think_time_s must be a finite number >= 0, got -1.0"),
    (multi_turn_chat, dict(user_len=0), "user_len must be an int >= 1, got 0"),
    (few_shot, dict(seed=1.5), "seed must be an int"),
    (few_shot, dict(request_rate=math.nan), "request_rate must be a number > 0"),
])
def test_generator_arguments_are_checked(fn, kw, message):
    with pytest.raises(ValueError, match="^" + message.replace("+", r"\+").replace("(", r"\(")):
        fn(**kw)


def test_register_workload_returns_the_function():
    def mine(seed=0):
        return make_workload("few-shot", seed=seed, num_requests=1)

    try:
        assert register_workload("tmp-test")(mine) is mine
        assert make_workload("tmp-test", seed=3) == mine(seed=3)  # one that yields none: test_empty_input.py
    finally:
        WORKLOADS.pop("tmp-test")


def test_requests_to_frame():
    df = requests_to_frame(make_workload("multi-turn-chat", **SMALL["multi-turn-chat"]))
    assert list(df.columns) == ["rid", "arrival_time_s", "prompt_len", "output_len", "group_id", "session_id",
                                "turn"]
    assert len(df) == 9 and df["turn"].max() == 2
