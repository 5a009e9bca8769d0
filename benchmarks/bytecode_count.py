"""Benchmark: Python bytecodes executed by the same simulation without and with HiCache, counted, in one run.

``bench_hicache.py`` times the arms in CPU seconds, which on a shared machine move by a few per cent from run to run.
This script counts instead: each arm runs ``simulate`` (the page engine, the fast decode path) on the first
``--requests`` requests in a fresh process under ``sys.settrace`` with opcode events, and counts every bytecode
executed inside the run, per function. The counts are the same on every run (``PYTHONHASHSEED=0``), so a change
that trims the HiCache arms shows here even where the timings cannot tell it from noise. It prints

- each arm's bytecodes and its ratio to the plain run (the ratio ``bench_hicache.py``'s target is about: CPU
  seconds per bytecode differ between the arms by several per cent, the HiCache arms' being the more costly);
- the functions whose counts differ most between the plain run and the host + storage one: where the extra goes.

A bytecode is not a unit of time (loading a local costs a fraction of a call): a change that removes cheap ones moves
the count more than the CPU seconds. Read the count for where the work is and for a change too small to time.

    python benchmarks/make_mooncake_trace.py --out /tmp/conv.jsonl --preset conversation --force
    python benchmarks/bytecode_count.py --trace /tmp/conv.jsonl                      # 3,000 requests, default pool
    python benchmarks/bytecode_count.py --trace /tmp/conv.jsonl --kv-pages 400 --max-running 64 --top 40
    python benchmarks/bytecode_count.py --trace /tmp/conv.jsonl --baseline /tmp/kvlab-main   # another checkout too

Tracing makes a run some twenty times slower: keep ``--requests`` in the thousands.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_fast_decode import trace_or_preset  # noqa: E402  (no package)

sys.path.insert(0, str(HERE.parent))
from kvlab.mem_cache.hicache.storage import PREFETCH_POLICIES, STORAGE_BACKENDS  # noqa: E402  (torch-free)
from kvlab.mem_cache.options import WRITE_POLICIES  # noqa: E402

_CHILD = """
import collections, json, sys
from kvlab.workloads.mooncake import load_trace
from kvlab.sched import SchedulerConfig, simulate
trace, n, config = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
reqs = load_trace(trace)[:n]
cfg = SchedulerConfig(**config)
counts = collections.Counter()
def call(frame, event, arg):
    code = frame.f_code
    where = f"{code.co_qualname} ({code.co_filename.rpartition('/kvlab/')[2] or code.co_filename}:{code.co_firstlineno})"
    frame.f_trace_opcodes, frame.f_trace_lines = True, False
    def step(frame, event, arg):
        if event == "opcode":
            counts[where] += 1
        return step
    return step
sys.settrace(call)
result = simulate(reqs, cfg, progress=False)
sys.settrace(None)
print(json.dumps(dict(counts=counts, hit_rate=result.totals()["hit_rate"])))
"""


def count(root: Path, trace: Path, requests: int, config: dict) -> dict:
    """One arm in a fresh process whose kvlab is the one under ``root``: bytecodes per function, and the hit rate."""
    env = dict(os.environ, PYTHONPATH=str(root), KVLAB_PROGRESS="0", PYTHONHASHSEED="0")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(trace), str(requests), json.dumps(config)], env=env,
                         cwd=root, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, help="Mooncake-format JSONL (default: the conversation preset, generated)")
    p.add_argument("--requests", type=int, default=3000, help="the first N requests (default 3000)")
    p.add_argument("--page-size", type=int, default=512)
    p.add_argument("--kv-pages", type=int, default=2000)
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--eviction", default="shortfall", choices=["shortfall", "full"])
    p.add_argument("--hicache-ratio", type=float, default=4.0)
    p.add_argument("--write-policy", default="write_through", choices=WRITE_POLICIES)
    p.add_argument("--storage-backend", default="file", choices=STORAGE_BACKENDS)
    p.add_argument("--prefetch-policy", default="best_effort", choices=PREFETCH_POLICIES)
    p.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    p.add_argument("--baseline", type=Path, help="another kvlab checkout: its arms counted too, beside this tree's")
    args = p.parse_args(argv)
    if args.requests < 1:
        p.error(f"--requests must be >= 1, got {args.requests}")

    plain = dict(kv_tokens=args.kv_pages * args.page_size, page_size=args.page_size, max_running=args.max_running,
                 eviction=args.eviction, fast_decode=True)
    host = {**plain, "hicache_ratio": args.hicache_ratio, "hicache_write_policy": args.write_policy}
    storage = {**host, "hicache_storage_backend": args.storage_backend,
               "hicache_storage_prefetch_policy": args.prefetch_policy}
    root = HERE.parent
    with trace_or_preset(args.trace) as trace:
        print(f"{args.requests:,} requests of {trace.name}, {args.page_size}-token pages, {args.kv_pages:,} device "
              f"pages, {args.max_running} running, {args.eviction}; host tier --hicache-ratio {args.hicache_ratio:g} "
              f"{args.write_policy}; storage {args.storage_backend} {args.prefetch_policy}", flush=True)
        arms = {}
        for name, config in (("page", plain), ("page+host", host), ("page+storage", storage)):
            arms[name] = count(root, trace, args.requests, config)
            total = sum(arms[name]["counts"].values())
            base = sum(arms["page"]["counts"].values())
            line = (f"  {name:<13} {total:>12,} bytecodes · {total / base:.3f}x the plain run · hit rate "
                    f"{arms[name]['hit_rate']:.2%}")
            if args.baseline:
                other = count(args.baseline.resolve(), trace, args.requests, config)
                was = sum(other["counts"].values())
                line += (f" · baseline {was:,} ({total / was - 1:+.2%})"
                         f"{'' if other['hit_rate'] == arms[name]['hit_rate'] else ' · hit rate DIFFERS'}")
            print(line, flush=True)
    a, b = arms["page"]["counts"], arms["page+storage"]["counts"]
    extra = sum(b.values()) - sum(a.values())
    print(f"where host + storage's {extra:,} more go (the {args.top} functions that differ most):")
    for where in sorted(set(a) | set(b), key=lambda w: -abs(b.get(w, 0) - a.get(w, 0)))[:args.top]:
        d = b.get(where, 0) - a.get(where, 0)
        print(f"  {d:>+11,} ({d / extra:>6.1%})  {where}")
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"benchmark: {time.perf_counter() - t0:.0f} s")
    sys.exit(code)
