"""Mooncake-format traces: loading and token synthesis, every bad-input error, writing, generation."""

import json
import math
import re
import time
import tracemalloc
from pathlib import Path

import pytest

from kvlab.units import div_ceil
from kvlab.workloads import (
    MooncakeRecord,
    TraceFormatError,
    block_tokens,
    generate_trace,
    load_trace,
    read_records,
    records_to_requests,
    trace_stats,
    write_trace,
)

SMALL_TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "mooncake_small.jsonl"
GOOD = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [4, 5]}


def _write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_load_synthesises_blocks_from_hash_ids(tmp_path):
    p = _write_lines(tmp_path / "t.jsonl", [
        json.dumps({"timestamp": 3000, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 9]}),
        json.dumps({"timestamp": 1000, "input_length": 600, "output_length": 0, "hash_ids": [0, 2]}),
        json.dumps({"timestamp": 1000, "input_length": 1024, "output_length": 3, "hash_ids": [0, 1]}),
    ])
    reqs = load_trace(p)
    assert [r.rid for r in reqs] == ["t-1", "t-2", "t-0"]  # by arrival; the tie keeps file order
    assert [r.arrival_time_s for r in reqs] == [1.0, 1.0, 3.0]
    assert [r.prompt_len for r in reqs] == [600, 1024, 1100]
    assert [r.output_len for r in reqs] == [0, 3, 7]
    last = reqs[2]
    assert last.block_hashes == (0, 1, 9) and last.block_size == 512
    toks = last.prompt_token_ids
    assert toks[:512] == range(0, 512) and toks[512:1024] == range(512, 1024)
    assert toks[1024:] == range(9 * 512, 9 * 512 + 76)  # partial last block: its first 76 tokens
    assert toks[:1024] == reqs[1].prompt_token_ids  # blocks 0, 1 shared
    # a shared block is one object, not a copy
    assert reqs[0].prompt_token_ids.segments[0] is reqs[2].prompt_token_ids.segments[0]
    assert block_tokens(9) == range(4608, 5120)


def test_page_size_512_pages_are_the_trace_blocks():
    """Across a whole trace, full 512-token pages and hash ids correspond one to one."""
    reqs = load_trace(SMALL_TRACE)
    page_of_id, id_of_page = {}, {}
    for r in reqs:
        toks = r.prompt_token_ids
        for j, h in enumerate(r.block_hashes):
            page = tuple(toks[j * 512:(j + 1) * 512])
            if len(page) < 512:
                assert page == tuple(block_tokens(h)[:len(page)])
                continue
            assert page_of_id.setdefault(h, page) == page
            assert id_of_page.setdefault(page, h) == h


def test_ideal_hit_rate_matches_a_token_level_brute_force():
    recs = read_records(SMALL_TRACE)
    reqs = records_to_requests(recs)
    seen, hit, total = set(), 0, 0
    for r in reqs:  # longest prefix of whole 512-token pages seen in an earlier prompt, by tokens
        toks = r.prompt_token_ids.to_array()
        full = len(toks) // 512
        matching = True
        for j in range(full):
            key = bytes(toks[: (j + 1) * 512])
            if matching and key in seen:
                hit += 512
            else:
                matching = False
            seen.add(key)
        total += len(toks)
    assert trace_stats(recs).ideal_hit_rate == pytest.approx(hit / total)


# --- every bad input, with the exact message --------------------------------------------------------------

def _bad(**changes):
    rec = dict(GOOD)
    for k, v in changes.items():
        if v is KeyError:
            del rec[k]
        else:
            rec[k] = v
    return json.dumps(rec)


BAD_LINES = [
    ('{"timestamp": 0,', None, None),  # JSON message checked against json itself below
    ("[1, 2]", None, "expected a JSON object, got array"),
    ('"text"', None, "expected a JSON object, got string"),
    (_bad(timestamp=KeyError), "timestamp", "missing field 'timestamp'"),
    (_bad(input_length=KeyError), "input_length", "missing field 'input_length'"),
    (_bad(output_length=KeyError), "output_length", "missing field 'output_length'"),
    (_bad(hash_ids=KeyError), "hash_ids", "missing field 'hash_ids'"),
    (_bad(timestamp=-1), "timestamp", "field 'timestamp' must be an integer >= 0 (milliseconds), got -1"),
    (_bad(timestamp=1.5), "timestamp", "field 'timestamp' must be an integer >= 0 (milliseconds), got 1.5"),
    (_bad(input_length=-5), "input_length", "field 'input_length' must be an integer >= 1, got -5"),
    (_bad(input_length=0), "input_length", "field 'input_length' must be an integer >= 1, got 0"),
    (_bad(input_length=12.0), "input_length", "field 'input_length' must be an integer >= 1, got 12.0"),
    (_bad(input_length="1000"), "input_length", "field 'input_length' must be an integer >= 1, got \"1000\""),
    (_bad(input_length=True), "input_length", "field 'input_length' must be an integer >= 1, got true"),
    (_bad(output_length=-1), "output_length", "field 'output_length' must be an integer >= 0, got -1"),
    (_bad(output_length=None), "output_length", "field 'output_length' must be an integer >= 0, got null"),
    (_bad(hash_ids="4,5"), "hash_ids", "field 'hash_ids' must be a list of integers, got \"4,5\""),
    (_bad(hash_ids={"a": 1}), "hash_ids", "field 'hash_ids' must be a list of integers, got {\"a\": 1}"),
    (_bad(hash_ids=[4, "5"]), "hash_ids",
     "field 'hash_ids' must be a list of integers in [0, 18014398509481983]; element 1 is \"5\""),
    (_bad(hash_ids=[4.0, 5]), "hash_ids",
     "field 'hash_ids' must be a list of integers in [0, 18014398509481983]; element 0 is 4.0"),
    (_bad(hash_ids=[4, -1]), "hash_ids",
     "field 'hash_ids' must be a list of integers in [0, 18014398509481983]; element 1 is -1"),
    (_bad(hash_ids=[4, 2**54]), "hash_ids",
     "field 'hash_ids' must be a list of integers in [0, 18014398509481983]; element 1 is 18014398509481984"),
    (_bad(hash_ids=[4, False]), "hash_ids",
     "field 'hash_ids' must be a list of integers in [0, 18014398509481983]; element 1 is false"),
    (_bad(hash_ids=[4]), "hash_ids", "field 'hash_ids' has 1 ids but input_length 1000 needs "
                                     "div_ceil(1000, 512) = 2"),
    (_bad(hash_ids=[4, 5, 6]), "hash_ids", "field 'hash_ids' has 3 ids but input_length 1000 needs "
                                           "div_ceil(1000, 512) = 2"),
    (_bad(input_length=1024, hash_ids=[4, 5, 6]), "hash_ids",
     "field 'hash_ids' has 3 ids but input_length 1024 needs div_ceil(1024, 512) = 2"),
]


@pytest.mark.parametrize("line, field, message", BAD_LINES)
def test_bad_line_error_names_file_line_and_field(tmp_path, line, field, message):
    if message is None:
        try:
            json.loads(line)
        except json.JSONDecodeError as e:
            message = f"not valid JSON: {e.msg} (column {e.colno})"
    # line 7: five good lines, one blank line (counted, skipped), then the bad one
    p = _write_lines(tmp_path / "trace.jsonl", [json.dumps(GOOD)] * 5 + [""] + [line, json.dumps(GOOD)])
    with pytest.raises(TraceFormatError) as e:
        load_trace(p)
    assert str(e.value) == f"{p}:7: {message}"
    assert e.value.where == f"{p}:7" and e.value.field == field
    assert isinstance(e.value, ValueError)


def test_not_utf8_is_reported_with_its_line(tmp_path):
    p = tmp_path / "trace.jsonl"
    p.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"timestamp": "\xff"}\n')
    with pytest.raises(TraceFormatError, match=r"trace\.jsonl:2: not valid JSON: "):
        load_trace(p)


def test_block_size_must_be_positive(tmp_path):
    p = _write_lines(tmp_path / "t.jsonl", [json.dumps(GOOD)])
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        load_trace(p, block_size=0)
    assert load_trace(p, block_size=500)[0].prompt_len == 1000  # 2 blocks of 500


def test_empty_and_blank_files_are_refused(tmp_path):  # more cases, and the CLIs: test_empty_input.py
    p = tmp_path / "empty.jsonl"
    p.write_text("\n  \n")
    with pytest.raises(TraceFormatError, match=rf"^{re.escape(str(p))}: empty trace: no requests \(2 blank lines"):
        load_trace(p)


# --- writing ----------------------------------------------------------------------------------------------

def test_write_then_load_round_trip(tmp_path):
    recs = generate_trace(300, seed=4)
    p = write_trace(tmp_path / "rt.jsonl", recs)
    assert read_records(p) == recs
    text = p.read_text()
    assert text == "".join(json.dumps(r.to_dict()) + "\n" for r in recs)
    assert text.splitlines()[0].startswith('{"timestamp": 0, "input_length": ')  # the published spelling
    reqs = load_trace(p)
    by_rid = {r.rid: r for r in reqs}
    for i, rec in enumerate(recs):
        r = by_rid[f"rt-{i}"]
        assert (r.prompt_len, r.output_len, r.block_hashes) == (rec.input_length, rec.output_length, rec.hash_ids)
        assert r.arrival_time_s == rec.timestamp_ms / 1000


def test_write_refuses_to_overwrite(tmp_path):
    p = tmp_path / "t.jsonl"
    write_trace(p, [GOOD])
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        write_trace(p, [GOOD, GOOD])
    assert len(read_records(p)) == 1
    write_trace(p, [GOOD, GOOD], overwrite=True)
    assert len(read_records(p)) == 2


def test_write_checks_every_record_before_opening(tmp_path):
    p = tmp_path / "t.jsonl"
    with pytest.raises(TraceFormatError) as e:
        write_trace(p, [GOOD, dict(GOOD, hash_ids=[1])])
    assert str(e.value) == "records[1]: field 'hash_ids' has 1 ids but input_length 1000 needs div_ceil(1000, 512) = 2"
    assert not p.exists()
    with pytest.raises(TraceFormatError, match=r"^records\[0\]: field 'input_length'"):
        records_to_requests([MooncakeRecord(0, -3, 1, ())])


# --- generation -------------------------------------------------------------------------------------------

def test_generate_trace_shape_and_determinism():
    recs = generate_trace(2000, seed=1)
    assert recs == generate_trace(2000, seed=1)
    assert recs != generate_trace(2000, seed=2)
    s = trace_stats(recs)
    assert s.num_requests == 2000
    assert abs(s.mean_input_len - 12000) < 1  # the scale is solved for the mean
    assert 250 < s.mean_output_len < 400
    assert s.duration_s == pytest.approx(2000 / 3.34, rel=0.2)  # longer: the first turns have no follow-ups yet
    assert 0.2 < s.ideal_hit_rate < 0.8
    ts = [r.timestamp_ms for r in recs]
    assert ts == sorted(ts) and ts[0] == 0
    assert all(len(r.hash_ids) == div_ceil(r.input_length, 512) for r in recs)
    assert all(r.hash_ids[0] == 0 for r in recs)  # the shared 512-token system prompt, as in the real trace


def test_generated_hash_ids_are_chained_and_numbered_by_first_appearance():
    recs = generate_trace(1500, seed=3)
    prefix_of, next_new = {}, 0
    for r in recs:
        for j, h in enumerate(r.hash_ids):
            if h not in prefix_of:
                assert h == next_new  # 0, 1, 2, ... in order of first appearance
                next_new += 1
                prefix_of[h] = r.hash_ids[:j]
            assert prefix_of[h] == r.hash_ids[:j]  # an id fixes the whole prefix before it
    # multi-turn: some request repeats all the whole blocks of an earlier, shorter one and goes on
    assert any(b.input_length >= a.input_length + a.output_length
               and b.hash_ids[: a.input_length // 512] == a.hash_ids[: a.input_length // 512]
               and a.input_length // 512 > 4
               for i, a in enumerate(recs[:300]) for b in recs[i + 1:i + 300])


def test_generate_trace_parameters_are_checked():
    with pytest.raises(ValueError, match="mean_input_len 100 is out of reach"):
        generate_trace(10, mean_input_len=100)
    with pytest.raises(ValueError, match="turn_continue_prob out of range: 1.0"):
        generate_trace(10, turn_continue_prob=1.0)
    with pytest.raises(ValueError, match="num_requests must be an int >= 1, got 0"):
        generate_trace(0)


@pytest.mark.slow
def test_a_12k_request_trace_loads_in_seconds_and_little_memory(tmp_path):
    p = write_trace(tmp_path / "big.jsonl", generate_trace(12000, seed=0))
    t0 = time.perf_counter()
    reqs = load_trace(p)
    load_s = time.perf_counter() - t0
    assert len(reqs) == 12000 and abs(sum(r.prompt_len for r in reqs) - 12000 * 12000) < 12000
    del reqs
    tracemalloc.start()
    reqs = load_trace(p)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert load_s < 10  # ~1 s on a laptop core
    assert held < 150 * 2**20  # ~45 MiB; flat int64 prompts would be 1.07 GiB
    assert math.isclose(sum(len(r.prompt_token_ids.to_array()) for r in reqs[:100]),
                        sum(r.prompt_len for r in reqs[:100]))


def test_a_missing_file_or_a_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl: trace file not found"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(IsADirectoryError, match="is a directory, not a Mooncake-format JSONL trace file"):
        load_trace(tmp_path)


def test_generate_trace_spreads_follow_the_sigmas():
    """output_sigma=0 makes every output the mean; a wider message_sigma spreads prompts (lower median at the
    same mean); a negative sigma is refused by name."""
    flat = generate_trace(300, output_sigma=0.0, mean_output_len=123)
    assert {r.output_length for r in flat} == {123}
    narrow, wide = (generate_trace(600, message_sigma=s) for s in (0.5, 1.5))
    med = [sorted(r.input_length for r in t)[300] for t in (narrow, wide)]
    means = [sum(r.input_length for r in t) / 600 for t in (narrow, wide)]
    assert abs(means[0] - means[1]) < 2 and med[1] < med[0]
    with pytest.raises(ValueError, match="message_sigma"):
        generate_trace(10, message_sigma=-1.0)
