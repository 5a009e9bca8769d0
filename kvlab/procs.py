"""Child processes that do not outlive kvlab: a Linux parent-death signal for a child to set on itself.

``kill -9`` of a sweep or of ``kvlab app`` gives the process no chance to stop what it started, so each child
asks the kernel (``prctl(PR_SET_PDEATHSIG)``) to be signalled when the thread that started it goes: a sweep's
pool workers get SIGKILL (they hold nothing worth saving), Voila gets SIGTERM (it shuts its kernels down and
``kvlab app``'s clean-up runs there). Elsewhere than Linux this does nothing; the parents' own signal handling
is then what stops their children.

A child that starts children of its own (a local Ray cluster: its raylet starts ``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent``, which outlive a raylet killed under them) needs more: :func:`reaped` marks every process
started inside it (the mark is an environment variable, which their own children inherit) and a small reaper
process kills every marked process when the block ends or when the process that started them dies, even by
``kill -9``.
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

# The reaper: waits for its stdin to close (the block ended, or its parent died), then SIGKILLs every process whose
# environment carries the mark, again until none is left (one may be starting another), for at most 10 s. SIGKILL:
# Ray's agents ignore SIGTERM, and a marked process holds nothing worth saving. Plain Python (no kvlab import), in a
# session of its own, so that the terminal's Ctrl-C or hang-up does not end it before it has done its work.
_REAPER = r"""
import os, signal, sys, time
mark, spared = ("%s=" % sys.argv[1] + sys.argv[2] + "\0").encode(), {os.getpid(), int(sys.argv[3])}
def stat(pid):  # the fields after the command name: state is [0], the start time [19]
    with open("/proc/%s/stat" % pid) as f:
        return f.read().rpartition(")")[2].split()
born = int(stat("self")[19])  # a marked process starts after the reaper: older ones are not read
sys.stdin.buffer.read()
def marked():
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in spared:
            try:
                fields = stat(entry)
                if fields[0] in "ZX" or int(fields[19]) < born:
                    continue
                with open("/proc/%s/environ" % entry, "rb") as f:
                    if mark in b"\0" + f.read():
                        yield int(entry)
            except OSError:
                pass
end = time.monotonic() + 10
while time.monotonic() < end:
    found = 0
    for pid in marked():
        try:
            os.kill(pid, signal.SIGKILL)
            found += 1
        except OSError:
            pass
    if not found:
        break
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
