"""``kvlab sweep``: the command line over :func:`kvlab.sweep.run_sweep` (kvlab/cli/__init__.py adds the subcommand here).

    kvlab sweep (--trace FILE | --workload NAME) [--seed N] [--workload-param KEY=VALUE ...]
                [--kv-pages LIST | --kv-tokens LIST] [--eviction shortfall,full] [--policy LIST]
                [--page-size LIST] [--max-running LIST] [--hicache-ratio LIST] [--hicache-write-policy LIST]
                [--hicache-storage-backend LIST] [--hicache-storage-prefetch-policy LIST]
                [--engine local|ray] [--workers N] [--ray-address ADDRESS] [--out FILE.csv|FILE.parquet] [--json]

Every LIST is comma-separated; one value is a one-point axis.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys

from kvlab.argtypes import positive_int
from kvlab.safe_text import printable
from kvlab.stop_signals import Stopped, stop_on_signals
from kvlab.sweep.engine import ENGINES
from kvlab.sweep.grid import Grid, parse_list

SHOWN = ("eviction", "policy", "page_size", "max_running", "kv_pages", "hicache_ratio", "hicache_write_policy",
         "hit_rate", "evicted_tokens", "over_evicted_tokens", "prefill_tokens_computed", "retractions", "host_hit_tokens")
STORAGE_SHOWN = ("hicache_storage_backend", "hicache_storage_prefetch_policy", "storage_hit_tokens")


def add_parser(commands) -> argparse.ArgumentParser:
    from kvlab.workloads.generators import WORKLOADS

    sweep = commands.add_parser(
        "sweep", help="run kvlab simulate over a grid of settings, on local cores or a Ray cluster",
        description="Run `kvlab simulate` at every point of a grid (comma lists; one value is a one-point axis). "
                    "Rows go to --out as points finish; running the same command again skips the points already "
                    "there, so an interrupted sweep resumes.")
    source = sweep.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Mooncake-format JSONL trace (timestamp, input_length, output_length, hash_ids)")
    source.add_argument("--workload", choices=sorted(WORKLOADS), help="seeded synthetic workload")
    sweep.add_argument("--seed", type=int, default=0, help="workload seed (default: %(default)s)")
    sweep.add_argument("--workload-param", action="append", default=[], metavar="KEY=VALUE",
                       help="override a workload parameter, e.g. num_groups=16 (repeatable)")
    sweep.add_argument("--workload-axis", action="append", default=[], metavar="KEY=LIST",
                       help="a workload parameter as an axis, e.g. num_clients=10,20 (repeatable; each value "
                            "combination is its own requests, named in the rows' source)")
    pool = sweep.add_mutually_exclusive_group()
    pool.add_argument("--kv-pages", metavar="LIST", help="KV pool sizes in pages, e.g. 80,160,320")
    pool.add_argument("--kv-tokens", metavar="LIST", help="KV pool sizes in tokens (whole pages)")
    sweep.add_argument("--eviction", metavar="LIST", default="shortfall,full",
                       help="eviction modes: shortfall (the fix), full (the bug) (default: %(default)s)")
    sweep.add_argument("--policy", metavar="LIST", default="lru", help="radix-cache eviction policies (default: lru)")
    sweep.add_argument("--page-size", metavar="LIST", default=None,
                       help="KV page sizes in tokens (default: 1; 512 for --trace, one page per hash block)")
    sweep.add_argument("--max-running", metavar="LIST", default="256", help="max running requests (default: 256)")
    sweep.add_argument("--hicache-ratio", metavar="LIST", default="0",
                       help="HiCache host pool sizes as ratios of the device pool; 0: no host tier (default: 0)")
    sweep.add_argument("--hicache-write-policy", metavar="LIST", default="write_through",
                       help="HiCache write policies: write_through, write_through_selective, write_back "
                            "(default: %(default)s)")
    sweep.add_argument("--hicache-storage-backend", metavar="LIST", default="none",
                       help="HiCache storage tiers (L3) behind a host tier: none, file, mooncake, hf3fs, nixl "
                            "(default: %(default)s)")
    sweep.add_argument("--hicache-storage-prefetch-policy", metavar="LIST", default="best_effort",
                       help="prefetch policies with a storage tier: best_effort, wait_complete, timeout "
                            "(default: %(default)s)")
    sweep.add_argument("--engine", choices=ENGINES, default="local",
                       help="local: a process pool on this machine; ray: a Ray cluster, needs kvlab[ray] "
                            "(default: %(default)s)")
    sweep.add_argument("--workers", type=positive_int, default=None,
                       help="local processes, or the CPUs of a Ray cluster started here (default: all cores)")
    sweep.add_argument("--ray-address", default=None, metavar="ADDRESS",
                       help="join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting one")
    sweep.add_argument("--out", default=None, metavar="FILE",
                       help="write rows to FILE (.csv or .parquet) as they finish; rerun to resume")
    sweep.add_argument("--json", action="store_true", help="print the rows as JSON")
    return sweep


def grid_from_args(args: argparse.Namespace) -> Grid:
    page_sizes = (parse_list(args.page_size, "--page-size", int) if args.page_size is not None
                  else (512 if args.trace else 1,))
    return Grid(evictions=parse_list(args.eviction, "--eviction"), policies=parse_list(args.policy, "--policy"),
                page_sizes=page_sizes, max_running=parse_list(args.max_running, "--max-running", int),
                kv_pages=parse_list(args.kv_pages, "--kv-pages", int) if args.kv_pages is not None else None,
                kv_tokens=parse_list(args.kv_tokens, "--kv-tokens", int) if args.kv_tokens is not None else None,
                hicache_ratios=parse_list(args.hicache_ratio, "--hicache-ratio", float),
                hicache_write_policies=parse_list(args.hicache_write_policy, "--hicache-write-policy"),
                hicache_storage_backends=parse_list(args.hicache_storage_backend, "--hicache-storage-backend"),
                hicache_storage_prefetch_policies=parse_list(args.hicache_storage_prefetch_policy,
                                                             "--hicache-storage-prefetch-policy")).checked()


def _rows_in(out: str) -> int:
    """How many rows the sweep file ``out`` holds now (0 when there is none, or it cannot be read)."""
    from kvlab.sweep.grid import SweepError
    from kvlab.sweep.store import open_row_file

    try:
        return len(open_row_file(out).rows) if os.path.isfile(out) else 0
    except (SweepError, OSError):
        return 0


def _stopped_message(stop: KeyboardInterrupt, computed: int, out: str | None, rows_before: int) -> str:
    """The line a stopped sweep ends with: what stopped it, the rows written and where, and how to go on."""
    stopped = isinstance(stop, Stopped) and stop.signum != signal.SIGINT
    what = f"stopped by {stop.name}" if stopped else "interrupted"
    if out is None:
        return f"kvlab: sweep {what} after {computed} points (no --out: no row was kept)"
    rows = _rows_in(out)
    command = " ".join(shlex.quote(printable(word)) for word in sys.argv[1:]) if sys.argv[1:2] == ["sweep"] else ""
    again = f": kvlab {command}" if command else ""
    return (f"kvlab: sweep {what}: {rows - rows_before} new rows written to {printable(out)} ({rows} in all); "
            f"to resume, run the same command again{again}")


def _print_table(rows: list[dict], with_source: bool = False) -> None:
    shown = ("source", *SHOWN) if with_source else SHOWN
    if any(r["hicache_storage_backend"] != "none" for r in rows):  # (a storage axis: its settings and hits)
        shown += STORAGE_SHOWN
    widths = {c: max(len(c), *(len(_shown(c, r[c])) for r in rows)) for c in shown}
    print("  ".join(f"{c:>{widths[c]}}" for c in shown))
    for row in rows:
        print("  ".join(f"{_shown(c, row[c]):>{widths[c]}}" for c in shown))


def workload_combinations(overrides: dict, axes: list[str], *, trace: str | None) -> list[dict]:
    """``--workload-param`` values with every combination of the ``--workload-axis KEY=LIST`` values (each item
    read as ``--workload-param`` reads a value), axes in the order given; one combination without axes."""
    import itertools

    from kvlab.sweep.grid import SweepError
    from kvlab.sweep.point import parse_workload_params

    if axes and trace:
        raise SweepError("--workload-axis applies to --workload, not to --trace")
    names, values = [], []
    for item in axes:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SweepError(f"--workload-axis {item[:60]!r}: expected KEY=LIST, e.g. num_clients=10,20")
        if key in overrides or key in names:
            raise SweepError(f"--workload-axis {key}: given twice (as an axis and a --workload-param, or two axes)")
        items = parse_list(text, f"--workload-axis {key}")
        names.append(key)
        values.append([parse_workload_params([f"{key}={v}"])[key] for v in items])
    return [{**overrides, **dict(zip(names, combo))} for combo in itertools.product(*values)]


def _shown(column: str, value) -> str:
    if column == "hit_rate":
        return f"{value:.2%}"
    if isinstance(value, float):
        return f"{value:g}"
    return f"{value:,}" if isinstance(value, int) else printable(value)


def check_out(path: str) -> None:
    """Refuse an ``--out`` that cannot be written before any worker starts (or any request is loaded),
    naming the flag, the path and why: a symbolic or hard link, a folder or a device where a file goes, a missing
    or read-only folder. The folder must take new files too: the finished sweep is written beside the file and renamed
    over it."""
    import errno
    import stat
    import tempfile
    from pathlib import Path

    from kvlab.sweep.grid import SweepError
    from kvlab.sweep.store import CSV_SUFFIXES, PARQUET_SUFFIXES, refuse_links

    if not path:
        raise SweepError("--out '': an empty path; give a .csv or .parquet file")
    refuse_links(path)  # a symbolic or hard link: the sweep would replace it with a file of its own
    target = Path(path)
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: a file on the way, found below
        mode = None
    except OSError as exc:
        raise SweepError(f"--out {path}: cannot be used ({exc.strerror or exc})") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise SweepError(f"--out {path}: is a folder; give a .csv or .parquet file")
    if mode is not None and not stat.S_ISREG(mode):
        raise SweepError(f"--out {path}: is not a regular file (a device, FIFO or socket); give a .csv or "
                         f".parquet file")
    if target.suffix.lower() not in CSV_SUFFIXES + PARQUET_SUFFIXES:
        raise SweepError(f"--out {path}: unknown format {target.suffix or '(no extension)'!r}; "
                         f"use a .csv or .parquet file")
    folder = target.parent if str(target.parent) else Path(".")
    missing = []  # the folders kvlab would create, innermost first
    while not folder.exists() and folder != folder.parent:
        missing.append(folder.name)
        folder = folder.parent
    if not folder.is_dir():
        raise SweepError(f"--out {path}: {folder} is not a folder, so the file cannot be created under it")
    _check_names(path, folder, [*reversed(missing), target.name])
    try:  # the real test (permissions, read-only mounts, root): create a file there, then remove it
        fd, probe = tempfile.mkstemp(prefix=".kvlab-out-check-", dir=folder)
    except OSError as exc:
        reason = "permission denied" if exc.errno in (errno.EACCES, errno.EPERM) else (exc.strerror or str(exc))
        raise SweepError(f"--out {path}: cannot create a file in the folder {folder} ({reason}); choose "
                         f"another place") from None
    os.close(fd)
    os.unlink(probe)
    if mode is not None:
        try:
            with open(target, "rb+"):
                pass
        except OSError as exc:
            raise SweepError(f"--out {path}: cannot be read and written ({exc.strerror or exc})") from None


def _check_names(path: str, folder, names: list[str]) -> None:
    """Refuse a name under ``folder`` (a missing folder kvlab would create, then the file) longer than the file
    system takes, before anything is created: found when ``mkdir`` ran, it left the folders made so far."""
    from kvlab.sweep.grid import SweepError

    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return
    too_long = next((name for name in names if len(os.fsencode(name)) > longest), None)
    if too_long is not None:
        shown = too_long if len(too_long) <= 40 else too_long[:37] + "..."
        raise SweepError(f"--out {path}: the name {printable(shown)!r} is {len(os.fsencode(too_long))} bytes, longer "
                         f"than the {longest} the file system under {folder} takes; choose a shorter path")


def main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from kvlab.sweep.point import closed_loop_options, load_requests, parse_workload_params, source_label
    from kvlab.sweep.run import run_sweep

    new_rows, rows_before = [], 0
    try:
        overrides = parse_workload_params(args.workload_param)
        if overrides and args.trace:
            raise ValueError("--workload-param applies to --workload, not to --trace")
        grid = grid_from_args(args)  # a bad list fails before the requests are even loaded
        if args.out is not None:
            check_out(args.out)  # and an --out that cannot be written, before any worker starts
            rows_before = _rows_in(args.out)
        combos = workload_combinations(overrides, args.workload_axis, trace=args.trace)
        # SIGTERM and SIGHUP (a closed terminal) stop the sweep as Ctrl-C does: rows kept, workers stopped, a line on
        # what was written. (SIGKILL cannot be caught: the pool's workers then die with it, kvlab.procs.die_with_parent,
        # and so does a Ray cluster started here, kvlab.procs.reaped.)
        runs = []
        with stop_on_signals():
            # last setting first: each run writes its rows before the file's other rows, so the file ends in order
            for combo in reversed(combos):
                requests = load_requests(workload=args.workload, trace=args.trace, seed=args.seed, overrides=combo)
                source = source_label(workload=args.workload, trace=args.trace, overrides=combo)
                runs.append(run_sweep(requests, grid, source=source, seed=args.seed, engine=args.engine,
                                      workers=args.workers, ray_address=args.ray_address, out=args.out,
                                      extra=closed_loop_options(requests, args.seed),
                                      on_row=lambda row, done: new_rows.append(row)))
        runs.reverse()
        run = runs[0] if len(runs) == 1 else replace(runs[-1], rows=tuple(r for one in runs for r in one.rows),
                                                      computed=sum(one.computed for one in runs),
                                                      skipped=sum(one.skipped for one in runs),
                                                      seconds=sum(one.seconds for one in runs))
    except KeyboardInterrupt as stop:
        print(_stopped_message(stop, len(new_rows), args.out, rows_before), file=sys.stderr)
        return stop.exit_status if isinstance(stop, Stopped) else 130
    if args.json:
        print(json.dumps(list(run.rows), indent=2))
        print(run.cost(), file=sys.stderr)
        return 0
    if len(runs) > 1:
        print(f"sweep · {printable(args.workload)} · {len(runs)} workload settings (--workload-axis; each row's "
              f"source names its own) · seed {args.seed}")
    else:
        print(f"sweep · {printable(source)} · seed {args.seed} · {len(requests):,} requests")
    _print_table(list(run.rows), with_source=len(runs) > 1)
    print(printable(run.cost() + (f"; rows in {args.out}" if args.out else "")))
    return 0
