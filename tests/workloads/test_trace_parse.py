"""The Mooncake reader's fast parse path (one UTF-8 decode, the JSON scanner per line, inline record checks)
equals the line-by-line oracle: ``json.loads`` of each line, then the full record checks."""

import json
import random

import pytest

from kvlab.workloads import TraceFormatError, read_records
from kvlab.workloads.mooncake import MooncakeRecord, _parse_record


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
