"""Shared inputs of the sweep tests: a short trace whose points take a fraction of a second each (long enough to
kill a worker in the middle of a sweep), its reference rows computed in this process, and one local Ray cluster
per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.sweep import Grid, run_sweep
from kvlab.workloads.mooncake import load_trace
from tests.conftest import REPO_ROOT

SMALL = REPO_ROOT / "data" / "traces" / "mooncake_small.jsonl"
TINY = REPO_ROOT / "data" / "traces" / "mooncake_tiny.jsonl"
SHORT_REQUESTS = 40
# 2 modes × 4 pools = 8 points; the smallest pool is under pressure, so the two modes differ there
SHORT_GRID = Grid(page_sizes=(512,), kv_pages=(78, 120, 200, 400))


@pytest.fixture(scope="session")
def short_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped trace's first 40 arrivals, as a file of its own (the CLI reads a path)."""
    path = tmp_path_factory.mktemp("trace") / "short.jsonl"
    path.write_text("".join(SMALL.read_text().splitlines(keepends=True)[:SHORT_REQUESTS]))
    return path


@pytest.fixture(scope="session")
def short_requests(short_trace: Path) -> list:
    return load_trace(short_trace)


@pytest.fixture(scope="session")
def reference(short_trace: Path, short_requests: list):
    """The short grid run one point after another in this process: what every engine and every resume must give."""
    return run_sweep(short_requests, SHORT_GRID, source=str(short_trace), workers=1, progress=False)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster (2 CPUs, no dashboard) shared by the session's Ray tests; the engine uses it
    as the cluster this process is connected to, and leaves it running."""
    ray = pytest.importorskip("ray")
    import logging

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()
