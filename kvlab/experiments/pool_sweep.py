"""Hit rate against KV pool size, in both eviction modes: the curve a capacity planner wants.

Each point is one full run of the scheduler model (``kvlab.sched.simulate``, through
:func:`kvlab.sweep.run_sweep`, the code path of ``kvlab sweep``) on the same requests with a pool of ``kv_pages``
pages; nothing else changes between points or modes. The pool sizes, when not given, run
log-spaced from the smallest pool that can hold the longest request to one that could cache every
distinct prompt block of the trace, past which a bigger pool cannot raise the hit rate.

Run it from a shell::

    python -m kvlab.experiments.pool_sweep --trace data/traces/mooncake_small.jsonl [--json]
"""

from __future__ import annotations

import argparse
import json
import numbers
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlab.argtypes import positive_int as _positive_int
from kvlab.experiments.shortfall_eviction import MODES
from kvlab.paths import data_dir

DATA_DIR = data_dir()  # kvlab.paths: the checkout's data/, a wheel's copy or KVLAB_DATA_DIR
EXAMPLE_TRACE = DATA_DIR / "traces" / "mooncake_small.jsonl"  # the shipped trace (data/README.md)
DEFAULT_NUM_POINTS = 6
COLUMNS = ("mode", "kv_pages", "kv_tokens", "hit_rate", "evicted_tokens", "over_evicted_tokens",
           "prefill_tokens_computed", "retractions")


class PoolSizeError(ValueError):
    """A pool size the sweep cannot run: not a positive int, or smaller than one request."""


def request_pages(request: Any, page_size: int) -> int:
    """Pages a pool needs to run one request alone (``kvlab.sched.min_kv_tokens``: prompt plus every
    generated token, page-aligned, the padding page SGLang never hands out, and admission's room)."""
    from kvlab.sched import min_kv_tokens

    return min_kv_tokens(len(request.prompt_token_ids), request.output_len, page_size) // page_size


def min_pool_pages(requests: Sequence[Any], page_size: int) -> int:
    """The smallest pool that can run the longest request alone (the simulator refuses smaller)."""
    if not requests:
        raise ValueError("no requests to sweep")
    return max(request_pages(r, page_size) for r in requests)


def unique_prompt_pages(requests: Sequence[Any], page_size: int) -> int:
    """Pages an infinite prefix cache would hold after the whole trace.

    With Mooncake block hashes whose block size is the page size, that is the trace's distinct
    blocks (equal ids mean equal prefixes); otherwise distinct page-aligned prompt prefixes,
    counted by hashing each full page together with its prefix's hash (what SGLang's paged radix
    tree stores)."""
    if all(getattr(r, "block_hashes", None) and getattr(r, "block_size", None) == page_size for r in requests):
        return len({h for r in requests for h in r.block_hashes})
    seen: set = set()
    for r in requests:
        key = None
        tokens = r.prompt_token_ids
        for start in range(0, len(tokens) - page_size + 1, page_size):
            key = hash((key, tuple(tokens[start:start + page_size])))
            seen.add(key)
    return len(seen)


def default_pool_pages(requests: Sequence[Any], page_size: int = 512, num_points: int = DEFAULT_NUM_POINTS) -> list[int]:
    """``num_points`` log-spaced pool sizes from :func:`min_pool_pages` to the pages that cache
    every distinct prompt block (plus the longest request, which must fit alongside)."""
    if num_points < 2:
        raise ValueError(f"num_points must be >= 2, got {num_points}")
    low = min_pool_pages(requests, page_size)
    high = max(2 * low, unique_prompt_pages(requests, page_size) + low)
    ratio = (high / low) ** (1 / (num_points - 1))
    points = sorted({round(low * ratio**i) for i in range(num_points)})
    return points


def check_pool_pages(requests: Sequence[Any], pool_pages: Sequence[int], page_size: int) -> list[int]:
    """Validate every pool before running any, so a bad size fails in milliseconds, not minutes.
    Returns the sizes as sorted, distinct ints."""
    need = min_pool_pages(requests, page_size)
    longest = max(requests, key=lambda r: request_pages(r, page_size))
    out = []
    for i, pages in enumerate(pool_pages):
        # numbers.Integral so numpy's ints (np.geomspace(...).astype(int)) pass; bool is an int but not a size
        if not isinstance(pages, numbers.Integral) or isinstance(pages, bool) or pages < 1:
            raise PoolSizeError(f"pool_pages[{i}]: expected a positive int (pages), got {pages!r}")
        pages = int(pages)
        if pages < need:
            raise PoolSizeError(
                f"pool_pages[{i}] = {pages} pages ({pages * page_size} tokens) is smaller than one request: "
                f"{longest.rid!r} needs {need} pages of {page_size} tokens "
                f"(prompt {len(longest.prompt_token_ids)} + output {longest.output_len})")
        out.append(pages)
    if not out:
        raise PoolSizeError("pool_pages is empty")
    return sorted(set(out))  # the frame is sorted by size; a size asked twice runs once


@dataclass(frozen=True)
class SweepResult:
    """One row per (mode, pool size); ``frame`` is tidy (columns :data:`COLUMNS`), sorted by mode then size."""

    frame: Any  # pandas.DataFrame
    page_size: int
    policy: str
    num_requests: int

    def pivot(self, column: str = "hit_rate"):
        """``column`` with one row per pool size and one column per mode (the table to read)."""
        table = self.frame.pivot(index="kv_pages", columns="mode", values=column)
        return table[[m for m in self.frame["mode"].unique()]]  # the sweep's mode order, not alphabetical

    def to_records(self) -> list[dict]:
        return self.frame.to_dict(orient="records")


def sweep(requests: Sequence[Any], pool_pages: Sequence[int] | None = None, modes: Sequence[str] = MODES,
          page_size: int = 512, policy: str = "lru", *, progress: bool | None = None, engine: str | Any = "local",
          workers: int = 1, **config: Any) -> SweepResult:
    """Run every (mode, pool size) through the scheduler model; ``config`` goes to ``SchedulerConfig``
    (``max_running``, ``chunked_prefill_size``, ...). ``pool_pages=None``: :func:`default_pool_pages`.

    A use of :func:`kvlab.sweep.run_sweep` (the grid: modes × pools), so ``engine``/``workers`` run the points
    on more cores or a Ray cluster, and each row is what ``kvlab sweep`` writes for the same point."""
    from kvlab.sweep import Grid, run_sweep

    requests = list(requests)
    if not requests:
        raise ValueError("no requests to sweep")
    pools = default_pool_pages(requests, page_size) if pool_pages is None else check_pool_pages(
        requests, pool_pages, page_size)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must be a non-empty subset of {MODES}, got {tuple(modes)!r}")
    grid = Grid(evictions=tuple(modes), policies=(policy,), page_sizes=(page_size,),
                max_running=(config.pop("max_running", 256),), kv_pages=tuple(pools))
    run = run_sweep(requests, grid, engine=engine, workers=workers, progress=progress, extra=config)
    frame = run.frame.rename(columns={"eviction": "mode"})[list(COLUMNS)]  # grid order: by mode, then size
    return SweepResult(frame, page_size, policy, len(requests))


# ---- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from kvlab.mem_cache.evict_policy import EVICTION_POLICIES

    parser = argparse.ArgumentParser(prog="python -m kvlab.experiments.pool_sweep",
                                     description="Hit rate against KV pool size for a Mooncake-format trace.")
    parser.add_argument("--trace", required=True, type=Path, help="Mooncake-format JSONL trace")
    parser.add_argument("--pages", type=_positive_int, nargs="+", default=None,
                        help="pool sizes in pages (default: log-spaced from the largest request)")
    parser.add_argument("--points", type=_positive_int, default=DEFAULT_NUM_POINTS,
                        help="number of default pool sizes")
    parser.add_argument("--page-size", type=_positive_int, default=512)
    parser.add_argument("--policy", choices=sorted(EVICTION_POLICIES), default="lru")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    from kvlab.workloads.mooncake import TraceFormatError, load_trace

    args = build_parser().parse_args(argv)
    try:
        requests = load_trace(args.trace)
        pools = args.pages if args.pages is not None else default_pool_pages(requests, args.page_size, args.points)
        result = sweep(requests, pools, args.modes, args.page_size, args.policy)
    except (OSError, TraceFormatError, ValueError) as exc:  # OSError: missing file, a directory, no permission
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"trace": str(args.trace), "page_size": args.page_size, "policy": args.policy,
                          "num_requests": result.num_requests, "rows": result.to_records()}, indent=2))
    else:
        print(result.frame.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
