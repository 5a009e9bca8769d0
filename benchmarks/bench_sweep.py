"""Benchmark: one 8-point sweep (2 eviction modes × 4 pool sizes) of a generated Mooncake-shaped trace, run on the
local engine with 1 worker (in this process) and 2 workers (a process pool), then on a local Ray cluster of 2
CPUs. Prints each run's wall time and points per minute, the 2-worker speed-up (≥ 1.7× expected on 2 idle cores:
the points are independent, and the pool's start-up, a fresh interpreter importing torch per worker, is counted),
and checks that every engine gave the same rows. The machine's load average is printed before and after: on a
shared machine the ratio says more about the neighbours than about kvlab.

    python benchmarks/bench_sweep.py [--requests 6000] [--seed 0] [--no-ray]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from kvlab.experiments.pool_sweep import min_pool_pages
from kvlab.sweep import Grid, RayEngine, run_sweep
from kvlab.workloads.mooncake import generate_trace, load_trace, write_trace

EXPECTED_SPEEDUP = 1.7


def _load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=6000,
                        help="trace length (default: ~7.5 s a point on an idle core, so the 2 s pool start-up is small)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mooncake.jsonl"
        write_trace(path, generate_trace(args.requests, seed=args.seed))
        requests = load_trace(path)
    low = min_pool_pages(requests, 512)
    grid = Grid(page_sizes=(512,), kv_pages=tuple(low * k for k in (1, 2, 4, 8)))  # 2 modes × 4 pools = 8 points
    print(f"trace: {len(requests):,} generated requests; grid: 8 points (modes × pools {list(grid.kv_pages)} pages)")
    print(f"before: {_load()}")

    runs, first = {}, {}

    def first_row(label: str, start: float):
        def note(row: dict, done) -> None:
            first.setdefault(label, time.perf_counter() - start - row["wall_s"])
        return note

    for label, engine, workers in (("local, 1 worker", "local", 1), ("local, 2 workers", "local", 2)):
        runs[label] = run_sweep(requests, grid, engine=engine, workers=workers, progress=False,
                                on_row=first_row(label, time.perf_counter()))
    print(f"local pool start-up ≈ {first['local, 2 workers']:.1f} s (time to the first row less its own run time: "
          f"2 spawned interpreters importing torch; counted in the 2-worker wall time)")
    if not args.no_ray:
        import logging

        import ray

        t = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
        print(f"ray: local cluster of 2 CPUs started in {time.perf_counter() - t:.1f} s (not counted below)")
        try:
            runs["ray, 2 CPUs"] = run_sweep(requests, grid, engine=RayEngine(), progress=False)
        finally:
            ray.shutdown()

    one = runs["local, 1 worker"]
    for label, run in runs.items():
        cpu = sum(r["wall_s"] for r in run.rows)
        print(f"{label:>17}: {run.seconds:6.1f} s wall for 8 points, {run.points_per_minute:6.1f} points/minute "
              f"(points' own run time {cpu:5.1f} s; speed-up over 1 worker {one.seconds / run.seconds:.2f}×)")
        assert run.comparable().equals(one.comparable()), f"{label} gave other rows than the local engine"
    ratio = one.seconds / runs["local, 2 workers"].seconds
    verdict = "as expected" if ratio >= EXPECTED_SPEEDUP else "below the expected (a loaded machine?)"
    print(f"2 workers / 1 worker: {ratio:.2f}× ({verdict}; expected ≥ {EXPECTED_SPEEDUP}× on 2 idle cores)")
    print(f"after: {_load()}")
    print("rows: identical on every engine (timing columns aside)")


if __name__ == "__main__":
    main()
