"""The traces shipped in data/traces/ are what the commands in data/README.md write, byte for byte."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.workloads import load_trace, read_records, trace_stats

ROOT = Path(__file__).resolve().parents[2]
TRACES = ["traces/mooncake_small.jsonl", "traces/mooncake_tiny.jsonl"]


def _command_for(rel_path: str) -> "list[str]":
    readme = (ROOT / "data" / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{rel_path}` |"))
    command = re.findall(r"`([^`]*)`", row.rsplit("|", 2)[1])[0]  # the "how it was made" cell
    return shlex.split(command)


@pytest.mark.parametrize("rel_path", TRACES)
def test_readme_command_regenerates_identical_bytes(rel_path, tmp_path):
    argv = _command_for(rel_path)
    assert argv[:2] == ["python", "benchmarks/make_mooncake_trace.py"]
    out = argv.index("--out") + 1
    assert argv[out] == f"data/{rel_path}"
    argv[out] = str(tmp_path / "again.jsonl")
    subprocess.run([sys.executable] + argv[1:], cwd=ROOT, check=True, capture_output=True)
    assert (tmp_path / "again.jsonl").read_bytes() == (ROOT / "data" / rel_path).read_bytes()


def test_tiny_trace_by_hand():
    recs = read_records(ROOT / "data/traces/mooncake_tiny.jsonl")
    assert [r.hash_ids for r in recs] == [(0, 1, 2), (0, 3, 4, 5), (0, 3, 4, 6, 7), (0, 8, 9), (0, 3, 10)]
    assert [r.input_length for r in recs] == [1209, 1788, 2062, 1094, 1348]
    # request 3 is request 2's next turn: its prompt holds request 2's prompt and output
    assert recs[2].input_length >= recs[1].input_length + recs[1].output_length
    hits = 0 + 512 + 3 * 512 + 512 + 2 * 512  # leading whole blocks seen before
    assert trace_stats(recs).ideal_hit_rate == pytest.approx(hits / 7501)
    reqs = load_trace(ROOT / "data/traces/mooncake_tiny.jsonl")
    assert reqs[2].prompt_token_ids[:1536] == reqs[1].prompt_token_ids[:1536]
    assert reqs[2].prompt_token_ids[1536] != reqs[1].prompt_token_ids[1536]
