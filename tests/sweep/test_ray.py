"""The Ray engine on a real local cluster (2 CPUs, no dashboard): the same rows as the local engine, workers that
import this checkout's kvlab, and a worker killed mid-sweep loses no row (Ray retries its task). Then ``kvlab sweep
--engine ray`` as a process: stopped by SIGTERM it says what it wrote, and killed by SIGKILL its cluster goes too."""

from __future__ import annotations

import os
import signal

import pytest

from kvlab.sweep import RayEngine, run_sweep
from tests.conftest import REPO_ROOT

from .conftest import SHORT_GRID

pytestmark = pytest.mark.slow


def test_workers_import_this_checkout(ray_cluster):
    @ray_cluster.remote
    def where() -> str:
        import kvlab

        return kvlab.__file__

    assert ray_cluster.get(where.remote()).startswith(str(REPO_ROOT / "kvlab"))


def test_ray_gives_the_local_rows(ray_cluster, short_requests, short_trace, reference, tmp_path):
    out = tmp_path / "rows.parquet"
    hosts = set()
    run = run_sweep(short_requests, SHORT_GRID, source=str(short_trace), engine="ray", out=out, progress=False,
                    on_row=lambda row, done: hosts.add((done.host, done.pid)))
    assert run.engine == "ray" and run.workers == 2 and run.computed == 8
    assert run.comparable().equals(reference.comparable())
    assert all(pid != os.getpid() for _, pid in hosts)  # the points ran in Ray's workers, not here
    assert ray_cluster.is_initialized()  # a cluster the engine joined is left running


def test_a_killed_ray_worker_loses_no_row(ray_cluster, short_requests, short_trace, reference):
    killed = []

    def kill_worker(row, done):
        if not killed:  # the worker that reported first is running its next point now
            os.kill(done.pid, signal.SIGKILL)
            killed.append(done.pid)

    run = run_sweep(short_requests, SHORT_GRID, source=str(short_trace), engine=RayEngine(max_retries=3),
                    progress=False, on_row=kill_worker)
    assert killed
    assert run.comparable().equals(reference.comparable())


# A grid long enough (16 points) that the sweep is still running when the test stops it.
CLI_PAGES = "78,90,100,120,150,200,300,400"


def _session(sid: int) -> dict[int, str]:
    """Live processes of session ``sid`` (the sweep's, started with ``start_new_session``): pid -> command line."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[3]) == sid:
            found[int(entry)] = command
    return found


def _start_ray_sweep(trace, out):
    """``kvlab sweep --engine ray --workers 2`` in a session of its own, once its cluster is up and a row is written."""
    import subprocess
    import sys
    import time

    command = [sys.executable, "-m", "kvlab.cli", "sweep", "--trace", str(trace), "--kv-pages", CLI_PAGES,
               "--engine", "ray", "--workers", "2", "--out", str(out)]
    err = out.with_suffix(".err")
    with open(err, "w") as stderr:  # a file, not a pipe: a process left alive would hold a pipe open
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    deadline = time.monotonic() + 240
    while not (out.exists() and out.read_text().count("\n") >= 2) and proc.poll() is None:
        assert time.monotonic() < deadline, "no row after 240 s"
        time.sleep(0.1)
    assert proc.poll() is None, f"the sweep ended before the test could stop it: {err.read_text()}"
    assert any("ray::" in c or "raylet" in c for c in _session(proc.pid).values()), _session(proc.pid)
    return proc, command, err


def _left_after(proc, seconds: float) -> dict[int, str]:
    import time

    deadline = time.monotonic() + seconds
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _session(proc.pid)
    for pid in left:  # the test's own session: end what it started
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc (Linux)")
def test_a_ray_sweep_killed_by_sigkill_takes_its_cluster_with_it(short_trace, tmp_path):
    """``kill -9`` gives the sweep no chance to shut Ray down; the cluster it started (raylet, GCS, and the
    ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` that outlived them) still goes within 10 s."""
    pytest.importorskip("ray")
    proc, _, _ = _start_ray_sweep(short_trace, tmp_path / "rows.csv")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    left = _left_after(proc, 10)
    assert not left, f"processes of the killed sweep still running 10 s later: {left}"


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc (Linux)")
def test_a_ray_sweep_stopped_by_sigterm_says_what_it_wrote(short_trace, tmp_path):
    """A plain ``kill``: kvlab's handler, not Ray's (no C++ stack dump, no death by the signal), ends the sweep with
    the rows written, where, and the command that resumes; and the cluster goes too."""
    from kvlab.sweep.store import open_row_file

    out = tmp_path / "rows.csv"
    proc, command, err = _start_ray_sweep(short_trace, out)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    left = _left_after(proc, 10)
    text = err.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, text
    assert "SIGTERM received" not in text and "PC: @" not in text, text
    rows = len(open_row_file(out).rows)
    assert text.splitlines()[-1] == (f"kvlab: sweep stopped by SIGTERM: {rows} new rows written to {out} ({rows} in "
                                     f"all); to resume, run the same command again: kvlab {' '.join(command[3:])}")
    assert not left, f"processes of the stopped sweep still running 10 s later: {left}"
