"""Benchmark: ``kvlab replay`` on generated snapshots of 100k and 1M trace events.

Each snapshot comes from ``kvlab.device.replay.gen.generate`` (two streams, 10% of frees deferred on events,
an ``empty_cache`` every 20,000 steps, mixed small, 1-10 MiB and large tensors; generation is not timed) and
is written as a ``_dump_snapshot`` pickle. Timed, per size: reading the file (``read_snapshot``: restricted
unpickler, schema and key checks), the fidelity replay (``replay_snapshot``: seed, every event through the
model, the checks), and the what-ifs ``kvlab replay`` runs by default (the recorded settings and
``expandable_segments=True``). The targets (issue 14) are for the replay: 2 s for 100k events, 15 s for 1M.

    python benchmarks/bench_replay.py [--sizes 100000,1000000] [--seed 0] [--repeat 1]
"""

from __future__ import annotations

import argparse
import functools
import gc
import pickle
import tempfile
import time
from pathlib import Path

from kvlab.device.replay.fidelity import replay_snapshot
from kvlab.device.replay.gen import generate
from kvlab.device.replay.settings import parse_what_if
from kvlab.device.replay.whatif import run_what_if
from kvlab.device.snapshot import read_snapshot
from kvlab.units import GiB

TARGETS_S = {100_000: 2.0, 1_000_000: 15.0}


def _both_what_ifs(result, expandable):
    return [run_what_if(result.ops, result.settings, label="recorded"),
            run_what_if(result.ops, expandable, label="exp")]


def _timed(fn):
    """(value, wall s, CPU s): on a shared machine the CPU time says what the code costs, the wall time
    what a user waits."""
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - t, time.process_time() - c


def bench(n_events: int, seed: int, tmp: Path, repeat: int) -> dict:
    made, gen_s, _ = _timed(lambda: generate(n_events, seed=seed, streams=(0, 1), deferred_fraction=0.1,
                                          empty_cache_every=20_000))
    path = tmp / f"bench_{n_events}.pickle"
    path.write_bytes(pickle.dumps(made.snapshot, protocol=4))
    del made
    best: dict = {}
    for _ in range(repeat):
        snap, read_s, read_cpu = _timed(functools.partial(read_snapshot, path))
        result, replay_s, replay_cpu = _timed(functools.partial(replay_snapshot, snap))
        expandable = parse_what_if("expandable_segments=True", result.settings)
        what_ifs, what_if_s, what_if_cpu = _timed(functools.partial(_both_what_ifs, result, expandable))
        run = {"read_s": read_s, "replay_s": replay_s, "what_if_s": what_if_s, "read_cpu": read_cpu,
               "replay_cpu": replay_cpu, "what_if_cpu": what_if_cpu}
        best = {k: min(v, best.get(k, v)) for k, v in run.items()}
    counts = result.event_counts
    return {"events": result.events_replayed, "exact": result.exact, "gen_s": gen_s,
            "file_mb": path.stat().st_size / 1e6,
            "allocs": counts["alloc"], "segment_events": sum(counts[a] for a in counts if a.startswith("segment")),
            "peak_reserved": result.recorded_peak_reserved_bytes, "expandable_peak": what_ifs[1].peak_reserved_bytes,
            **best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000", help="trace lengths, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="time each step this many times, keep the best")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            r = bench(n, args.seed, Path(tmp), args.repeat)
            target = TARGETS_S.get(n)
            ratio = f" → {r['replay_s'] / target:.2f}× the {target:.0f} s target" if target else ""
            print(f"{r['events']:>9,} events ({r['allocs']:,} allocs, {r['segment_events']:,} segment events, "
                  f"{r['file_mb']:.0f} MB pickle, generated in {r['gen_s']:.1f} s): exact={r['exact']}")
            print(f"    replay   {r['replay_s']:6.2f} s wall ({r['replay_s'] / r['events'] * 1e6:.1f} µs/event), "
                  f"{r['replay_cpu']:6.2f} s CPU{ratio}")
            print(f"    read     {r['read_s']:6.2f} s wall, {r['read_cpu']:6.2f} s CPU")
            print(f"    what-ifs {r['what_if_s']:6.2f} s wall, {r['what_if_cpu']:6.2f} s CPU (recorded settings and "
                  f"expandable_segments=True: peak reserved {r['peak_reserved'] / GiB:.2f} → "
                  f"{r['expandable_peak'] / GiB:.2f} GiB)")
            total = r["read_s"] + r["replay_s"] + r["what_if_s"]
            print(f"    all of `kvlab replay` {total:6.2f} s wall, "
                  f"{r['read_cpu'] + r['replay_cpu'] + r['what_if_cpu']:6.2f} s CPU")


if __name__ == "__main__":
    main()
