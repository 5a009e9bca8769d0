"""Where a sweep's points run: a process pool on this machine, or a Ray cluster. One point is one task.

Both engines run :func:`kvlab.sweep.point.run_point` on the same requests and report each finished point to
``on_result`` as soon as it is done, in the main thread (so the caller writes rows in one place). A worker
that dies mid-point loses nothing: the local pool is restarted and the points not yet reported run again
(up to ``max_restarts`` times); Ray retries the task itself (``max_retries``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.procs import reaped, worker_count, worker_pool
from kvlab.sched import RequestLike
from kvlab.sweep.grid import SweepError
from kvlab.sweep.point import Point, run_point

ENGINES = ("local", "ray")
RAY_EXTRA = "pip install 'kvlab[ray]'"


@dataclass(frozen=True)
class Finished:
    """One point done: its index in the task list, its totals (:func:`run_point`), and who ran it."""

    index: int
    totals: dict
    pid: int
    host: str


OnResult = Callable[[Finished], None]


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# ---- local: a process pool ------------------------------------------------------------------------

_WORKER_STATE: dict[str, Any] = {}  # in a pool worker: the sweep's requests and extra config, set once


def _init_worker(requests: Sequence[RequestLike], extra: dict) -> None:
    # A worker holds ~370 MB and nothing worth saving: worker_pool makes it die with the sweep, even one killed by
    # SIGKILL (its multiprocessing resource tracker then sees every end of its pipe closed and exits too).
    # The parent decides what a Ctrl-C does (stop the sweep, keep the rows); a terminal's SIGINT reaches the
    # whole process group, and a worker that died of it would look like a crash to be retried.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_STATE.update(requests=requests, extra=extra)


def _pool_task(index: int, point: Point) -> tuple[int, dict, int]:
    return index, run_point(_WORKER_STATE["requests"], point, **_WORKER_STATE["extra"]), os.getpid()


class LocalEngine:
    """``workers`` processes on this machine (default: one per available core); ``workers=1`` runs the points
    one after the other in this process (no pool to start)."""

    name = "local"

    def __init__(self, workers: int | None = None, *, max_restarts: int = 3) -> None:
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise SweepError(f"--workers: expected a positive integer, got {workers!r}")
        self.workers = worker_count(workers or available_cpus())  # 1 in a kvlab app kernel
        self.max_restarts = max_restarts
        self.restarts = 0  # pools that broke (a worker died) and were started again
        self._pool = None

    def worker_pids(self) -> list[int]:
        """The pool's worker processes now (empty when running in this process)."""
        pool = self._pool
        return [p.pid for p in list(getattr(pool, "_processes", {}).values())] if pool is not None else []

    def run(self, requests: Sequence[RequestLike], tasks: Sequence[Point], extra: dict, on_result: OnResult) -> None:
        if self.workers == 1:
            for index, point in enumerate(tasks):
                on_result(Finished(index, run_point(requests, point, **extra), os.getpid(), socket.gethostname()))
            return
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        remaining = dict(enumerate(tasks))
        host = socket.gethostname()
        while remaining:
            pool = worker_pool(min(self.workers, len(remaining)), _init_worker, (list(requests), extra))
            self._pool, broken, clean = pool, False, False
            try:
                futures = [pool.submit(_pool_task, i, p) for i, p in remaining.items()]
                for future in as_completed(futures):
                    if isinstance(future.exception(), BrokenProcessPool):
                        broken = True  # a worker died: the points it and its neighbours were running run again
                        continue
                    index, totals, pid = future.result()
                    del remaining[index]
                    on_result(Finished(index, totals, pid, host))
                clean = True
            finally:
                self._pool = None
                if clean and not broken:
                    pool.shutdown(wait=True)
                else:
                    _stop(pool)
            if broken and remaining:
                self.restarts += 1
                if self.restarts > self.max_restarts:
                    raise SweepError(f"local engine: worker processes died {self.restarts} times; "
                                     f"{len(remaining)} points were not run (rerun to resume)")


def _stop(pool) -> None:
    """Stop a pool now: cancel what has not started and end the workers (a point takes seconds to minutes)."""
    processes = list(getattr(pool, "_processes", {}).values())  # before shutdown() forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)


# ---- Ray ----------------------------------------------------------------------------------------

_RAY_CACHE: dict[str, Any] = {}  # in a Ray worker: the current sweep's (requests, extra), fetched once per worker


def _ray_task(key: str, box: list, index: int, point: Point) -> tuple[int, dict, int, str]:
    # ``box`` holds the ObjectRef in a list so that Ray passes the ref instead of the requests: a worker
    # fetches and unpickles them once per sweep, not once per point.
    if key not in _RAY_CACHE:
        import ray

        _RAY_CACHE.clear()
        _RAY_CACHE[key] = ray.get(box[0])
    requests, extra = _RAY_CACHE[key]
    return index, run_point(requests, point, **extra), os.getpid(), socket.gethostname()


def import_ray():
    try:
        import ray
    except ImportError:
        raise SweepError(f"--engine ray needs Ray, the optional extra kvlab[ray]: {RAY_EXTRA}") from None
    return ray


class RayEngine:
    """Ray tasks: on the cluster this process is already connected to, else the one at ``address``, else a
    local cluster started here (``workers`` CPUs, default all) and shut down at the end. The cluster's
    workers must be able to import kvlab (same version)."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None, *, max_retries: int = 3) -> None:
        self.ray = import_ray()
        self.address, self.workers, self.max_retries = address, workers, max_retries

    def run(self, requests: Sequence[RequestLike], tasks: Sequence[Point], extra: dict, on_result: OnResult) -> None:
        if self.ray.is_initialized():
            self._run_tasks(requests, tasks, extra, on_result, cancel=True)
            return
        with contextlib.ExitStack() as stack:
            if not self.address:  # a cluster started here ends with the sweep, even with a sweep killed by SIGKILL
                stack.enter_context(reaped())
            self._init()
            stack.callback(self.ray.shutdown)
            # a cluster started here stops its tasks when it shuts down; cancelling them first races with tasks
            # that are finishing (Ray 2.60 then aborts the driver: "Tried to complete task that was not pending")
            self._run_tasks(requests, tasks, extra, on_result, cancel=bool(self.address))

    def _init(self) -> None:
        """Join the cluster at ``address``, or start a local one, keeping this process's signal handlers: Ray's
        driver installs its own for SIGTERM (a C++ stack dump, then death by the signal), which would replace the
        sweep's (stop, keep the rows, say how to resume)."""
        import logging

        ray = self.ray
        options = dict(include_dashboard=False, logging_level=logging.WARNING)
        handlers = _python_handlers()
        try:
            if self.address:
                check_reachable(self.address)  # Ray itself retries an address nobody answers at for minutes
                ray.init(address=self.address, **options)
            else:
                ray.init(num_cpus=self.workers, **options)
        except ConnectionError as exc:
            raise SweepError(f"--ray-address {self.address}: cannot join a Ray cluster there ({exc})") from None
        finally:
            _restore_handlers(handlers)

    def _run_tasks(self, requests: Sequence[RequestLike], tasks: Sequence[Point], extra: dict, on_result: OnResult,
                   *, cancel: bool) -> None:
        ray = self.ray
        self.workers = int(ray.cluster_resources().get("CPU", 0)) or self.workers  # what the tasks share
        box = [ray.put((list(requests), extra))]
        task = ray.remote(num_cpus=1, max_retries=self.max_retries)(_ray_task)
        key = uuid.uuid4().hex
        pending = {task.remote(key, box, i, p): i for i, p in enumerate(tasks)}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    del pending[ref]
                    index, totals, pid, host = ray.get(ref)
                    on_result(Finished(index, totals, pid, host))
        finally:
            for ref in pending if cancel else ():  # interrupted or failed: a cluster that stays up stops the rest
                ray.cancel(ref, force=True)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _python_handlers() -> dict:
    return {sig: signal.getsignal(sig) for sig in _SIGNALS}


def _restore_handlers(handlers: dict) -> None:
    """Install ``handlers`` (:func:`signal.getsignal`'s) again: a C library may have replaced them underneath Python,
    which still reports its own. Only the main thread may set handlers; elsewhere this does nothing."""
    with contextlib.suppress(ValueError):
        for sig, handler in handlers.items():
            if handler is not None:  # None: set from C before Python started; nothing of Python's to put back
                signal.signal(sig, handler)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``host:port`` or ``ray://host:port`` address must accept a TCP connection; ``auto`` and other forms are
    left to Ray. Raises :class:`SweepError` naming the address."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise SweepError(f"--ray-address {address}: no Ray cluster answers there ({exc})") from None


def make_engine(engine: str | Any = "local", *, workers: int | None = None, ray_address: str | None = None):
    """An engine by name (``local``, ``ray``), or ``engine`` itself when it is one already."""
    if not isinstance(engine, str):
        return engine
    if engine == "local":
        if ray_address:
            raise SweepError(f"--ray-address {ray_address} needs --engine ray")
        return LocalEngine(workers)
    if engine == "ray":
        return RayEngine(ray_address, workers)
    raise SweepError(f"--engine: unknown engine {engine!r} (known: {', '.join(ENGINES)})")
