"""Write a synthetic Mooncake-format trace (kvlab.workloads.generate_trace) and print its shape.

    python benchmarks/make_mooncake_trace.py --out /tmp/mooncake_12k.jsonl             # the benchmark trace
    python benchmarks/make_mooncake_trace.py --out /tmp/mooncake_12k.jsonl --force --benchmark

Every keyword of ``generate_trace`` is an option (``--mean-input-len 8000``, ``--num-roots 50``, ...).
``--benchmark`` then measures, in this run: load_trace time (best of 3) and the memory the loaded requests hold
(tracemalloc), and the time to materialise every prompt as a flat array('q'), one request at a time.
Data files in data/traces/ are made with this script; data/README.md gives each command.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
import tracemalloc
from pathlib import Path

from kvlab.units import fmt_bytes
from kvlab.workloads import generate_trace, load_trace, read_records, trace_stats, write_trace


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="JSONL file to write")
    p.add_argument("--num-requests", type=int, default=12000)
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    p.add_argument("--benchmark", action="store_true", help="time and measure loading the written trace")
    for param in inspect.signature(generate_trace).parameters.values():
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            p.add_argument("--" + param.name.replace("_", "-"), type=type(param.default), default=param.default)
    return p


def _benchmark(path: Path) -> None:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        requests = load_trace(path)
        times.append(time.perf_counter() - t0)
        del requests
    tracemalloc.start()
    requests = load_trace(path)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t0 = time.perf_counter()
    tokens = sum(len(r.prompt_token_ids.to_array()) for r in requests)
    materialise_s = time.perf_counter() - t0
    print(f"load_trace: {min(times):.2f} s (best of 3; runs {', '.join(f'{t:.2f}' for t in times)})")
    print(f"memory held by the {len(requests)} requests: {fmt_bytes(held)} (peak while loading {fmt_bytes(peak)}); "
          f"flat int64 prompts would be {fmt_bytes(8 * tokens)}")
    print(f"materialising every prompt as array('q'), one at a time: {materialise_s:.2f} s for {tokens:,} tokens "
          f"({1e6 * materialise_s / len(requests):.0f} us a request)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    kwargs = {name: getattr(args, name) for name, param in inspect.signature(generate_trace).parameters.items()
              if param.kind is inspect.Parameter.KEYWORD_ONLY}
    records = generate_trace(args.num_requests, **kwargs)
    write_trace(args.out, records, overwrite=args.force, block_size=args.block_size)
    s = trace_stats(read_records(args.out, block_size=args.block_size), block_size=args.block_size)
    print(f"wrote {args.out}: {s.num_requests} requests over {s.duration_s:.0f} s; prompts mean "
          f"{s.mean_input_len:.0f} (max {s.max_input_len}) tokens, outputs mean {s.mean_output_len:.0f}; "
          f"{s.unique_blocks} distinct of {s.total_blocks} blocks; ideal prefix hit rate {s.ideal_hit_rate:.3f}")
    if args.benchmark:
        _benchmark(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
