"""The Mooncake reader's fast parse path (one UTF-8 decode, the JSON scanner per line, inline record checks)
equals the line-by-line oracle: ``json.loads`` of each line, then the full record checks; and ``load_trace``'s
column-wise path for well-formed files equals records then requests, or steps aside on any doubt."""

import gc
import json
import random

import pytest

from kvlab.workloads import TraceFormatError, load_trace, read_records, records_to_requests
from kvlab.workloads.mooncake import MooncakeRecord, _load_well_formed, _parse_record


def _oracle(data: bytes, path) -> list[MooncakeRecord]:
    """What the reader did before the fast path: iterate the file's lines, ``json.loads`` each non-blank one."""
    out = []
    for lineno, raw in enumerate(data.splitlines(keepends=True), 1):
        if raw.strip():
            out.append(_parse_record(json.loads(raw.rstrip(b"\r\n")), f"{path}:{lineno}", 512))
    return out


def _line(rng: random.Random) -> bytes:
    n = rng.randrange(1, 3000)
    rec = {"timestamp": rng.randrange(10**6), "input_length": n, "output_length": rng.randrange(500),
           "hash_ids": [rng.randrange(10**6) for _ in range(-(-n // 512))]}
    if rng.random() < 0.2:
        rec["note"] = rng.choice(["é", "日本", "\u2028", "a\\\"b", ""])  # extra keys are ignored
    text = json.dumps(rec, ensure_ascii=rng.random() < 0.5, separators=rng.choice([None, (",", ":")]))
    return (rng.choice(["", " ", "\t"]) + text + rng.choice(["", " ", "\r"])).encode()


@pytest.mark.parametrize("seed", range(6))
def test_fast_path_equals_the_line_by_line_oracle(tmp_path, seed):
    rng = random.Random(seed)
    lines = [_line(rng) if rng.random() < 0.9 else rng.choice([b"", b"  ", b"\t\r"]) for _ in range(200)]
    if seed % 2:
        lines[rng.randrange(len(lines))] = b"\xef\xbb\xbf" + _line(rng)  # a BOM: json.loads of bytes takes it
    data = b"\n".join(lines) + (b"\n" if seed % 3 else b"")  # with and without a final line end
    p = tmp_path / "t.jsonl"
    p.write_bytes(data)
    assert read_records(p) == _oracle(data, p)


@pytest.mark.parametrize("bad, message", [
    ('{"timestamp": 0} {"x": 1}', "not valid JSON: Extra data (column 18)"),  # two values on one line
    ('{"timestamp": 0,', "not valid JSON: Expecting property name enclosed in double quotes (column 17)"),
    ("[1", "not valid JSON: Expecting ',' delimiter (column 3)"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]', None),
])
def test_a_bad_line_after_many_good_ones_is_named(tmp_path, bad, message):
    good = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]})
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join([good] * 500 + ["", bad, good]) + "\n")
    with pytest.raises(TraceFormatError) as e:
        read_records(p)
    assert e.value.where == f"{p}:502"
    if message:
        assert str(e.value) == f"{p}:502: {message}"


# --- load_trace's well-formed fast path (_load_well_formed) against records then requests -----------------------

def _slow_load(p):
    """What load_trace did before its fast path: every record checked, then converted."""
    return records_to_requests(read_records(p), rid_prefix=p.stem)


def _same_requests(fast, slow):
    assert fast == slow  # rids, arrivals, prompts by value, output lengths, block ids, block size, in order
    for a, b in zip(fast, slow):
        assert type(a.block_hashes) is tuple and type(a.arrival_time_s) is float
        assert a.prompt_token_ids.segments == b.prompt_token_ids.segments  # the same ranges, the same split
        assert a.prompt_token_ids._ends == b.prompt_token_ids._ends
        assert vars(a) == vars(b)  # every field set, group_id & co. None


@pytest.mark.parametrize("seed", range(4))
def test_load_trace_fast_path_equals_records_then_requests(tmp_path, seed):
    rng = random.Random(seed)
    top = [40, 10**5, 2**63 // 512 - 1, 3][seed]  # dense ids (one table), sparse ones (a dict), the largest id
    recs = []
    for _ in range(300):
        n = rng.randrange(1, 3000)
        recs.append({"timestamp": rng.randrange(0, 50) * 7, "input_length": n, "output_length": rng.randrange(500),
                     "hash_ids": [rng.randrange(top + 1) for _ in range(-(-n // 512))]})
    recs[0]["hash_ids"][0] = top
    p = tmp_path / f"fast-{seed}.jsonl"
    p.write_text("".join(json.dumps(r, separators=[None, (",", ":")][seed % 2]) + "\n" for r in recs))
    assert _load_well_formed(p, 512, p.stem) is not None  # the fast path read it
    fast = load_trace(p)
    _same_requests(fast, _slow_load(p))
    shared = {}
    for r in fast:  # one range object per block id across the whole trace
        for h, seg in zip(r.block_hashes, r.prompt_token_ids.segments):
            if len(seg) == 512:
                assert shared.setdefault(h, seg) is seg


GOOD_LINE = '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}'


@pytest.mark.parametrize("text", [
    GOOD_LINE + "\n\n" + GOOD_LINE + "\n",  # a blank line
    GOOD_LINE + "\r\n" + GOOD_LINE + "\r\n",  # CRLF
    " " + GOOD_LINE + "\n",  # space around a line
    "\ufeff" + GOOD_LINE + "\n",  # a byte order mark
    GOOD_LINE.replace("}", ', "note": "a:b"}') + "\n",  # a colon in a string: one more colon than keys
    GOOD_LINE.replace("}", ', "meta": {"x": 1}}') + "\n",  # a nested object
    GOOD_LINE + "\n" + GOOD_LINE.replace('"timestamp": 5', '"timestamp": 5.0') + "\n",
    GOOD_LINE.replace("[1, 2]", "[1, true]") + "\n",  # a boolean id would index a table as 1
    GOOD_LINE.replace("[1, 2]", "[1, -2]") + "\n",  # a negative one would index from the end
])
def test_load_trace_reads_anything_unusual_line_by_line(tmp_path, text):
    """Any doubt sends the file to the line-by-line reader, which loads it or names its first bad line."""
    p = tmp_path / "odd.jsonl"
    p.write_text(text, encoding="utf-8", newline="")
    assert _load_well_formed(p, 512, p.stem) is None
    try:
        slow = _slow_load(p)
    except TraceFormatError as e:
        with pytest.raises(TraceFormatError) as got:
            load_trace(p)
        assert (str(got.value), got.value.where, got.value.field) == (str(e), e.where, e.field)
    else:
        _same_requests(load_trace(p), slow)


@pytest.mark.parametrize("bad", [
    '{"timestamp": 1, "timestamp": 2, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}',
    '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]} {"x": 1}',
    '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1]}',
    '{"timestamp": 1, "input_length": 600, "output_length": 1}',
    '[{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}]',
    '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1, 2.5]}',
    '{"timestamp": 1, "input_length": 600, "output_length": -1, "hash_ids": [1, 2]}',
    '{"timestamp": 1, "input_length": 10000001, "output_length": 1, "hash_ids": [1, 2]}',
])
def test_load_trace_names_the_bad_line_as_the_line_by_line_reader_does(tmp_path, bad):
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join([GOOD_LINE] * 40 + [bad] + [GOOD_LINE] * 3) + "\n")
    with pytest.raises(TraceFormatError) as slow:
        read_records(p)
    with pytest.raises(TraceFormatError) as fast:
        load_trace(p)
    assert slow.value.where == f"{p}:41"
    assert (str(fast.value), fast.value.where, fast.value.field) == (str(slow.value), slow.value.where,
                                                                     slow.value.field)


def test_load_trace_leaves_the_garbage_collector_as_it_found_it(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(GOOD_LINE + "\n")
    assert gc.isenabled()
    load_trace(p)
    assert gc.isenabled()
    p.write_text("{\n")
    with pytest.raises(TraceFormatError):
        load_trace(p)
    assert gc.isenabled()
    gc.disable()
    try:
        p.write_text(GOOD_LINE + "\n")
        load_trace(p)
        assert not gc.isenabled()  # a collector the caller turned off stays off
    finally:
        gc.enable()
