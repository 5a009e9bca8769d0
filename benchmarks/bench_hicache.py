"""Benchmark: the same simulation without and with HiCache's host tier, in one run (issue 21 item 7, issue 34 item 3).

For each eviction mode it times ``simulate`` (the fast decode path) on the same requests, each run in a fresh process,
the runs alternating so a shared machine's load hits every arm alike:

- ``page``: without HiCache on the page engine (``kvlab simulate``'s default at page size > 1);
- ``page+host``: with ``--hicache-ratio`` on the page engine (its two-tier tree over page counts); target: at most
  1.5 times ``page``, and its totals identical to ``token+host``'s (the twin property);
- ``page+storage``: with the host tier and a storage tier (L3) behind it (``--storage-backend``, default file, and
  ``--prefetch-policy``) on the page engine; target: at most 1.5 times ``page`` too, and its totals identical to
  ``token+storage``'s (the same run on the token-level memory, timed for the record);
- ``token+host``: with the host tier on the token-level memory (``SchedulerKV`` + ``HiRadixCache`` over slot
  tensors: what HiCache ran on before the page engine had a host tier), for the record;
- with ``--baseline DIR`` (another checkout, e.g. ``git archive <commit> | tar -x -C DIR``): ``page`` there, whose
  totals must equal this tree's.

``--repeat N`` runs each arm N times and keeps each one's fastest (CPU seconds). The runs, the trace and the printed
figures are ``bench_fast_decode.py``'s (``run_one``, ``trace_or_preset``, ``settings_line``, ``timing``, ``ratio``).

    python benchmarks/make_mooncake_trace.py --out /tmp/conv.jsonl --preset conversation --force
    python benchmarks/bench_hicache.py --trace /tmp/conv.jsonl --kv-pages 400 --max-running 64 --repeat 3
    python benchmarks/bench_hicache.py --trace /tmp/conv.jsonl --hicache-ratio 4 --write-policy write_back

Defaults: the conversation-shaped trace (generated when no ``--trace``), 512-token pages, 2,000 device pages, 16
running, ``--hicache-ratio 4``, ``write_through``; ``--kv-pages 400 --max-running 64`` puts the pool under pressure
(device evictions, host evictions, load-backs). Timings on a shared machine are noisy: read the ratios.

History. Before the page engine had a host tier (issue 34), HiCache ran on the token-level memory and this benchmark
compared it with the token-level run without HiCache: 1.9-2.3x before issue 21's work (per-call heapifies of every
leaf, the host pool's tensor free list, re-walking a request's own prefix on insert), 1.17x / 1.23x after it, 1.24x /
1.32x (1.30x / 1.40x under pressure) after issue 22's match replay; but the page engine without HiCache had become
several times faster than either, so a HiCache run cost several times a plain ``kvlab simulate``. Now both run on the
page engine; the figures are in README.md ("Speed") and docs/semantics.md ("The page engine"). The storage arms
(issue 34) cost 2.2-2.4x the plain run at first, 1.83x / 1.93x once the store interned its keys as integers (the
SHA-256 hex only on demand), the storage tier stopped polling when nothing was due and the quiet decode rounds ran on
past backups landing (load 1-4, 2 shared cores), 1.77x / 1.80x (host tier alone 1.52x / 1.46x) once a two-tier
eviction with nothing unlocked returned at once and the walks stopped refreshing heap entries no leaf has, 1.74x /
1.73x (host tier alone 1.45x / 1.43x) once the store found most interned keys from two arrays instead of a dict (a
chain's new pages appended at once) and an unbounded store kept its order in a plain dict; then, with the two-tier
tree's hot paths trimmed (restamp without a path list, leaf rules filing inline, one call per copy issued), the step
hooks fused (the host tier opens and closes the loop's step, a step with no stall and no load is its compute, only a
request whose arrival started a prefetch is asked whether it is done) and a match replay reading the tiers' ends from
its memo: host + storage 1.67x / 1.59x, host tier alone 1.37x / 1.34x (--repeat 3, the 2 cores otherwise idle). Then,
with a step's traffic summed by map, a stale match replayed while the node it ended at stands (PageKV._current_memo:
most are an arrival's match gone stale by admission), the unbounded store's order in a recency log, a storage query
keying only interned pages and the two-tier walks, copies and nodes trimmed again: under pressure (--kv-pages 400
--max-running 64) host + storage 1.45x / 1.49x, host tier alone 1.30x / 1.36x (main before: 1.51x / 1.55x and
1.30x / 1.33x in the same session); at the default pool (2,000 pages, 16 running) host + storage 1.72x / 1.74x, host
tier alone 1.34x / 1.43x (before: 1.72x / 1.66x, 1.39x / 1.43x). The storage arm's 1.5x is met under pressure and
missed at the default pool, where the plain run is cheap (one match per request) and the storage arm pays each
request's arrival match and prefetch, and a backup per host ack (keys, channel, landing, protection): spread over
the storage model's per-request and per-node work, not one hot spot. Then (session 18) the page tree's fields
moved to ``__slots__`` (with a storage tier it had 34 attributes, past CPython 3.11's 30 in a class-shared key table,
so its own instance dict made every method call on it unspecialized), a backup's copy issued inline, the storage query keyed pages only as far as it read them, the
prefetch channel's replan bisected and the leaf rules read the children in place: under pressure host + storage
1.42x / 1.46x, host tier alone 1.27x / 1.22x (main in the same session 1.50x / 1.49x and 1.36x / 1.35x); at the
default pool host + storage 1.46x / 1.50x and 1.49x / 1.56x in two runs and 1.53x / 1.56x with --repeat 5, host tier
alone 1.28x / 1.31x, 1.19x / 1.28x and 1.28x / 1.36x (main 1.67x / 1.62x, 1.33x / 1.32x). Instructions (callgrind,
the whole trace at the default pool): the storage arm 17.86 G -> 16.81 G, the plain run 12.80 G unchanged. The
storage arm's default-pool figure is still a few per cent over the target (run-to-run noise here is about 4 %).
(These runs also skipped the step's poll when nothing was due, closed a quiet step without ``end_step`` and keyed a
backup's node without ``node_hash``: copies of those checks, since taken back; without them the storage arm runs
16.89 G instructions, 0.5 % more.) Then (session 19), with the copy controller keeping the time its next copy lands,
a step's traffic found by one sum, the run's traffic totals taken once at its end and the store's chain bound once
per tree, the storage arm executes 1.5 % fewer bytecodes (``bytecode_count.py``, which counts them: the same on
every run), 0.5 % fewer machine instructions, and no less CPU time beyond the noise; the default pool measured
1.55x / 1.50x with --repeat 5 (host tier alone 1.29x / 1.29x): the full mode at the target, the shortfall mode still
over it; under pressure 1.40x / 1.46x. In bytecodes host + storage is 1.46x the plain run, its extra
spread over the two-tier tree's walks, the backups' lock walks, the step hooks, the store's key chains and the
arrivals' match and query, none over 7 % of it; each of its bytecodes costs about 15 % more CPU than the plain run's.
Then (session 20) a correction: a step's traffic was noted only when host-tier traffic moved, so a backup landing in
storage showed in a later row and the quiet decode rounds ran on past it (its row looked unchanged), and a run's
totals could miss late landings. With each row showing the storage tokens its step moved and the quiet rounds
stopping at a landing, the storage arm runs about 11,000 more loop steps (6.6 % of its CPU): on another 2-core machine,
default pool, fastest of 3, host + storage 1.67x / 1.67x (1.58x / 1.59x before the correction there, fastest of 5),
host tier alone 1.30x / 1.29x; under pressure 1.50x / 1.46x (1.42x shortfall before the correction there), host
tier alone 1.23x / 1.23x.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_fast_decode import ratio, run_one, settings_line, timing, trace_or_preset  # noqa: E402  (no package)

TARGET = 1.5  # issue 21 item 7, issue 34 item 3: with HiCache on, at most 1.5x the same simulation without it
TOKEN_ENGINE = {"page_engine": False}  # the token-level memory (SchedulerKV + HiRadixCache), HiCache's before issue 34


def _fastest(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["cpu_s"])


def _report_storage(best: dict[str, dict]) -> bool:
    """The storage arms' lines: the page engine's host + storage run against the plain one (the target), and its
    totals against the token-level memory's."""
    page, st, token = best["page"], best["page+storage"], best["token+storage"]
    within = st["cpu_s"] / page["cpu_s"] <= TARGET
    twins = st["totals"] == token["totals"]
    t = st["totals"]
    print(f"{'':>11}page engine + host + storage {timing(st)} · hit rate {t['hit_rate']:.2%} (storage "
          f"{t['storage_hit_tokens']:,} tokens) · with / without {ratio(st, page)} (target <= {TARGET}x"
          f"{'' if within else ': MISSED'})\n"
          f"{'':>11}token-level + host + storage  {timing(token)} · its / the page engine's {ratio(token, st)} · "
          f"totals {'identical' if twins else 'DIFFER'}", flush=True)
    return within and twins


def _report(mode: str, best: dict[str, dict]) -> bool:
    """Print one mode's arms (fastest of each); True when the host tier is within the target on the page engine and
    both memories' totals with it are identical (and the baseline's equal this tree's without it)."""
    page, hi, token = best["page"], best["page+host"], best["token+host"]
    within = hi["cpu_s"] / page["cpu_s"] <= TARGET
    twins = hi["totals"] == token["totals"]
    hit = "hit rate {:.2%}".format
    lines = [f"{mode:>9}: page engine, no host tier      {timing(page)} · {hit(page['totals']['hit_rate'])}",
             f"{'':>11}page engine + host tier      {timing(hi)} · {hit(hi['totals']['hit_rate'])} · "
             f"with / without {ratio(hi, page)} (target <= {TARGET}x{'' if within else ': MISSED'})",
             f"{'':>11}token-level memory + host tier {timing(token)} · its / the page engine's {ratio(token, hi)} · "
             f"totals {'identical' if twins else 'DIFFER'}"]
    same = True
    if "base" in best:
        base = best["base"]
        shared = [k for k in base["totals"] if k in page["totals"]]
        same = all(base["totals"][k] == page["totals"][k] for k in shared)
        lines.append(f"{'':>11}baseline, no host tier      {timing(base)} · baseline / this tree {ratio(base, page)} · "
                     f"totals {'identical' if same else 'DIFFER'} on its {len(shared)} keys")
    print("\n".join(lines), flush=True)
    return within and twins and same


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
    p.add_argument("--storage-backend", default="file", choices=["file", "mooncake", "hf3fs", "nixl", "none"],
                   help="the storage tier of the page+storage arms (default file; none: no storage arms)")
    p.add_argument("--prefetch-policy", default="best_effort", choices=["best_effort", "wait_complete", "timeout"])
    p.add_argument("--baseline", type=Path, help="another kvlab checkout, timed without HiCache")
    p.add_argument("--repeat", type=int, default=1, help="runs per arm; each arm's fastest counts (default 1)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be >= 1, got {args.repeat}")

    root = HERE.parent
    host = {"hicache_ratio": args.hicache_ratio, "hicache_write_policy": args.write_policy}
    storage = {**host, "hicache_storage_backend": args.storage_backend,
               "hicache_storage_prefetch_policy": args.prefetch_policy}
    ok = True
    with trace_or_preset(args.trace) as trace:
        print(settings_line(args, f"; host tier --hicache-ratio {args.hicache_ratio:g} --hicache-write-policy "
                                  f"{args.write_policy}; storage {args.storage_backend} {args.prefetch_policy}; "
                                  f"fastest of {args.repeat}"))
        for mode in args.modes:
            arms: dict[str, list[dict]] = {"page": [], "page+host": [], "token+host": [], "base": [],
                                           "page+storage": [], "token+storage": []}
            for _ in range(args.repeat):  # alternate, so the machine's load hits every arm alike
                arms["page"].append(run_one(root, trace, mode, args, fast=True))
                arms["page+host"].append(run_one(root, trace, mode, args, fast=True, config=host))
                arms["token+host"].append(run_one(root, trace, mode, args, fast=True, config={**host, **TOKEN_ENGINE}))
                if args.baseline:
                    arms["base"].append(run_one(args.baseline.resolve(), trace, mode, args, fast=True))
                if args.storage_backend != "none":
                    arms["page+storage"].append(run_one(root, trace, mode, args, fast=True, config=storage))
                    arms["token+storage"].append(run_one(root, trace, mode, args, fast=True,
                                                         config={**storage, **TOKEN_ENGINE}))
            best = {k: _fastest(v) for k, v in arms.items() if v}
            ok &= _report(mode, best)
            if args.storage_backend != "none":
                ok &= _report_storage(best)
    return 0 if ok else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"benchmark: {time.perf_counter() - t0:.0f} s")
    sys.exit(code)
