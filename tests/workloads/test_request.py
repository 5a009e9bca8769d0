"""Request validation and TokenSequence, checked against plain tuples as the oracle."""

import dataclasses
import math
import pickle
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.workloads import Request, TokenSequence


def _req(**kw):
    base = dict(rid="r", arrival_time_s=0.0, prompt_token_ids=(1, 2, 3), output_len=2)
    base.update(kw)
    return Request(**base)


def test_request_basics():
    r = _req()
    assert r.prompt_len == 3
    assert isinstance(r.prompt_token_ids, TokenSequence)
    assert r.prompt_token_ids == (1, 2, 3)
    assert r.arrival_time_s == 0.0 and type(r.arrival_time_s) is float
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.output_len = 5
    assert _req() == r and hash(_req()) == hash(r)


def test_request_block_hashes_one_per_block_last_partial():
    r = _req(block_hashes=[7, 8], block_size=2)  # 3 tokens in blocks of 2: one full, one partial
    assert r.block_hashes == (7, 8)


def test_request_accepts_array_and_tensor_tokens():
    import torch

    assert _req(prompt_token_ids=array("q", [4, 5])).prompt_token_ids == (4, 5)
    assert _req(prompt_token_ids=torch.tensor([4, 5])).prompt_token_ids == (4, 5)


@pytest.mark.parametrize("kw, message", [
    (dict(output_len=-1), "Request 'r': output_len must be an int >= 0, got -1"),
    (dict(output_len=None), "Request 'r': output_len must be an int >= 0, got None"),
    (dict(output_len=2.0), "Request 'r': output_len must be an int >= 0, got 2.0"),
    (dict(prompt_token_ids=None), "Request 'r': prompt_token_ids is missing (None)"),
    (dict(prompt_token_ids=()), "Request 'r': prompt_token_ids must be non-empty (prompt_len 0)"),
    (dict(prompt_token_ids=(1, -1)), "prompt_token_ids[1] must be an int in [0, 2**63), got -1"),
    (dict(prompt_token_ids=(1, 2.5)), "prompt_token_ids[1] must be an int in [0, 2**63), got 2.5"),
    (dict(prompt_token_ids="abc"), "prompt_token_ids must be a sequence of ints, got str"),
    (dict(arrival_time_s=-0.5), "Request 'r': arrival_time_s must be a finite number >= 0, got -0.5"),
    (dict(arrival_time_s=math.inf), "Request 'r': arrival_time_s must be a finite number >= 0, got inf"),
    (dict(arrival_time_s=None), "Request 'r': arrival_time_s must be a finite number >= 0, got None"),
    (dict(rid=""), "Request rid must be a non-empty str, got ''"),
    (dict(turn=-1), "Request 'r': turn must be an int >= 0 or None, got -1"),
    (dict(output_token_ids=(7,)), "Request 'r': output_token_ids has 1 tokens but output_len is 2"),
    (dict(block_hashes=(1,)), "Request 'r': block_size must be an int > 0 when block_hashes is given, got None"),
    (dict(block_hashes=(1,), block_size=2), "Request 'r': block_hashes has 1 ids but prompt_len 3 needs "
                                            "div_ceil(3, 2) = 2"),
    (dict(block_size=512), "Request 'r': block_size 512 given without block_hashes"),
])
def test_request_validation_names_field_and_value(kw, message):
    with pytest.raises(ValueError) as e:
        _req(**kw)
    assert message in str(e.value)


# --- TokenSequence against a tuple oracle -----------------------------------------------------------------

segment = st.one_of(
    st.builds(lambda a, n: range(a, a + n), st.integers(0, 10**6), st.integers(0, 40)),
    st.lists(st.integers(0, 50), max_size=40).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(segment, max_size=6), st.data())
def test_token_sequence_behaves_like_its_tuple(segments, data):
    ts = TokenSequence.from_segments(segments)
    oracle = tuple(t for s in segments for t in s)
    n = len(oracle)
    assert len(ts) == n and tuple(ts) == oracle and ts.tolist() == list(oracle)
    assert ts == oracle and ts == list(oracle) and hash(ts) == hash(oracle)
    assert ts.to_array() == array("q", oracle)
    grown = ts.to_array()  # numpy wrote it in place: no view of it is left holding its buffer
    grown.append(7)
    assert grown == array("q", (*oracle, 7))
    assert ts.to_numpy().tolist() == list(oracle)
    if n:
        i = data.draw(st.integers(-n, n - 1))
        assert ts[i] == oracle[i]
        assert oracle[i] in ts
    with pytest.raises(IndexError):
        ts[n]
    a = data.draw(st.integers(-n - 2, n + 2))
    b = data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([None, 1, 2, -1]))
    sliced = ts[a:b:step]
    assert isinstance(sliced, TokenSequence)
    assert tuple(sliced) == oracle[a:b:step]
    other = TokenSequence(oracle)  # one segment: equal by value despite a different segmentation
    assert other == ts and hash(other) == hash(ts)
    assert pickle.loads(pickle.dumps(ts)) == ts
    assert TokenSequence(oracle + (1,)) != ts


def test_token_sequence_concat_shares_segments():
    sys_prompt = TokenSequence((1, 2, 3))
    a = sys_prompt + TokenSequence((4,))
    b = sys_prompt + TokenSequence((5,))
    assert a.segments[0] is b.segments[0]
    assert a[:3] == b[:3] == (1, 2, 3) and a != b
    lazy = TokenSequence(range(10, 20))
    assert lazy.segments == (range(10, 20),) and lazy[2:4].segments == (range(12, 14),)
    assert repr(TokenSequence(range(8))) == "TokenSequence([0, 1, 2, 3, 4, 5, ...], len=8, segments=1)"


def test_from_checked_sets_every_field_as_the_checking_constructor_does():
    """The trusted constructor the trace loader uses: equal to ``Request(...)`` field for field, so a field added
    to Request without it fails here."""
    prompt = TokenSequence.from_segments((range(512), range(1024, 1124)), (512, 612))
    checked = Request(rid="t-0", arrival_time_s=1.5, prompt_token_ids=prompt, output_len=3, block_hashes=(0, 2),
                      block_size=512)
    trusted = Request.from_checked("t-0", 1.5, prompt, 3, (0, 2), 512)
    assert trusted == checked and vars(trusted) == vars(checked)
    assert list(vars(trusted)) == [f.name for f in dataclasses.fields(Request)]
    assert Request.from_checked("w-1", 0.0, prompt, 0).block_hashes is None
