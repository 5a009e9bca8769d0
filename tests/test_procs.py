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


# A parent that, inside kvlab.procs.reaped(), starts a child that starts a grandchild and exits (as Ray's raylet starts
# its agents): the grandchild is in a session of its own, ignores SIGTERM and has no parent left to die with. The
# parent prints the grandchild's pid and waits to be killed; a second line "end" asks it to leave the block instead.
REAPED_PARENT = r"""
import os, subprocess, sys, time
from kvlab.procs import reaped

ORPHAN = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, "
          "signal.SIG_IGN); time.sleep(600)'], start_new_session=True, stdout=subprocess.DEVNULL, "
          "stderr=subprocess.DEVNULL); "
          "print(p.pid, flush=True)")
with reaped():
    child = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, check=True)
    print(child.stdout.strip(), flush=True)
    sys.stdin.readline()
print("left the block", flush=True)
time.sleep(600)
"""


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), while it runs; None once it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("end", ["sigkill", "block"])
def test_what_a_reaped_block_started_goes_with_it(end):
    """:func:`kvlab.procs.reaped` (what a sweep's local Ray cluster runs in): a process started inside the block,
    even one its own child started and left in another session ignoring SIGTERM, is gone when the block ends and
    when the process that started it is killed with SIGKILL."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    parent = subprocess.Popen([sys.executable, "-c", REAPED_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    orphan, born = 0, None
    try:
        orphan = int(parent.stdout.readline())
        born = _start_time(orphan)
        assert born is not None
        if end == "sigkill":
            parent.send_signal(signal.SIGKILL)
            parent.wait(timeout=30)
        else:
            parent.stdin.write("end\n")
            parent.stdin.flush()
            assert parent.stdout.readline() == "left the block\n"
            assert parent.poll() is None  # the block's end reaps what it started, not the process itself
        deadline = time.monotonic() + 15
        while _start_time(orphan) == born and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _start_time(orphan) == born
    finally:
        if parent.poll() is None:
            parent.kill()
        if orphan and _start_time(orphan) == born:
            os.kill(orphan, signal.SIGKILL)
    assert not left, f"a process started inside reaped() outlived it ({end}): {orphan}"
