"""Benchmark: the same simulation without and with HiCache's host tier, in one run (issue 21 item 7).

For each eviction mode it times ``simulate`` (the fast decode path) on the same requests three ways, each in a
fresh process: without HiCache on this tree; without HiCache on a baseline checkout (``--baseline DIR``, e.g.
``git archive <commit> | tar -x -C DIR``: the path without HiCache must be no slower than it, and its totals
identical on every key both have); and with ``--hicache-ratio`` on this tree (target: at most 1.5 times the run
without). The runs alternate within each mode, so a shared machine's load hits all three; ``--repeat N`` runs each
N times and keeps each one's fastest (CPU seconds). The runs, the trace and the printed figures are
``bench_fast_decode.py``'s (``run_one``, ``trace_or_preset``, ``settings_line``, ``timing``, ``ratio``).

    python benchmarks/bench_hicache.py --baseline /tmp/kvlab-main --requests 3000
    python benchmarks/bench_hicache.py --trace /tmp/conv.jsonl --kv-pages 2000 --hicache-ratio 4 --write-policy write_back

Defaults: the conversation-shaped trace (``make_mooncake_trace.py --preset conversation``, generated), 512-token
pages, 2,000 device pages, 16 running, ``--hicache-ratio 4``, ``write_through``. Timings on a shared machine are
noisy: read the ratios, and the CPU seconds.

Measured with ``python benchmarks/bench_hicache.py --trace conv.jsonl --requests 1500 --baseline <77d01da>
--repeat 3`` (conv.jsonl: ``make_mooncake_trace.py --preset conversation``; the defaults above; 2 shared cores;
fastest CPU seconds of 3): with HiCache 2.3 / 2.3 s against 1.9 / 1.9 s without
(shortfall / full): 1.17x / 1.23x (target <= 1.5x); without HiCache this tree and the baseline 77d01da take the same
time within the machine's noise (0.87x / 0.99x in that run, 1.83 against 1.79 s fastest of five alternating runs),
totals identical. Merged with issue 22's faster allocator and scheduler (branch speed22b at d05d18d), the same run
gave 1.7 / 1.7 s against 1.4 / 1.6 s: 1.22x / 1.10x. Before this work the HiCache run took 1.9-2.3x the run
without: its time went to per-call heapifies of every leaf (device ``evict`` and ``evict_host``, as 0.5.16 does),
the host pool's tensor free list and its per-slot double-free check, and re-walking and re-comparing a request's own
prefix on every insert. Now each tier keeps one heap of its leaves across calls (stale entries skipped on pop), the
host pool's free list is page ids with slot tensors sliced from one table, and insert walks a request's locked path
without comparing it again. What is left is the host tier's own work: a backup per new node (host slots, a copy
record, a lock until the copy lands), host evictions once the pool is full, load-backs, and a poll per step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_fast_decode import ratio, run_one, settings_line, timing, trace_or_preset  # noqa: E402  (no package)

TARGET = 1.5  # issue 21 item 7: with HiCache on, at most 1.5x the same simulation without it
# "the same simulation": on the memory HiCache runs on (SchedulerKV's token-level tree); without HiCache the fast
# path now runs on the page engine by default (issue 22), timed too, for the record
TOKEN_ENGINE = {"page_engine": False}


def _fastest(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["cpu_s"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, help="Mooncake-format JSONL (default: the conversation preset, generated)")
    p.add_argument("--requests", type=int, default=1_000_000, help="use the first N requests (default all)")
    p.add_argument("--page-size", type=int, default=512)
    p.add_argument("--kv-pages", type=int, default=2000)
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--hicache-ratio", type=float, default=4.0)
    p.add_argument("--write-policy", default="write_through",
                   choices=["write_through", "write_through_selective", "write_back"])
    p.add_argument("--modes", nargs="+", default=["shortfall", "full"], choices=["shortfall", "full"])
    p.add_argument("--baseline", type=Path, help="another kvlab checkout, timed without HiCache")
    p.add_argument("--repeat", type=int, default=1, help="runs per arm; each arm's fastest counts (default 1)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be >= 1, got {args.repeat}")

    root = HERE.parent
    host = {"hicache_ratio": args.hicache_ratio, "hicache_write_policy": args.write_policy}
    ok = True
    with trace_or_preset(args.trace) as trace:
        print(settings_line(args, f"; host tier --hicache-ratio {args.hicache_ratio:g} --hicache-write-policy "
                                  f"{args.write_policy}; fastest of {args.repeat}"))
        for mode in args.modes:
            arms: dict[str, list[dict]] = {"off": [], "on": [], "page": [], "base": []}
            for _ in range(args.repeat):  # alternate, so the machine's load hits every arm alike
                arms["off"].append(run_one(root, trace, mode, args, fast=True, config=TOKEN_ENGINE))
                arms["on"].append(run_one(root, trace, mode, args, fast=True, config=host))
                arms["page"].append(run_one(root, trace, mode, args, fast=True))
                if args.baseline:
                    arms["base"].append(run_one(args.baseline.resolve(), trace, mode, args, fast=True))
            off, on, page = _fastest(arms["off"]), _fastest(arms["on"]), _fastest(arms["page"])
            within = on["cpu_s"] / off["cpu_s"] <= TARGET
            same = all(page["totals"][k] == off["totals"][k] for k in off["totals"])
            ok &= within and same
            lines = [f"{mode:>9}: without HiCache {timing(off)} · hit rate {off['totals']['hit_rate']:.2%} "
                     "(the token-level memory, HiCache's)",
                     f"{'':>11}with HiCache    {timing(on)} · hit rate {on['totals']['hit_rate']:.2%} · "
                     f"with / without {ratio(on, off)} (target <= {TARGET}x{'' if within else ': MISSED'})",
                     f"{'':>11}page engine     {timing(page)} · without HiCache on the page engine (kvlab simulate's "
                     f"default): with HiCache / it {ratio(on, page)} · totals {'identical' if same else 'DIFFER'}"]
            if args.baseline:
                base = _fastest(arms["base"])
                shared = [k for k in base["totals"] if k in off["totals"]]
                same = all(base["totals"][k] == off["totals"][k] for k in shared)
                ok &= same
                lines.append(f"{'':>11}baseline        {timing(base)} · baseline / this tree without HiCache "
                             f"{ratio(base, off)} (>= 1: no slower) · totals {'identical' if same else 'DIFFER'} "
                             f"on its {len(shared)} keys")
            print("\n".join(lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"benchmark: {time.perf_counter() - t0:.0f} s")
    sys.exit(code)
