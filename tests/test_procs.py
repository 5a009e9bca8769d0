"""kvlab's worker pools die with the process that started them (seen in a workshop: a notebook kernel killed while
its eviction-mode pool ran left both workers running, ~200 MB each, with no parent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kvlab.procs import worker_pool

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A parent that starts a two-worker pool, prints the workers' pids once both run a task, and waits to be killed.
PARENT = """
import os, sys, time
from kvlab.procs import worker_pool

pool = worker_pool(2)
futures = [pool.submit(time.sleep, 600) for _ in range(2)]
while len(pool._processes) < 2 or not all(f.running() for f in futures):
    time.sleep(0.05)
print(" ".join(str(pid) for pid in pool._processes), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux parent-death signal")
def test_workers_die_with_a_parent_killed_by_sigkill():
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env)
    workers: list[int] = []
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers), workers
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in workers if _alive(pid)]
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"workers left running after their parent was killed: {left}"


def _set_marker(value: str) -> None:
    os.environ["KVLAB_TEST_WORKER_INIT"] = value


def _marker() -> str | None:
    return os.environ.get("KVLAB_TEST_WORKER_INIT")


def test_the_initializer_still_runs_in_each_worker():
    with worker_pool(1, _set_marker, ("ran",)) as pool:
        assert pool.submit(_marker).result(timeout=120) == "ran"


def test_kvlab_max_workers_caps_the_pools(monkeypatch):
    from kvlab.procs import worker_count
    from kvlab.sweep.engine import LocalEngine

    monkeypatch.delenv("KVLAB_MAX_WORKERS", raising=False)
    assert worker_count(4) == 4 and LocalEngine(4).workers == 4
    monkeypatch.setenv("KVLAB_MAX_WORKERS", "1")
    assert worker_count(4) == 1 and LocalEngine(4).workers == 1
    monkeypatch.setenv("KVLAB_MAX_WORKERS", "not a number")  # ignored, not an error inside a notebook
    assert worker_count(3) == 3


def test_kvlab_app_kernels_run_their_pools_in_process(monkeypatch):
    from kvlab.app import app_env

    monkeypatch.delenv("KVLAB_MAX_WORKERS", raising=False)
    assert app_env(None)["KVLAB_MAX_WORKERS"] == "1"
    monkeypatch.setenv("KVLAB_MAX_WORKERS", "4")  # the instructor's own setting wins
    assert app_env(None)["KVLAB_MAX_WORKERS"] == "4"
