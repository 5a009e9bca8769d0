"""A generated corpus that looks like the snapshots users bring (issue 20): ``kvlab replay --json`` with the
default what-if and three others on every case of ``kvlab.device.replay.gen.random_case`` (random settings,
streams, deferred frees, ``empty_cache`` runs, OOMs near the device's limit, histories that start mid-run and
free older blocks, torch-version format variants), each written as a real pickle file.

Every run exits 0 with JSON on stdout and nothing but ``kvlab: warning:`` lines on stderr; every what-if row is
there and says whether it is exact; and the fidelity replay is exact wherever the generator's own truth says it
must be (:func:`kvlab.device.replay.gen.exactness`). The bulk calls the CLI in-process; a few go through a real
``python -m kvlab.cli`` process. Seeds 0..n-1, n from tests/fuzz.py (``replay_corpus``: 300 under the CI profile,
3,000 under ``KVLAB_FUZZ=long``). :func:`run_corpus` also gives the counts for a report::

    python -c "from tests.device.test_replay_corpus import run_corpus; print(run_corpus(300, '/tmp/corpus'))"
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import fuzz

from kvlab.cli import main
from kvlab.device.replay.gen import random_case
from tests.conftest import REPO_ROOT

WHAT_IFS = ("max_split_size_mb=128", "roundup_power2_divisions=4", "expandable_segments=False")


def _argv(path: Path, case) -> list[str]:
    argv = ["replay", str(path), "--json", "--what-if", "expandable_segments=True"]
    for what in WHAT_IFS:
        argv += ["--what-if", what]
    if case.near_limit and case.seed % 2:  # half the cases near the limit know the device's size
        argv += ["--device-memory", str(case.device_bytes)]
    return argv


def _check(case, code: int, out: str, err: str) -> dict:
    where = f"seed {case.seed} ({case.format}, {case.options})"
    assert code == 0, f"{where}: exit {code}: {err}"
    assert all(line.startswith("kvlab: warning: ") for line in err.splitlines()), f"{where}: {err}"
    data = json.loads(out)
    labels = [w["label"] for w in data["what_if"]]
    assert labels == ["as recorded (modelled)", "expandable_segments=True", *WHAT_IFS], where
    for row in data["what_if"]:
        assert row["exact"] == (not row["caveats"]), where
    if case.exact_expected:
        assert data["fidelity"]["exact"] is True, f"{where}: {data['fidelity']['first_divergence']}"
    return data


def _frees_older_blocks(snapshot: dict) -> bool:
    allocated: set = set()
    for e in snapshot["device_traces"][-1]:
        if e["action"] == "alloc":
            allocated.add(e["addr"])
        elif e["action"] == "free_completed":
            if e["addr"] not in allocated:
                return True
            allocated.discard(e["addr"])
    return False


def run_corpus(n: int, folder: str | os.PathLike, first: int = 0) -> Counter:
    """Run cases ``first .. first + n - 1`` in-process; return the counts (cases, exits, divergences)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter()
    for seed in range(first, first + n):
        fuzz.record("replay_corpus")
        case = random_case(seed)
        path = folder / f"case-{seed}.pickle"
        path.write_bytes(pickle.dumps(case.snapshot, protocol=4))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(_argv(path, case))
        counts["cases"] += 1
        counts[f"exit {code}"] += 1
        data = _check(case, code, out.getvalue(), err.getvalue())
        exact = data["fidelity"]["exact"]
        counts["exact expected" if case.exact_expected else "exactness not promised"] += 1
        counts["fidelity exact" if exact else "fidelity diverges"] += 1
        counts["what-if rows"] += len(data["what_if"])
        counts["what-if rows exact"] += sum(w["exact"] for w in data["what_if"])
        counts["mid-run"] += case.options["drop_first"] > 0
        counts["frees blocks older than the history"] += _frees_older_blocks(case.snapshot)
        path.unlink()
    return counts


def test_the_generated_corpus_replays_with_every_what_if(tmp_path):
    n = fuzz.examples("replay_corpus")
    counts = run_corpus(n, tmp_path)
    assert counts["cases"] == counts["exit 0"] == n
    assert counts["what-if rows"] == 5 * n
    # the corpus has what it claims: mid-run histories, cases that must be exact and cases that may not
    assert counts["mid-run"] and counts["exact expected"] and counts["exactness not promised"]
    assert counts["frees blocks older than the history"] > n // 5


def test_a_few_cases_through_a_real_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for seed in (1, 4, 17):  # mid-run, near the limit, expandable, torch 2.0 format
        case = random_case(seed)
        path = tmp_path / f"case-{seed}.pickle"
        path.write_bytes(pickle.dumps(case.snapshot, protocol=4))
        proc = subprocess.run([sys.executable, "-m", "kvlab.cli", *_argv(path, case)], capture_output=True, text=True,
                              timeout=120, env=env, cwd=tmp_path)
        _check(case, proc.returncode, proc.stdout, proc.stderr)
