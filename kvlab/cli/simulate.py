"""``kvlab simulate``: finding 2 on a workload or a Mooncake-format trace, one eviction mode or both, with or
without HiCache's host tier."""

from __future__ import annotations

import json

import kvlab.cli.flags as flags
from kvlab.argtypes import int_at_least as _int_at_least
from kvlab.argtypes import positive_int as _positive_int
from kvlab.cli.output import print_compare
from kvlab.cli.rounds import print_rounds, print_table_comparison, rounds_of, totals_with_rounds
from kvlab.errors import KvlabError
from kvlab.safe_text import printable

#: ``kvlab simulate``'s choices, spelled out so that its parser (``kvlab simulate --help``, a mistyped flag) imports
#: no torch: the registries they name live beside it. tests/test_startup.py checks each equals its registry.
SIMULATE_EVICTION_MODES = ("shortfall", "full")  # kvlab.mem_cache.options.EVICTION_MODES
SIMULATE_POLICIES = ("fifo", "filo", "lfu", "lru", "mru", "priority", "slru")  # sorted(evict_policy.EVICTION_POLICIES)
SIMULATE_WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")  # options.WRITE_POLICIES
SIMULATE_STORAGE_BACKENDS = ("file", "mooncake", "hf3fs", "nixl")  # hicache.storage.STORAGE_BACKENDS
SIMULATE_PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")  # hicache.storage.PREFETCH_POLICIES


def add_parser(commands, command: str | None) -> None:
    """``kvlab simulate``'s options."""
    from kvlab.workloads.generators import WORKLOADS

    sim = commands.add_parser(
        "simulate", help="finding 2: run a workload through the scheduler with shortfall or full eviction",
        description="Simulate SGLang's scheduler and radix cache on a workload or a Mooncake-format trace.")
    source = sim.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Mooncake-format JSONL trace (timestamp, input_length, output_length, hash_ids)")
    source.add_argument("--workload", choices=list(WORKLOADS),
                        help="seeded synthetic workload")
    source.add_argument("--compare-table", metavar="FILE[#ID]",
                        help="a published per-round table of SGLang's bench_multiturn.py (JSONL, the schema of "
                             "hicache_tables_examples.jsonl): run its settings and print measured vs simulated")
    sim.add_argument("--seed", type=int, default=0, help="workload seed (default: %(default)s)")
    sim.add_argument("--workload-param", action="append", default=[], metavar="KEY=VALUE",
                     help="override a workload parameter, e.g. num_groups=16 (repeatable)")
    sim.add_argument("--eviction", choices=list(SIMULATE_EVICTION_MODES), default=None,
                     help="evict the shortfall (the fix, default) or the full request (the bug)")
    sim.add_argument("--compare", action="store_true",
                     help="run both eviction modes on the same requests and print them side by side")
    sim.add_argument("--page-size", type=_positive_int, default=None,
                     help="KV page size in tokens (default: 1; 512 for --trace, one page per hash block)")
    pool_size = sim.add_mutually_exclusive_group()
    # 2^40 tokens on the page engine (page size > 1: counts, not tables); 2^26 at page size 1 (check_pool)
    pool_size.add_argument("--kv-tokens", type=_int_at_least(1, flags.MAX_PAGE_POOL), help="KV pool size in tokens")
    pool_size.add_argument("--kv-pages", type=_int_at_least(1, flags.MAX_PAGE_POOL), help="KV pool size in pages")
    sim.add_argument("--max-running", type=_int_at_least(1, flags.MAX_POOL), default=256, help="max running requests (default: %(default)s)")
    sim.add_argument("--policy", choices=flags.registered_or(SIMULATE_POLICIES, "kvlab.mem_cache.evict_policy",
                                                         "EVICTION_POLICIES"), default="lru",
                     help="radix-cache eviction policy (default: %(default)s)")
    host = sim.add_mutually_exclusive_group()
    host.add_argument("--hicache-ratio", type=flags.hicache_number("--hicache-ratio"), default=None, metavar="R",
                      help="HiCache: add a host KV pool of R times the device pool (SGLang's --hicache-ratio)")
    host.add_argument("--hicache-size", type=flags.hicache_number("--hicache-size"), default=None, metavar="GIB",
                      help="HiCache: add a host KV pool of GIB GiB (SGLang's --hicache-size, which reads decimal GB)")
    sim.add_argument("--hicache-write-policy", choices=list(SIMULATE_WRITE_POLICIES), default=None,
                     help="HiCache write policy, with --hicache-ratio or --hicache-size (default: write_through)")
    _add_storage_flags(sim)
    sim.add_argument("--json", action="store_true", help="print the totals as JSON")


def _add_storage_flags(sim) -> None:
    """HiCache's storage tier (L3): SGLang's --hicache-storage-backend and --hicache-storage-prefetch-policy, the
    store's capacity, and the prefetch knobs SGLang reads from --hicache-storage-backend-extra-config."""
    l3 = sim.add_argument_group("HiCache storage tier (L3), with --hicache-ratio or --hicache-size")
    l3.add_argument("--hicache-storage-backend", choices=list(SIMULATE_STORAGE_BACKENDS), default=None,
                    help="add a storage tier: a backend preset of capacity, bandwidth and latency (assumed figures; "
                         "docs/semantics.md)")
    l3.add_argument("--hicache-storage-size", type=_nonneg_number("--hicache-storage-size"), default=None,
                    metavar="GB", help="storage capacity in decimal GB per rank, 0 for unbounded (default: the "
                                       "preset's; file and nixl: unbounded)")
    l3.add_argument("--hicache-storage-prefetch-policy", choices=list(SIMULATE_PREFETCH_POLICIES), default=None,
                    help="when a request stops waiting for its prefetch (default: best_effort)")
    for flag, default, unit in (("--prefetch-threshold", 256, "tokens"), ("--prefetch-timeout-base", 2.0, "s"),
                                ("--prefetch-timeout-per-ki-token", 0.1, "s per 1024 tokens"),
                                ("--prefetch-timeout-max", 30.0, "s")):
        l3.add_argument(flag, type=_nonneg_number(flag), default=None, metavar=unit.split()[0].upper(),
                        help=f"SGLang's {flag[2:].replace('-', '_')} ({unit}; default: {default:g})")


def run(args) -> int:
    from kvlab.experiments import shortfall_eviction
    from kvlab.mem_cache.options import PoolTooLargeError
    from kvlab.sched.config import check_pool, request_extent
    from kvlab.sched.scheduler import StepLimitError
    from kvlab.sweep.point import (
        closed_loop_options,
        default_page_size,
        load_requests,
        parse_workload_params,
        pool_tokens,
        scheduler_config,
    )

    if args.compare_table:
        return _compare_table(args)
    page_size = args.page_size or default_page_size(trace=args.trace)
    overrides = parse_workload_params(args.workload_param)
    if overrides and args.trace:
        raise ValueError("--workload-param applies to --workload, not to --trace")
    requests = load_requests(workload=args.workload, trace=args.trace, seed=args.seed, overrides=overrides)
    kv_tokens = pool_tokens(requests, page_size, kv_tokens=args.kv_tokens, kv_pages=args.kv_pages)
    check_pool(request_extent(requests), page_size=page_size, kv_tokens=kv_tokens, **_pool_flags(args, page_size))
    options = dict(page_size=page_size, kv_tokens=kv_tokens, max_running=args.max_running, policy=args.policy,
                   **_hicache_options(args), **closed_loop_options(requests, args.seed))
    if args.compare and args.eviction is not None:
        raise ValueError(f"--compare runs both eviction modes: drop --eviction {args.eviction}")
    if _hicache_options(args):  # the host pool it makes, checked (as each sweep point's) before anything runs
        try:
            scheduler_config(**options)
        except ValueError as exc:
            given = (f"--hicache-ratio {args.hicache_ratio:g}" if args.hicache_ratio is not None
                     else f"--hicache-size {args.hicache_size:g}")
            raise ValueError(f"{given} with a device pool of {kv_tokens:,} tokens: {exc}") from None
    try:
        if args.compare:
            arms = shortfall_eviction.compare_totals(requests, processes=1, **options)
        else:
            result = shortfall_eviction.run(requests, eviction=args.eviction or "shortfall", **options)
    except PoolTooLargeError as exc:  # the table's columns are the longest request's tokens: name it (issue 26)
        raise KvlabError(f"{_longest_request(args, requests)} is too long to simulate on this machine: {exc}") from None
    except StepLimitError as exc:  # outputs of millions of tokens: name the longest request too
        raise KvlabError(f"{_longest_request(args, requests).rstrip(',')}: {exc}; every output token is a decode "
                         "step") from None
    source = printable(args.trace) if args.trace else f"{args.workload} (seed {args.seed})"
    if args.compare:
        _print_arms(arms, source, page_size, as_json=args.json)
    elif args.json:
        print(json.dumps(totals_with_rounds(result), indent=2))
    else:
        _print_run(result, source, page_size)
        print_rounds(rounds_of(result))
    return 0


def _compare_table(args) -> int:
    """``--compare-table FILE[#ID]``: the table's own settings (the pool, page and host flags come from it); only
    the eviction mode and policy may be chosen (finding 2 on a published table)."""
    from kvlab.experiments.published_tables import compare

    given = [flag for flag, value in (("--workload-param", args.workload_param), ("--kv-tokens", args.kv_tokens),
                                      ("--kv-pages", args.kv_pages), ("--page-size", args.page_size),
                                      ("--hicache-ratio", args.hicache_ratio), ("--hicache-size", args.hicache_size),
                                      ("--hicache-write-policy", args.hicache_write_policy),
                                      ("--compare", args.compare)) if value]
    if given:
        raise ValueError(f"--compare-table runs the table's own settings: drop {', '.join(given)}")
    comparison = compare(args.compare_table, eviction=args.eviction or "shortfall", policy=args.policy)
    if args.json:
        print(json.dumps(comparison.as_dict(), indent=2))
    else:
        print_table_comparison(comparison)
    return 0


def _print_arms(arms: dict, source: str, page_size: int, *, as_json: bool) -> None:
    """``--compare``: the bug's totals, the fix's and fix − bug."""
    for totals in arms.values():  # wall-clock figures differ run to run: keep the JSON reproducible
        totals.pop("wall_s", None)
        totals.pop("cpu_s", None)
    shortfall, full = arms["shortfall"], arms["full"]
    title = (f"simulate --compare · {source} · page size {page_size} · KV pool {shortfall['kv_tokens']:,} tokens"
             f" · policy {shortfall['policy']}")
    print_compare(title, ("full", "the bug", full), ("shortfall", "the fix", shortfall),
                  skip=("eviction", "page_size", "kv_tokens", "policy"), as_json=as_json, percent=("hit_rate",))


def _print_run(result, source: str, page_size: int) -> None:
    """One run's totals, a line each."""
    totals = result.totals()
    print(f"simulate · {source} · eviction {totals['eviction']} · page size {page_size} · "
          f"KV pool {totals['kv_tokens']:,} tokens · policy {totals['policy']}")
    if result.config.hicache:
        print(f"host tier (HiCache) · {_host_tier_line(result.config)}")
    if result.config.hicache_storage:
        print(f"storage tier (L3) · {_storage_tier_line(result.config)}")
    width = max(map(len, totals))
    for key, value in totals.items():
        if key in ("eviction", "page_size", "kv_tokens", "policy"):
            continue
        shown = f"{value:.2%}" if key == "hit_rate" else (f"{value:,}" if isinstance(value, int) else f"{value:,.2f}")
        print(f"  {key:<{width}}  {shown:>14}")


def _pool_flags(args, page_size: int) -> dict:
    """How ``kvlab simulate``'s page size and pool were given, for :func:`kvlab.sched.config.check_pool`'s messages:
    the flag and value the user typed, or the default that stood in for it."""
    page = (f"--page-size {args.page_size}" if args.page_size
            else f"the default page size {page_size}{' (of --trace)' if args.trace else ''}")
    if args.kv_pages is not None:
        pool = f"--kv-pages {args.kv_pages}"
    elif args.kv_tokens is not None:
        pool = f"--kv-tokens {args.kv_tokens}"
    else:
        pool = "the default pool (no --kv-tokens or --kv-pages: 4 × (the longest request + one page), at least 32,768)"
    return {"page_flag": page, "pool_flag": pool}


def _longest_request(args, requests) -> str:
    """The request that sets the simulator's request-to-token table width, named by where it came from: ``--trace
    FILE:LINE`` (its line in the file) or the workload, then its id and lengths."""
    longest = max(requests, key=lambda r: len(r.prompt_token_ids) + max(1, r.output_len))
    lengths = f"prompt {len(longest.prompt_token_ids):,} + output_length {longest.output_len:,} tokens"
    if not args.trace:
        return f"--workload {args.workload}: request {printable(longest.rid)} ({lengths})"
    line = _record_line(args.trace, longest.rid)
    where = f"--trace {printable(args.trace)}" + (f":{line}" if line else "")
    return f"{where}: request {printable(longest.rid)}, the trace's longest ({lengths}),"


def _record_line(path: str, rid: str) -> int | None:
    """The file line of the trace record ``rid`` names (``<stem>-<index of the record>``, blank lines skipped), or
    None when the id is not of that form."""
    from pathlib import Path

    stem, _, index = rid.rpartition("-")
    if stem != Path(path).stem or not index.isdigit():
        return None
    left = int(index)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if raw.strip():
                if not left:
                    return lineno
                left -= 1
    return None


def _hicache_options(args) -> dict:
    """The ``SchedulerConfig`` fields of ``--hicache-ratio`` / ``--hicache-size`` / ``--hicache-write-policy``."""
    if args.hicache_ratio is None and args.hicache_size is None:
        if args.hicache_storage_backend is not None:  # SGLang's storage sits behind its host tier
            raise ValueError(f"--hicache-storage-backend {args.hicache_storage_backend} needs a host tier: give "
                             "--hicache-ratio R or --hicache-size GIB")
        if args.hicache_write_policy is not None:
            raise ValueError(f"--hicache-write-policy {args.hicache_write_policy} needs a host tier: give "
                             "--hicache-ratio R or --hicache-size GIB")
        return _storage_options(args)  # (a storage knob without a backend is refused there)
    options = {"hicache_write_policy": args.hicache_write_policy or "write_through"}
    if args.hicache_ratio is not None:
        options["hicache_ratio"] = args.hicache_ratio
    else:
        options["hicache_size_gib"] = args.hicache_size
    return options | _storage_options(args)


def _nonneg_number(flag: str):
    """An argparse type: a finite number >= 0, refused naming ``flag`` (exit 2)."""
    import argparse
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number >= 0, got {text}")
        return value

    return parse


_STORAGE_FLAGS = {  # --flag -> the SchedulerConfig field it sets
    "hicache_storage_size": "hicache_storage_size_gb", "hicache_storage_prefetch_policy":
    "hicache_storage_prefetch_policy", "prefetch_threshold": "prefetch_threshold", "prefetch_timeout_base":
    "prefetch_timeout_base", "prefetch_timeout_per_ki_token": "prefetch_timeout_per_ki_token",
    "prefetch_timeout_max": "prefetch_timeout_max"}


def _storage_options(args) -> dict:
    """The ``SchedulerConfig`` fields of the storage-tier flags; a knob without a backend is refused."""
    given = {field: getattr(args, name) for name, field in _STORAGE_FLAGS.items() if getattr(args, name) is not None}
    if args.hicache_storage_backend is None:
        if given:
            name = next(n for n, f in _STORAGE_FLAGS.items() if f in given)
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} needs a storage tier: give "
                             "--hicache-storage-backend {" + ",".join(SIMULATE_STORAGE_BACKENDS) + "}")
        return {}
    if "prefetch_threshold" in given:
        if given["prefetch_threshold"] != int(given["prefetch_threshold"]):
            raise ValueError(f"--prefetch-threshold must be a whole number of tokens, got {args.prefetch_threshold:g}")
        given["prefetch_threshold"] = int(given["prefetch_threshold"])
    return {"hicache_storage_backend": args.hicache_storage_backend, **given}


def _host_tier_line(config) -> str:
    """What ``kvlab simulate`` says of the host tier: its size as SGLang sizes it, the write policy, the link."""
    from kvlab.units import fmt_bytes

    pool, cost = config.host_pool(), config.cost
    given = (f"--hicache-ratio {config.hicache_ratio:g}" if config.hicache_ratio is not None
             else f"--hicache-size {config.hicache_size_gib:g} GiB")
    return (f"{given}: {pool.size_tokens:,} host tokens ({fmt_bytes(pool.size_bytes)} at "
            f"{cost.kv_bytes_per_token:,} B/token) · write policy {config.hicache_write_policy} · host link "
            f"{cost.host_to_device_bytes_per_s / 1e9:g} GB/s")


def _storage_tier_line(config) -> str:
    """What ``kvlab simulate`` says of the storage tier: the backend preset (assumed figures), its capacity, the
    prefetch policy and threshold."""
    from kvlab.mem_cache.hicache.storage import STORAGE_PRESETS, storage_capacity_bytes

    preset = STORAGE_PRESETS[config.hicache_storage_backend]
    cap = storage_capacity_bytes(preset.name, config.hicache_storage_size_gb)
    return (f"--hicache-storage-backend {preset.name}: {'unbounded' if cap is None else f'{cap / 1e9:g} GB'}, "
            f"{preset.read_gbps:g} GB/s read, {preset.write_gbps:g} GB/s write, {preset.latency_us:g} µs (assumed) · "
            f"prefetch {config.hicache_storage_prefetch_policy}, threshold {config.prefetch_threshold:,} tokens")
