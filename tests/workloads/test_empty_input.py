"""No requests is an error, not a run: an empty trace file (0 bytes, or blank lines only) or a workload that yields
no request is named in a ``ValueError`` (the CLIs: exit 2, one line on stderr, no traceback), where before the
simulator reported zeros with exit 0.

The CLI cases run the real commands in a fresh interpreter on this checkout's kvlab."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvlab import cli
from kvlab.errors import KvlabError
from kvlab.experiments import pool_sweep, shortfall_eviction
from kvlab.workloads import WORKLOADS, iter_records, load_trace, make_workload, read_records, register_workload
from kvlab.workloads.mooncake import TraceFormatError
from tests.conftest import REPO_ROOT

EMPTY_FILES = {
    "empty.jsonl": ("", "the file is 0 bytes"),
    "blank.jsonl": ("\n  \n\t\r\n\n", "4 blank lines, nothing else"),
    "one_blank.jsonl": ("   ", "1 blank line, nothing else"),
}


@pytest.fixture(params=sorted(EMPTY_FILES))
def empty_trace(request, tmp_path):
    content, detail = EMPTY_FILES[request.param]
    path = tmp_path / request.param
    path.write_bytes(content.encode())
    return path, f"{path}: empty trace: no requests ({detail}); a Mooncake-format trace has one JSON object per line"


def test_reader_refuses_an_empty_trace(empty_trace):
    path, message = empty_trace
    for read in (read_records, load_trace, lambda p: list(iter_records(p)),
                 lambda p: shortfall_eviction.load_requests(trace=p)):
        with pytest.raises(TraceFormatError) as info:
            read(path)
        assert str(info.value) == message
        assert info.value.where == str(path)
        assert isinstance(info.value, KvlabError) and isinstance(info.value, ValueError)


def test_a_trace_with_one_record_among_blank_lines_still_loads(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text('\n\n{"timestamp": 3, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}\n\n')
    assert [r.prompt_len for r in load_trace(path)] == [600]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
           "KVLAB_PROGRESS": "0"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=REPO_ROOT)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        (["-m", "kvlab.cli", "simulate", "--trace"], "kvlab: error: "),
        (["-m", "kvlab.cli", "simulate", "--kv-pages", "4", "--json", "--trace"], "kvlab: error: "),  # ran before
        (["-m", "kvlab.experiments.pool_sweep", "--trace"], "error: "),
    ],
    ids=["simulate", "simulate-kv-pages", "pool-sweep"],
)
def test_cli_exits_2_naming_the_empty_trace(empty_trace, command, prefix):
    path, message = empty_trace
    proc = _run(*command, str(path))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr == f"{prefix}{message}\n"  # one line: no traceback
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("workload", "param"),
    [("generated-shared-prefix", "num_groups"), ("generated-shared-prefix", "prompts_per_group"),
     ("multi-turn-chat", "num_sessions"), ("multi-turn-chat", "turns"), ("few-shot", "num_requests")],
)
def test_cli_workload_params_giving_no_requests_exit_2(workload, param, capsys):
    """Every count that would give no requests is refused by its generator, naming the parameter."""
    assert cli.main(["simulate", "--workload", workload, "--workload-param", f"{param}=0"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"kvlab: error: workload {workload!r} with {param}=0: {param} must be an int >= 1, "
                            f"got 0\n") and captured.out == ""


def test_a_registered_workload_that_yields_nothing_is_named():
    @register_workload("kvlab-test-nothing")
    def nothing(seed: int = 0, count: int = 0):
        return make_workload("few-shot", seed=seed, num_requests=1)[:count]

    try:
        assert len(make_workload("kvlab-test-nothing", count=1)) == 1
        with pytest.raises(ValueError, match=r"^workload 'kvlab-test-nothing' with its defaults \(seed 7\) yields no "
                                             r"requests$"):
            make_workload("kvlab-test-nothing", seed=7)
        with pytest.raises(ValueError, match=r"^workload 'kvlab-test-nothing' with count=0 \(seed 0\) yields no "):
            shortfall_eviction.load_requests(workload="kvlab-test-nothing", overrides={"count": 0})
    finally:
        del WORKLOADS["kvlab-test-nothing"]


def test_no_requests_in_memory_is_named_too():
    with pytest.raises(ValueError, match="^no requests to size a KV pool for$"):
        shortfall_eviction.run([])
    with pytest.raises(ValueError, match="^no requests to sweep$"):
        pool_sweep.sweep([], [4])
