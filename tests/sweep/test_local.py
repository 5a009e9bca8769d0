"""The local engine: a process pool gives the rows of a one-at-a-time run; a worker killed mid-sweep loses no row;
an interrupted ``kvlab sweep`` (Ctrl-C or SIGTERM) resumes to the rows of an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kvlab.sweep import Grid, LocalEngine, run_sweep
from kvlab.sweep.store import open_row_file
from tests.conftest import REPO_ROOT

from .conftest import SHORT_GRID


@pytest.mark.slow
def test_a_pool_gives_the_same_rows(short_requests, short_trace, reference):
    run = run_sweep(short_requests, SHORT_GRID, source=str(short_trace), workers=2, progress=False)
    assert run.engine == "local" and run.workers == 2 and run.computed == 8
    assert run.comparable().equals(reference.comparable())
    assert len({r["hit_rate"] for r in run.rows}) > 1  # the grid's points really differ


@pytest.mark.slow
def test_a_killed_worker_loses_no_row(short_requests, short_trace, reference):
    engine = LocalEngine(workers=2)
    killed = []

    def kill_one(row, done):
        if not killed:  # after the first row, while the other points are queued or running
            pid = engine.worker_pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    run = run_sweep(short_requests, SHORT_GRID, source=str(short_trace), engine=engine, progress=False,
                    on_row=kill_one)
    assert killed and engine.restarts >= 1  # the pool broke and was started again for the points left
    assert run.comparable().equals(reference.comparable())


# A longer grid than SHORT_GRID (16 points), so the CLI is still running when the test stops it.
CLI_PAGES = (78, 90, 100, 120, 150, 200, 300, 400)


def _cli(trace, out, workers):
    return [sys.executable, "-m", "kvlab.cli", "sweep", "--trace", str(trace), "--kv-pages",
            ",".join(map(str, CLI_PAGES)), "--workers", str(workers), "--out", str(out)]


def _data_rows(path) -> int:
    return max(0, path.read_text().count("\n") - 1) if path.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "workers"), [(signal.SIGINT, 1), (signal.SIGTERM, 2)], ids=["sigint-1", "sigterm-2"])
def test_an_interrupted_sweep_resumes_to_the_same_rows(short_requests, short_trace, tmp_path, sig, workers):
    out = tmp_path / "rows.csv"
    # SIGINT back to its default in the child (a shell may start background jobs with it ignored)
    proc = subprocess.Popen(_cli(short_trace, out, workers), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while _data_rows(out) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, f"the sweep ended before the test could stop it: {proc.communicate()}"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "sweep interrupted after" in err and "run the same command again to resume" in err, err
    kept = open_row_file(out).rows
    assert 2 <= len(kept) < 16
    rerun = subprocess.run(_cli(short_trace, out, workers), cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"({len(kept)} already in rows.csv): {16 - len(kept)} computed" in rerun.stdout
    uninterrupted = run_sweep(short_requests, Grid(page_sizes=(512,), kv_pages=CLI_PAGES), source=str(short_trace),
                              workers=1, progress=False)
    resumed = open_row_file(out).rows
    # the rows written before the stop, untouched (their order is the finishing order, and the resumed file is
    # rewritten in grid order at the end, so compare membership, wall_s included)
    assert all(r in resumed for r in kept), [r for r in kept if r not in resumed]
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in resumed]
    assert strip == uninterrupted.comparable().to_dict(orient="records")
