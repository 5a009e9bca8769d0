"""Child processes that do not outlive kvlab: a Linux parent-death signal for a child to set on itself.

``kill -9`` of a sweep or of ``kvlab app`` gives the process no chance to stop what it started, so each child
asks the kernel (``prctl(PR_SET_PDEATHSIG)``) to be signalled when the thread that started it goes: a sweep's
pool workers get SIGKILL (they hold nothing worth saving), Voila gets SIGTERM (it shuts its kernels down and
``kvlab app``'s clean-up runs there). Elsewhere than Linux this does nothing; the parents' own signal handling
is then what stops their children.

A child that starts children of its own (a local Ray cluster: its raylet starts ``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent``, which outlive a raylet killed under them) needs more: inside :func:`reaped`, a small
reaper process notes the descendants started, and marks them too (an environment variable, which their own children
inherit); it kills them when the block ends or when the process that started them dies, even by ``kill -9``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

_PR_SET_PDEATHSIG = 1


def _find_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once, at import: a ``preexec_fn`` runs between fork and exec, where loading a library is unsafe.
_PRCTL = _find_prctl()


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> bool:
    """In a child: receive ``sig`` when the parent that started it dies. If the parent (``parent_pid``) is gone
    already, the signal comes now. Returns whether the kernel took the request (False off Linux). Safe in a
    ``subprocess`` ``preexec_fn``."""
    if _PRCTL is None or _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent_pid:  # the parent died before the request was made: act as if it came after
        os.kill(os.getpid(), sig)
    return True


def _start_worker(parent_pid: int, initializer, initargs: tuple) -> None:
    die_with_parent(parent_pid, signal.SIGKILL)
    if initializer is not None:
        initializer(*initargs)


MAX_WORKERS_ENV = "KVLAB_MAX_WORKERS"


def worker_count(requested: int) -> int:
    """``requested`` worker processes, capped by ``KVLAB_MAX_WORKERS`` when set. ``kvlab app`` sets it to 1 for its
    kernels: each attendee's page is a kernel of its own, and a notebook's pool in each would multiply the processes
    (three per page, ~200 MB per worker) without making anything faster on a busy server."""
    cap = os.environ.get(MAX_WORKERS_ENV, "").strip()
    if cap.isdigit() and int(cap) >= 1:
        return max(1, min(requested, int(cap)))
    return requested


def worker_pool(max_workers: int, initializer=None, initargs: tuple = ()):
    """A ``ProcessPoolExecutor`` of spawned workers (a fresh interpreter: no copy of the parent's torch threads or
    Jupyter kernel) that die with the process that started them, even one killed by SIGKILL. Without this, a
    notebook kernel that dies mid-sweep (a workshop server shutting down, the out-of-memory killer) leaves its
    workers running with no parent, ~200 MB each. ``initializer(*initargs)`` then runs in each worker."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(os.getpid(), initializer, initargs))


REAP_ENV = "KVLAB_REAP_MARK"

# The reaper: while its parent lives, it notes the parent's descendants started after the reaper, once a second, by
# pid and start time (a process may rewrite the memory /proc shows as its environment, as Ray's agents do when they
# set their titles). When its stdin closes (the block ended, or the parent died) it SIGKILLs what it noted, every
# process started after it that carries the mark in its environment, and their children, again until none is left,
# for at most 10 s. SIGKILL: Ray's agents ignore SIGTERM, and none of these holds anything worth saving. Plain Python
# (no kvlab import), in a session of its own, so that the terminal's Ctrl-C or hang-up does not end it early.
_REAPER = r"""
import os, select, signal, sys, time
mark, parent = ("%s=" % sys.argv[1] + sys.argv[2] + "\0").encode(), int(sys.argv[3])
def table():  # pid -> (state, parent, start time) of every process
    found = {}
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rpartition(")")[2].split()
            found[int(entry)] = (fields[0], int(fields[1]), int(fields[19]))
        except (OSError, ValueError):
            pass
    return found
def below(procs, roots):  # (pid, start) of the live processes under ``roots``
    found, frontier = set(), set(roots)
    while frontier:
        frontier = {pid for pid, (state, ppid, _) in procs.items() if ppid in frontier and state not in "ZX"}
        found |= {(pid, procs[pid][2]) for pid in frontier}
    return found
def marked(procs):
    for pid, (state, _, start) in procs.items():
        if state not in "ZX" and start >= born and pid not in (os.getpid(), parent):
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    if mark in b"\0" + f.read():
                        yield pid, start
            except OSError:
                pass
born, noted = table()[os.getpid()][2], set()
while not select.select([sys.stdin], [], [], 1.0)[0] or sys.stdin.buffer.read1(4096):
    noted |= {(pid, start) for pid, start in below(table(), {parent}) if start >= born and pid != os.getpid()}
end = time.monotonic() + 10
while time.monotonic() < end:
    procs = table()
    doomed = {(pid, start) for pid, start in noted if procs.get(pid, ("X",))[0] not in "ZX" and procs[pid][2] == start}
    doomed |= set(marked(procs))
    doomed |= below(procs, {pid for pid, _ in doomed})
    doomed = {(pid, start) for pid, start in doomed if pid not in (os.getpid(), parent)}
    if not doomed:
        break
    for pid, _ in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.2)
"""


@contextmanager
def reaped() -> Iterator[None]:
    """Every process started inside the block, and each one those start, is killed when the block ends, or when this
    process dies without ending it (``kill -9``, the out-of-memory killer). Linux only (it reads ``/proc``);
    elsewhere the block just runs."""
    if not os.path.isdir("/proc/self"):
        yield
        return
    mark = uuid.uuid4().hex
    reaper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER, REAP_ENV, mark, str(os.getpid())],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    before = os.environ.get(REAP_ENV)
    os.environ[REAP_ENV] = mark
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(REAP_ENV, None)
        else:
            os.environ[REAP_ENV] = before
        reaper.stdin.close()  # the reaper's signal to start
        try:
            reaper.wait(timeout=15)
        except subprocess.TimeoutExpired:  # pragma: no cover - it gives up after 10 s itself
            reaper.kill()


__all__ = ["MAX_WORKERS_ENV", "REAP_ENV", "die_with_parent", "reaped", "worker_count", "worker_pool"]
