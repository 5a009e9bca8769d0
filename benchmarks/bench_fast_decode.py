"""Benchmark: one simulation per eviction mode, the fast decode path against the reference loop, in one run.

For each mode it runs ``simulate`` with ``fast_decode=True`` and with ``fast_decode=False`` (the plain
step-by-step loop the equivalence tests compare against) on the same requests, checks that the totals are
identical (and the per-step rows, by digest), and prints each one's wall and CPU seconds and the ratio
reference / fast. ``--baseline DIR`` also runs the fast path of another checkout of kvlab (e.g. ``git archive
<commit> | tar -x -C DIR``) in a subprocess on the same trace, alternating with this one, and prints this tree's
speed-up over it; its totals and rows must be identical too. Before those, ``--baseline`` times ``kvlab simulate
--trace ... --json`` end to end in a fresh process for each tree (start-up, trace loading, the run, the JSON, exit)
and requires the two JSON outputs to be byte-identical. ``--hicache-ratio R`` gives every run a host pool.

The default trace has the shape of Mooncake's public conversation trace
(``make_mooncake_trace.py --preset conversation``) and the settings of issue 16:

    python benchmarks/bench_fast_decode.py                       # 12,031 requests, both modes
    python benchmarks/bench_fast_decode.py --requests 3000 --modes full --skip-reference
    python benchmarks/bench_fast_decode.py --baseline /tmp/kvlab-73fc498 --skip-reference
    python benchmarks/bench_fast_decode.py --trace my.jsonl --kv-pages 4000 --max-running 16

Timings on a shared machine are noisy: read the ratios (measured in the same run), and the CPU seconds.
``--split`` adds the CPU seconds spent inside the tree and allocator flows the scheduler calls once per request or
prefill (``release_kv_cache``, ``alloc_paged_token_slots_extend``, ``cache_unfinished_req``, ``match_prefix``,
``evict``; on the page engine, ``PageKV``'s and ``PageRadixTree``'s): on the conversation-shaped trace they were
~54 % of the fast path's time (4.1 of 7.5 CPU s in shortfall mode) before the page engine. On that trace (12,031
requests, ~278,000 steps per mode) the fast path took ~7.5 CPU s per mode at issue 16's end against ~15 s at
1e80ab1 (2.01x / 2.04x) and ~35 s for the reference loop; with the page engine (issue 22) ``kvlab simulate --json``
takes 2.8 s wall end to end a mode against 15.6 / 16.2 s at 77d01da (``--baseline``: 5.49x / 5.85x), the run alone
2.6 / 2.5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

_CHILD = """
import functools, json, sys, time
from kvlab.workloads.mooncake import load_trace
from kvlab.sched import SchedulerConfig, simulate
trace, mode, n, page_size, kv_pages, max_running, fast, split = sys.argv[1:9]
extra = json.loads(sys.argv[9]) if len(sys.argv) > 9 else {}  # more SchedulerConfig fields (bench_hicache.py)
flows = {}
if split == "1":  # CPU seconds inside the tree/allocator flows the scheduler calls once per request or prefill
    import kvlab.sched.kv as S
    from kvlab.mem_cache.radix_cache import RadixCache
    depth = [0]
    def timed(owner, name):
        f = getattr(owner, name)
        @functools.wraps(f)
        def g(*a, **k):
            if depth[0]:
                return f(*a, **k)
            depth[0] += 1
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                depth[0] -= 1
                flows[name] = flows.get(name, 0.0) + time.process_time() - t
        setattr(owner, name, g)
    for name in ("release_kv_cache", "alloc_paged_token_slots_extend"):
        timed(S, name)
    for name in ("cache_unfinished_req", "match_prefix", "evict"):
        timed(RadixCache, name)
    try:  # the page engine's flows (the fast path at page size > 1 without HiCache)
        from kvlab.sched.page_kv import PageKV
        from kvlab.mem_cache.page_tree import PageRadixTree
    except ImportError:  # (a baseline checkout before it)
        PageKV = None
    if PageKV is not None:
        for name in ("_release", "alloc_extend", "_cache", "page_keys"):
            timed(PageKV, name)
        for name in ("match_prefix", "evict"):
            timed(PageRadixTree, name)
reqs = load_trace(trace)[: int(n)]
cfg = SchedulerConfig(kv_tokens=int(kv_pages) * int(page_size), page_size=int(page_size),
                      max_running=int(max_running), eviction=mode, fast_decode=fast == "1", **extra)
wall, cpu = time.perf_counter(), time.process_time()
result = simulate(reqs, cfg, progress=False)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
import hashlib
rows = hashlib.sha256(json.dumps(result.rows, sort_keys=True).encode()).hexdigest()
print(json.dumps(dict(totals=result.totals(), rows_sha256=rows, wall_s=wall, cpu_s=cpu, flows=flows)))
"""


def run_one(root: Path, trace: Path, mode: str, args, fast: bool, split: bool = False,
            config: dict | None = None) -> dict:
    """One simulation in a fresh process whose kvlab is the one under ``root``; ``config``: more
    ``SchedulerConfig`` fields (JSON values, e.g. ``{"hicache_ratio": 4}``)."""
    env = dict(os.environ, PYTHONPATH=str(root), KVLAB_PROGRESS="0")
    argv = [str(trace), mode, str(args.requests), str(args.page_size), str(args.kv_pages), str(args.max_running),
            "1" if fast else "0", "1" if split else "0", json.dumps(config or {})]
    out = subprocess.run([sys.executable, "-c", _CHILD, *argv], env=env, cwd=root, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_cli(root: Path, trace: Path, mode: str, args) -> dict:
    """``python -m kvlab simulate --trace ... --json`` end to end (start-up, trace loading, the run, the JSON) in a
    fresh process whose kvlab is the one under ``root``: its stdout, wall seconds and CPU seconds (user + system)."""
    env = dict(os.environ, PYTHONPATH=str(root), KVLAB_PROGRESS="0")
    argv = [sys.executable, "-m", "kvlab", "simulate", "--trace", str(trace), "--page-size", str(args.page_size),
            "--kv-pages", str(args.kv_pages), "--max-running", str(args.max_running), "--eviction", mode, "--json"]
    if args.hicache_ratio:
        argv += ["--hicache-ratio", str(args.hicache_ratio)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    out = subprocess.run(argv, env=env, cwd=root, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return dict(stdout=out.stdout, wall_s=wall, cpu_s=cpu)


def _first_requests(trace: Path, n: int, out: Path) -> Path:
    """The trace's first ``n`` request lines (what ``load_trace(trace)[:n]`` reads), for the end-to-end runs."""
    with open(trace) as src, open(out, "w") as dst:
        kept = 0
        for line in src:
            if kept >= n:
                break
            dst.write(line)
            kept += bool(line.strip())
    return out


def _preset_trace(path: Path) -> None:
    sys.path.insert(0, str(HERE))
    import make_mooncake_trace

    make_mooncake_trace.main(["--out", str(path), "--preset", "conversation", "--force"])


# -- pieces the other simulation benchmarks share (bench_hicache.py) ------------------------------------------------
@contextlib.contextmanager
def trace_or_preset(trace: Path | None):
    """``trace``, or the conversation preset generated into a temporary folder for the block's duration."""
    if trace is not None:
        yield trace
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "conversation.jsonl"
        _preset_trace(path)
        yield path


def settings_line(args, extra: str = "") -> str:
    """The ``settings:`` line every benchmark prints first (pool, pages, running requests, requests used)."""
    return (f"settings: --page-size {args.page_size} --kv-pages {args.kv_pages} --max-running {args.max_running}"
            f"{'' if args.requests >= 1_000_000 else f' (first {args.requests} requests)'}{extra}")


def timing(run: dict) -> str:
    """One run's seconds, as every line prints them."""
    return f"{run['wall_s']:6.1f} s wall {run['cpu_s']:6.1f} s CPU"


def ratio(num: dict, den: dict) -> str:
    """``num`` / ``den`` in wall and CPU seconds."""
    return f"{num['wall_s'] / den['wall_s']:.2f}x wall, {num['cpu_s'] / den['cpu_s']:.2f}x CPU"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, help="Mooncake-format JSONL (default: the conversation preset, generated)")
    p.add_argument("--requests", type=int, default=1_000_000, help="use the first N requests (default all)")
    p.add_argument("--page-size", type=int, default=512)
    p.add_argument("--kv-pages", type=int, default=4000)
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--modes", nargs="+", default=["shortfall", "full"], choices=["shortfall", "full"])
    p.add_argument("--skip-reference", action="store_true", help="time the fast path only (no ratio)")
    p.add_argument("--baseline", type=Path, help="another kvlab checkout whose fast path to time alongside")
    p.add_argument("--hicache-ratio", type=float, default=0.0,
                   help="run every simulation with a HiCache host pool of R times the device pool (default: off)")
    p.add_argument("--split", action="store_true",
                   help="also time, in a third fast run, the CPU seconds spent inside the per-request tree and "
                        "allocator flows (what no scheduler change can remove)")
    args = p.parse_args(argv)

    root = HERE.parent
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace
        if trace is None:
            trace = Path(tmp) / "conversation.jsonl"
            _preset_trace(trace)
        print(f"settings: --page-size {args.page_size} --kv-pages {args.kv_pages} --max-running {args.max_running}"
              f"{'' if args.requests >= 1_000_000 else f' (first {args.requests} requests)'}")
        ok = True
        config = {"hicache_ratio": args.hicache_ratio} if args.hicache_ratio else {}
        cli_trace = trace if args.requests >= 1_000_000 else _first_requests(trace, args.requests,
                                                                                 Path(tmp) / "first.jsonl")
        for mode in args.modes:
            if args.baseline:  # end to end first: `kvlab simulate --json`, this tree then the baseline
                mine, theirs = run_cli(root, cli_trace, mode, args), run_cli(args.baseline.resolve(), cli_trace, mode, args)
                same = mine["stdout"] == theirs["stdout"]
                ok &= same
                print(f"{mode:>9}: end to end (kvlab simulate --json) {mine['wall_s']:6.1f} s wall {mine['cpu_s']:6.1f} s "
                      f"CPU · baseline {theirs['wall_s']:6.1f} s wall {theirs['cpu_s']:6.1f} s CPU · before/after "
                      f"{theirs['wall_s'] / mine['wall_s']:.2f}x wall, {theirs['cpu_s'] / mine['cpu_s']:.2f}x CPU · "
                      f"JSON {'byte-identical' if same else 'DIFFERS'}", flush=True)
            fast = run_one(root, trace, mode, args, fast=True, config=config)
            line = (f"{mode:>9}: fast path {fast['wall_s']:6.1f} s wall {fast['cpu_s']:6.1f} s CPU · "
                    f"{fast['totals']['steps']:,} steps · hit rate {fast['totals']['hit_rate']:.2%}")
            if args.baseline:
                base = run_one(args.baseline.resolve(), trace, mode, args, fast=True, config=config)
                same = base["totals"] == fast["totals"] and base["rows_sha256"] == fast["rows_sha256"]
                ok &= same
                line += (f"\n{'':>11}baseline  {base['wall_s']:6.1f} s wall {base['cpu_s']:6.1f} s CPU · "
                         f"before/after (baseline / this tree's fast path) {base['wall_s'] / fast['wall_s']:.2f}x wall, "
                         f"{base['cpu_s'] / fast['cpu_s']:.2f}x CPU · totals and rows {'identical' if same else 'DIFFER'}")
            if not args.skip_reference:
                ref = run_one(root, trace, mode, args, fast=False, config=config)
                same = ref["totals"] == fast["totals"] and ref["rows_sha256"] == fast["rows_sha256"]
                ok &= same
                line += (f"\n{'':>11}reference {ref['wall_s']:6.1f} s wall {ref['cpu_s']:6.1f} s CPU · "
                         f"reference loop / fast path {ref['wall_s'] / fast['wall_s']:.2f}x wall, "
                         f"{ref['cpu_s'] / fast['cpu_s']:.2f}x CPU · totals and rows {'identical' if same else 'DIFFER'}")
            if args.split:
                split = run_one(root, trace, mode, args, fast=True, split=True, config=config)
                inside = sum(split["flows"].values())
                parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(split["flows"].items(), key=lambda kv: -kv[1]))
                line += (f"\n{'':>11}split     {inside:6.1f} s of {split['cpu_s']:.1f} s CPU "
                         f"({inside / split['cpu_s']:.0%}) inside mem_cache flows: {parts}")
            print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"benchmark: {time.perf_counter() - t0:.0f} s")
    sys.exit(code)
