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
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err
    kept = open_row_file(out).rows
    what = "interrupted" if sig == signal.SIGINT else f"stopped by {sig.name}"
    # one line: what stopped it, the rows written and where, and the command that resumes (multiprocessing's
    # resource tracker may warn of the stopped pool's semaphores after it)
    assert [line for line in err.splitlines() if line.startswith("kvlab:")][-1] == (f"kvlab: sweep {what}: {len(kept)} new rows written to {out} ({len(kept)} in all); "
                                    f"to resume, run the same command again: kvlab {' '.join(_cli(short_trace, out, workers)[3:])}"), err
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


def _live_descendants(root: int) -> list[tuple[int, int]]:
    """(pid, start time) of every live process below ``root``, read from /proc."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = open(f"/proc/{name}/stat").read()  # noqa: SIM115
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] not in ("Z", "X"):
            procs[int(name)] = (int(fields[1]), int(fields[19]))
    found, frontier = [], {root}
    while frontier:
        below = [(pid, start) for pid, (ppid, start) in procs.items() if ppid in frontier]
        found += below
        frontier = {pid for pid, _ in below}
    return found


def _still_alive(procs: list[tuple[int, int]]) -> list[int]:
    alive = []
    for pid, start in procs:
        try:
            stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[19]) == start:
            alive.append(pid)
    return alive


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["sigkill", "sighup"])
def test_a_killed_sweep_leaves_no_process_behind(short_trace, tmp_path, sig):
    """The pool's workers (and multiprocessing's resource tracker) go with the sweep, even one killed by SIGKILL;
    SIGHUP (a closed terminal) stops it as SIGTERM does, with the rows kept."""
    out, log = tmp_path / "rows.csv", tmp_path / "stderr.txt"
    with open(log, "w") as stderr:  # a file, not a pipe: a worker left alive would hold a pipe open
        proc = subprocess.Popen(_cli(short_trace, out, 2), cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    children: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 240
        while _data_rows(out) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, f"the sweep ended before the test could stop it: {log.read_text()}"
        children = _live_descendants(proc.pid)
        assert len(children) >= 2, children  # the two workers (and the resource tracker)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 20
        while _still_alive(children) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _still_alive(children)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _still_alive(children):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running after {sig.name}: {left}"
    if sig == signal.SIGHUP:
        err = log.read_text()
        assert proc.returncode == 129 and "sweep stopped by SIGHUP: " in err, err
    assert len(open_row_file(out).rows) >= 1
