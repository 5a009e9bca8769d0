"""Child processes that do not outlive kvlab: a Linux parent-death signal for a child to set on itself.

``kill -9`` of a sweep or of ``kvlab app`` gives the process no chance to stop what it started, so each child
asks the kernel (``prctl(PR_SET_PDEATHSIG)``) to be signalled when the thread that started it goes: a sweep's
pool workers get SIGKILL (they hold nothing worth saving), Voila gets SIGTERM (it shuts its kernels down and
``kvlab app``'s clean-up runs there). Elsewhere than Linux this does nothing; the parents' own signal handling
is then what stops their children.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

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


__all__ = ["MAX_WORKERS_ENV", "die_with_parent", "worker_count", "worker_pool"]
