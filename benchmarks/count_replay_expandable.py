"""Count how many generated "expandable segments + history that starts mid-run + near the device's limit"
snapshots the fidelity replay reproduces exactly (issue 20, item 2).

Each case is ``kvlab.device.replay.gen.generate`` on a 3 GiB device with expandable segments, about twice the
device's memory wanted live (so it runs out of memory and its segments fill their address space), one or two
streams, and the first 1,000 to 8,000 events dropped (a wrapped ring buffer). Cases whose kept trace holds an
``oom`` tell the device's size through it; the others know it only when ``--device-memory`` is given.

    python benchmarks/count_replay_expandable.py [--cases 200] [--device-memory]

Prints one line per (kept trace has an oom, exact) pair and the kinds of first divergence.
"""

from __future__ import annotations

import argparse
import inspect
from collections import Counter

from kvlab.device.caching_allocator import AllocatorConfig
from kvlab.device.replay.fidelity import replay_snapshot
from kvlab.device.replay.gen import generate
from kvlab.units import GiB

DEVICE_BYTES = 3 * GiB


def case(seed: int):
    return generate(1500, seed=seed, config=AllocatorConfig(expandable_segments=True), total_bytes=DEVICE_BYTES,
                    live_bytes=2 * DEVICE_BYTES, large_share=0.3, drop_first=1000 + seed * 37 % 7000,
                    streams=(0, 3) if seed % 2 else (0,))


def count(cases: int, device_memory: bool) -> tuple[Counter, Counter]:
    given = {"device_memory": DEVICE_BYTES} if device_memory else {}
    if given and "device_memory" not in inspect.signature(replay_snapshot).parameters:
        raise SystemExit("this kvlab's replay_snapshot has no device_memory (run without --device-memory)")
    verdicts: Counter = Counter()
    firsts: Counter = Counter()
    for seed in range(cases):
        result = replay_snapshot(case(seed).snapshot, **given)
        has_oom = any(e["action"] == "oom" for e in result.trace)
        verdicts["oom in trace" if has_oom else "no oom", "exact" if result.exact else "diverges"] += 1
        if not result.exact:
            firsts[result.first_divergence.kind] += 1
    return verdicts, firsts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--device-memory", action="store_true", help="pass the device's size (3 GiB) to the replay")
    args = parser.parse_args(argv)
    verdicts, firsts = count(args.cases, args.device_memory)
    for key in sorted(verdicts):
        print(f"{key[0]:<13} {key[1]:<9} {verdicts[key]}")
    print(f"diverging: {sum(n for k, n in verdicts.items() if k[1] == 'diverges')} of {args.cases}; first "
          f"divergences: {dict(firsts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
