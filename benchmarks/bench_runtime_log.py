"""Read a runtime log of a million lines: lines per second and the memory the reading held.

The log is generated (seeded): SGLang 0.5.x Prefill / Decode lines of two DP ranks with docker prefixes, HTTP
access lines between them, a retraction now and then, written to a temp file and read with
``kvlab.serving.runtime``'s streaming reader, then turned into the timeline and its findings.

    python benchmarks/bench_runtime_log.py [--lines 1000000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import tempfile
import time

from kvlab.serving.runtime.report import runtime_json, runtime_timeline


def write_log(path: str, n_lines: int, seed: int) -> None:
    rng = random.Random(seed)
    usage = 0.1
    with open(path, "w") as f:
        for i in range(n_lines):
            sec = i // 10  # ten lines a second, as a busy server prints
            stamp = f"2026-01-{1 + sec // 86400:02d} {sec // 3600 % 24:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
            dp = i % 2
            usage = min(0.99, max(0.0, usage + rng.uniform(-0.02, 0.021)))
            kind = rng.random()
            if kind < 0.3:
                new = rng.randrange(1, 8192)
                f.write(f"sglang-1  | [{stamp} DP{dp} TP{dp}] Prefill batch, #new-seq: {rng.randrange(1, 9)}, "
                        f"#new-token: {new}, #cached-token: {rng.randrange(0, 4 * new)}, token usage: {usage:.2f}, "
                        f"#running-req: {rng.randrange(0, 256)}, #queue-req: {rng.randrange(0, 64)}, "
                        f"#pending-token: 0, cuda graph: False, input throughput (token/s): {rng.uniform(1e3, 5e4):.2f}\n")
            elif kind < 0.8:
                f.write(f"sglang-1  | [{stamp} DP{dp} TP{dp}] Decode batch, #running-req: {rng.randrange(1, 256)}, "
                        f"#token: {int(usage * 500000)}, token usage: {usage:.2f}, cuda graph: True, "
                        f"gen throughput (token/s): {rng.uniform(1e2, 1e4):.2f}, #queue-req: {rng.randrange(0, 64)}\n")
            elif kind < 0.8005:
                f.write(f"sglang-1  | [{stamp} DP{dp} TP{dp}] KV cache pool is full. Retract requests. "
                        f"#retracted_reqs: {rng.randrange(1, 5)}, #new_tokens_gained: 4096, "
                        f"#new_token_ratio: 0.3000 -> 0.6000\n")
            else:
                f.write(f'sglang-1  | [{stamp}] INFO:     127.0.0.1:{40000 + i % 20000} - "POST /generate HTTP/1.1" 200 OK\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "runtime.log")
        write_log(path, args.lines, args.seed)
        size = os.path.getsize(path)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start, cpu = time.perf_counter(), time.process_time()
        tl = runtime_timeline(path)
        read_s, read_cpu = time.perf_counter() - start, time.process_time() - cpu
        data = runtime_json(tl)
        total_s = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{args.lines:,} lines ({size / 2**20:,.0f} MiB), {tl.log.n_steps:,} steps: read and timed in {read_s:.2f} s "
          f"({args.lines / read_s:,.0f} lines/s; CPU {read_cpu:.2f} s, {args.lines / read_cpu:,.0f} lines/s of CPU); "
          f"with the summary and findings {total_s:.2f} s")
    print(f"peak RSS grew by {(peak - before) / 1024:,.0f} MiB while reading (the file: {size / 2**20:,.0f} MiB)")
    print(f"hit rate {data['hit_rate']['overall']:.4f}, retractions {data['events']['retraction_lines']}, "
          f"findings {[f['name'] for f in data['findings']]}, skipped {data['skipped']['count']}")


if __name__ == "__main__":
    main()
