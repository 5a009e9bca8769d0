"""The Ray engine on a real local cluster (2 CPUs, no dashboard): the same rows as the local engine, workers that
import this checkout's kvlab, and a worker killed mid-sweep loses no row (Ray retries its task)."""

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
