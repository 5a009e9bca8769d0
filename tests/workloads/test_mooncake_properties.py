"""Property tests: the loader on random valid traces, and error line numbers on random bad ones."""

import json
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.units import div_ceil
from kvlab.workloads import (
    MooncakeRecord,
    TraceFormatError,
    block_tokens,
    load_trace,
    read_records,
    write_trace,
)

BS = 512


@st.composite
def records(draw):
    n_in = draw(st.integers(1, 4 * BS + 3))
    ids = draw(st.lists(st.integers(0, 12), min_size=div_ceil(n_in, BS), max_size=div_ceil(n_in, BS)))
    return {"timestamp": draw(st.integers(0, 5)) * 1000 + draw(st.sampled_from([0, 1, 999])),
            "input_length": n_in, "output_length": draw(st.integers(0, 3000)), "hash_ids": ids}


def _write(lines):
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    with os.fdopen(fd, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


@settings(max_examples=60, deadline=None)
@given(st.lists(records(), min_size=1, max_size=12))  # no records: refused (test_empty_input.py)
def test_loader_on_random_valid_records(recs):
    path = _write(json.dumps(r) for r in recs)
    try:
        reqs = load_trace(path)
        assert read_records(path) == [MooncakeRecord(r["timestamp"], r["input_length"], r["output_length"],
                                                     tuple(r["hash_ids"])) for r in recs]
        # write_trace reproduces the json.dumps spelling byte for byte
        again = path + ".again"
        write_trace(again, read_records(path))
        with open(again) as a, open(path) as b:
            assert a.read() == b.read()
        os.remove(again)
    finally:
        os.remove(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    assert len(reqs) == len(recs)
    order = [int(r.rid[len(stem) + 1:]) for r in reqs]
    assert order == sorted(range(len(recs)), key=lambda i: recs[i]["timestamp"])  # stable by arrival
    blocks = {}  # hash id -> longest token block seen for it
    for r in reqs:
        rec = recs[int(r.rid[len(stem) + 1:])]
        assert r.arrival_time_s == rec["timestamp"] / 1000
        assert (r.prompt_len, r.output_len, list(r.block_hashes)) == (
            rec["input_length"], rec["output_length"], rec["hash_ids"])
        toks = r.prompt_token_ids
        for j, h in enumerate(r.block_hashes):
            blk = tuple(toks[j * BS:(j + 1) * BS])
            assert blk == tuple(block_tokens(h)[:len(blk)])
            prev = blocks.setdefault(h, blk)
            short, long_ = sorted((prev, blk), key=len)
            assert long_[:len(short)] == short  # equal ids: equal blocks (a partial one is a prefix)
            blocks[h] = long_
    ids = sorted(blocks)
    for a in ids:
        for b in ids:
            if a < b:
                assert not set(blocks[a]) & set(blocks[b])  # different ids: no token in common


bad_value = st.sampled_from([
    ("input_length", -1), ("input_length", 1.5), ("output_length", "7"), ("timestamp", None),
    ("hash_ids", "x"), ("hash_ids", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), ("hash_ids", [-2]),
])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(records().map(json.dumps), st.just("")), min_size=1, max_size=10), st.data())
def test_the_first_bad_line_is_named_by_number(lines, data):
    at = data.draw(st.integers(0, len(lines)))
    field, value = data.draw(bad_value)
    bad = dict(data.draw(records()))
    bad[field] = value
    lines = lines[:at] + [json.dumps(bad)] + lines[at:]
    path = _write(lines)
    try:
        try:
            load_trace(path)
        except TraceFormatError as e:
            assert str(e).startswith(f"{path}:{at + 1}: field '{field}' ")
            assert e.field == field
        else:
            raise AssertionError("a bad line loaded")
    finally:
        os.remove(path)
