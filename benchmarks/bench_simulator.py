"""Benchmark: a Mooncake-shaped trace (~12k-token prompts sharing prefixes) through the simulator in both
eviction modes, at block granularity (page size 512). Prints each mode's wall and CPU time, the wall time of
both together against the 30 s target for 12,000 requests, and the two modes' hit rates.

Each mode is single-threaded; by default the two run side by side in two processes (the machine's two
cores), as ``kvlab.experiments.shortfall_eviction.compare_totals`` does. ``--processes 1`` runs them one
after the other, for the sequential figure.

    python benchmarks/bench_simulator.py [--requests 12000] [--kv-pages 2048] [--seed 0] [--processes 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kvlab.experiments import shortfall_eviction
from kvlab.workloads.mooncake import generate_trace, load_trace, write_trace

TARGET_S_12K = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=12_000)
    parser.add_argument("--kv-pages", type=int, default=2048, help="KV pool in 512-token pages (default 1M tokens)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-running", type=int, default=256)
    parser.add_argument("--processes", type=int, default=2, help="1: the modes one after the other (default 2)")
    args = parser.parse_args()

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mooncake.jsonl"
        write_trace(path, generate_trace(args.requests, seed=args.seed))
        requests = load_trace(path)
    gen_s = time.perf_counter() - t0
    mean_len = sum(r.prompt_len for r in requests) / len(requests)
    print(f"trace: {len(requests):,} requests, mean prompt {mean_len:,.0f} tokens (generated + loaded in {gen_s:.1f} s)")
    longest = max(r.prompt_len + r.output_len for r in requests)
    kv_tokens = max(args.kv_pages, -(-4 * longest // 512)) * 512
    t = time.perf_counter()
    results = shortfall_eviction.compare_totals(requests, processes=args.processes, page_size=512,
                                                kv_tokens=kv_tokens, max_running=args.max_running)
    total_s = time.perf_counter() - t
    for mode, tot in results.items():
        print(f"{mode:>9}: {tot['wall_s']:7.1f} s wall, {tot['cpu_s']:6.1f} s CPU · {tot['steps']:,} steps · "
              f"hit rate {tot['hit_rate']:.2%} · over-evicted {tot['over_evicted_tokens']:,} tokens · "
              f"retractions {tot['retractions']}")
    cpu = sum(tot["cpu_s"] for tot in results.values())
    scaled = total_s * 12_000 / len(requests)
    how = "side by side in 2 processes" if args.processes > 1 else "one after the other"
    print(f"both modes ({how}): {total_s:.1f} s wall, {cpu:.1f} s CPU for {len(requests):,} requests "
          f"(≈ {scaled:.0f} s wall scaled to 12,000; target {TARGET_S_12K:.0f} s → ratio {scaled / TARGET_S_12K:.2f}× the target)")

if __name__ == "__main__":
    main()
