"""The ``kvlab`` console script: headless reproductions of the findings.

    kvlab repro kv-pool-sizing [--preset P] [--gc-before-measure | --no-gc-before-measure | --compare]
                               [--prompt-tokens N] [--json]
    kvlab simulate (--trace FILE | --workload NAME) [--eviction shortfall|full | --compare]
                   [--hicache-ratio R | --hicache-size GIB] [--hicache-write-policy P] [...]
    kvlab sweep (--trace FILE | --workload NAME) [--kv-pages LIST] [--max-running LIST] [...] [--engine local|ray]
    kvlab report [--out DIR] [--device auto|cuda|sim:<preset>] [--notebooks 01,02,...] [--force]
    kvlab app [01|02|...] [--port N] [--cull-idle-seconds N] [--max-kernels N] [--no-token] [--show-tracebacks]
              [--solutions] [--workshop N]
              [--notebook-dir DIR]
    kvlab explain-log LOG [--model-config CONFIG] [--mem-fraction-static F] [--what-if KEY=VALUE ...]
                      [--compare-engines [--vllm-log LOG] [--vllm-version V]] [--json]
    kvlab replay SNAPSHOT [--device N] [--what-if KEY=VALUE ...] [--capacity SIZE] [--device-memory SIZE] [--json]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
from typing import Any

from kvlab.argtypes import MAX_POOL as _MAX_POOL
from kvlab.argtypes import device_name as _device_name
from kvlab.argtypes import int_at_least as _int_at_least
from kvlab.argtypes import name_list as _name_list
from kvlab.argtypes import nonnegative_int as _nonnegative_int
from kvlab.argtypes import port as _port
from kvlab.argtypes import positive_int as _positive_int
from kvlab.errors import KvlabBug, KvlabError, fail
from kvlab.safe_text import printable
from kvlab.units import DIFFERENCE_HEADER, fmt_bytes, fmt_points, fmt_signed_bytes, fmt_signed_int, with_sign


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"--mem-fraction-static must be in (0, 1), got {value}")
    return value


def _fraction_le1(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--gpu-memory-utilization must be in (0, 1], got {value}")
    return value


def _hicache_number(flag: str):
    """An argparse type for ``--hicache-ratio`` / ``--hicache-size``: a finite number in (0, the largest
    ``SchedulerConfig`` takes], refused naming ``flag`` (exit 2)."""
    import math

    def parse(text: str) -> float:
        from kvlab.sched.config import MAX_HICACHE  # here, not at parser build: kvlab --help imports no torch

        top = MAX_HICACHE["hicache_ratio" if flag == "--hicache-ratio" else "hicache_size_gib"]
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: expected a number, got {text!r}") from None
        if not math.isfinite(value) or not 0 < value <= top:
            raise argparse.ArgumentTypeError(f"{flag} must be in (0, {top:g}], got {text}")
        return value

    return parse


#: the largest ``--kv-tokens``/``--kv-pages``/``--max-running`` simulate takes (issue 26: 10^20 was a traceback)
MAX_POOL = _MAX_POOL


def _registry(module: str, name: str, needed: bool) -> Any:
    """The registry ``module.name`` when a subcommand that offers its names is being built, else ``()``: the
    registries live beside torch (the simulator, the scenarios), and a parser built for another subcommand never
    reads them (argparse parses with the chosen subcommand's parser only)."""
    return getattr(importlib.import_module(module), name) if needed else ()


#: ``kvlab simulate``'s choices, spelled out so that its parser (``kvlab simulate --help``, a mistyped flag) imports
#: no torch: the registries they name live beside it. tests/test_startup.py checks each equals its registry.
SIMULATE_EVICTION_MODES = ("shortfall", "full")  # kvlab.mem_cache.common.EVICTION_MODES
SIMULATE_POLICIES = ("fifo", "filo", "lfu", "lru", "mru", "priority", "slru")  # sorted(evict_policy.EVICTION_POLICIES)
SIMULATE_WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")  # cache_controller.WRITE_POLICIES

#: ``kvlab sweep``'s help line, for the parser built without sweep's options (kvlab.sweep.command.add_parser's own;
#: tests/test_startup.py checks the two agree)
SWEEP_HELP = "run kvlab simulate over a grid of settings, on local cores or a Ray cluster"


def _registered_or(names: tuple[str, ...], module: str, registry: str) -> list[str]:
    """The live registry's names when its module is loaded already (a policy someone registered is one of them),
    else the spelled-out ``names`` (loading it would import torch)."""
    loaded = sys.modules.get(module)
    return sorted(getattr(loaded, registry)) if loaded is not None else list(names)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``kvlab`` parser. ``command``: build only that subcommand's options (any other gets its name and help,
    all ``kvlab --help`` shows), so a command imports only what it uses (``kvlab --help`` no torch); None builds
    every subcommand (tests, docs)."""
    from kvlab.workloads.generators import WORKLOADS

    if command in (None, "app"):
        from kvlab.app import DEFAULT_CULL_IDLE_SECONDS, DEFAULT_MAX_KERNELS
    else:  # only app's parser reads them (kvlab.app loads the report's modules: ~50 ms of every other command)
        DEFAULT_CULL_IDLE_SECONDS = DEFAULT_MAX_KERNELS = None

    SCENARIO_PRESETS = _registry("kvlab.experiments.kv_pool_sizing", "SCENARIO_PRESETS", command in (None, "repro"))
    DEVICE_PRESETS = _registry("kvlab.device.spec", "DEVICE_PRESETS", command in (None, "report", "app"))

    parser = argparse.ArgumentParser(prog="kvlab", description="Reproduce LLM-serving KV-memory findings.")
    commands = parser.add_subparsers(dest="command", required=True)
    repro = commands.add_parser("repro", help="reproduce a finding headless")
    findings = repro.add_subparsers(dest="finding", required=True)

    pool = findings.add_parser(
        "kv-pool-sizing", help="finding 1: KV pool sized before the garbage collector ran",
        description="Size SGLang's KV pool after weight loading, with or without gc.collect() before measuring.",
    )
    pool.add_argument("--preset", default="sglang-pr-4xh200", choices=sorted(SCENARIO_PRESETS),
                      help="scenario preset (default: %(default)s)")
    pool.add_argument("--gc-before-measure", action=argparse.BooleanOptionalAction, default=None,
                      help="run gc.collect() before reading free memory (the fix; default: on)")
    pool.add_argument("--compare", action="store_true",
                      help="run both arms (without and with gc.collect()) and print them side by side")
    pool.add_argument("--empty-cache", action=argparse.BooleanOptionalAction, default=True,
                      help="call empty_cache() inside the reading, as SGLang does (default: on)")
    pool.add_argument("--mem-fraction-static", type=_fraction, default=None, help="override the preset's fraction")
    pool.add_argument("--prompt-tokens", type=_positive_int, default=None, help="prompt length to check (default: preset's)")
    pool.add_argument("--device", default=None, help="override the preset's device: cuda, sim:<preset>")
    pool.add_argument("--json", action="store_true", help="print the result as JSON")

    sim = commands.add_parser(
        "simulate", help="finding 2: run a workload through the scheduler with shortfall or full eviction",
        description="Simulate SGLang's scheduler and radix cache on a workload or a Mooncake-format trace.")
    source = sim.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Mooncake-format JSONL trace (timestamp, input_length, output_length, hash_ids)")
    source.add_argument("--workload", choices=list(WORKLOADS),
                        help="seeded synthetic workload")
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
    # 2^26 tokens (about 1.3 GB of simulator state) is far beyond any real pool; 2^27 took 2.6 GB
    pool_size.add_argument("--kv-tokens", type=_int_at_least(1, MAX_POOL), help="KV pool size in tokens")
    pool_size.add_argument("--kv-pages", type=_int_at_least(1, MAX_POOL), help="KV pool size in pages")
    sim.add_argument("--max-running", type=_int_at_least(1, MAX_POOL), default=256, help="max running requests (default: %(default)s)")
    sim.add_argument("--policy", choices=_registered_or(SIMULATE_POLICIES, "kvlab.mem_cache.evict_policy",
                                                         "EVICTION_POLICIES"), default="lru",
                     help="radix-cache eviction policy (default: %(default)s)")
    host = sim.add_mutually_exclusive_group()
    host.add_argument("--hicache-ratio", type=_hicache_number("--hicache-ratio"), default=None, metavar="R",
                      help="HiCache: add a host KV pool of R times the device pool (SGLang's --hicache-ratio)")
    host.add_argument("--hicache-size", type=_hicache_number("--hicache-size"), default=None, metavar="GIB",
                      help="HiCache: add a host KV pool of GIB GiB (SGLang's --hicache-size, which reads decimal GB)")
    sim.add_argument("--hicache-write-policy", choices=list(SIMULATE_WRITE_POLICIES), default=None,
                     help="HiCache write policy, with --hicache-ratio or --hicache-size (default: write_through)")
    sim.add_argument("--json", action="store_true", help="print the totals as JSON")

    if command in (None, "sweep"):
        from kvlab.sweep.command import add_parser as add_sweep_parser

        add_sweep_parser(commands)
    else:  # sweep's options import the simulator (torch)
        commands.add_parser("sweep", help=SWEEP_HELP)

    explain = commands.add_parser(
        "explain-log", help="explain a server's KV pool from its SGLang or vLLM start-up log",
        description="Recompute the KV pool from an SGLang (0.1.17 to today) or vLLM start-up log and a model's "
                    "config.json: the waterfall, the print-rounding range, findings and what-ifs.")
    explain.add_argument("log", help="the server's start-up log (a text file)")
    explain.add_argument("--model-config", metavar="CONFIG",
                         help="a Hugging Face config.json, the folder holding it, or a kvlab preset name "
                              "(without it the cell size comes from the log's K/V sizes)")
    explain.add_argument("--kv-cache-dtype", default=None,
                         help="auto, bf16, fp16, fp8_e4m3 or fp8_e5m2 (default: what the log or config says)")
    explain.add_argument("--mem-fraction-static", type=_fraction, default=None,
                         help="override the fraction (default: the log's server_args or command line, else the "
                              "version's default)")
    explain.add_argument("--gpu", default=None, help="the GPU, a kvlab preset (h100-80g, a10g, ...) or a product name, "
                                                     "where the log does not name it")
    explain.add_argument("--sglang-version", default=None, help="the SGLang version, where the log does not print it")
    explain.add_argument("--what-if", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                         help="recompute with mem_fraction_static=F, kv_cache_dtype=D, tp=N or gpu=NAME")
    explain.add_argument("--compare-engines", action="store_true",
                         help="also size the pool with the other engine's rule from the same inputs (SGLang vs "
                              "vLLM, term by term; needs --model-config and the GPU)")
    explain.add_argument("--vllm-log", default=None, metavar="LOG",
                         help="with --compare-engines: a vLLM start-up log of the same model (its weights and "
                              "available memory give vLLM's side)")
    explain.add_argument("--vllm-version", default=None, help="with --compare-engines: the vLLM version whose rule "
                                                              "applies (default: the vLLM log's, else 0.34.0)")
    explain.add_argument("--gpu-memory-utilization", type=_fraction_le1, default=None,
                         help="with --compare-engines: vLLM's utilization (default: the version's)")
    explain.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                         help="with --compare-engines: vLLM's profile-run tokens for the activation estimate "
                              "(default: vllm serve's for the card: 8192 on 70 GiB+ cards other than A100s, else "
                              "2048)")
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")

    data = commands.add_parser("data", help="regenerate the files kvlab ships in data/")
    data_kinds = data.add_subparsers(dest="kind", required=True)
    tiny = data_kinds.add_parser("tiny-checkpoint", help="write the tiny model's safetensors checkpoint")
    tiny.add_argument("--out", default="data/tiny-llama", help="output directory (default: %(default)s)")
    # torch's generator takes seeds in [-2^63, 2^64 - 1] (kvlab.model.checkpoint.MIN_SEED/MAX_SEED; issue 37: 10^20
    # was "Overflow when unpacking long long")
    tiny.add_argument("--seed", type=_int_at_least(-(2 ** 63), 2 ** 64 - 1), default=0,
                      help="weights seed, an integer from -2^63 to 2^64 - 1 (default: %(default)s)")
    tiny.add_argument("--force", action="store_true", help="overwrite an existing checkpoint")

    report = commands.add_parser(
        "report", help="execute every notebook headless and write a static HTML report",
        description="Execute notebooks/*.ipynb headless and write DIR/index.html, the executed notebooks, "
                    "their HTML, PNGs of the key figures and summary.json (both findings, both arms).")
    report.add_argument("--out", default="kvlab-report", help="output directory (default: %(default)s)")
    report.add_argument("--device", type=_device_name(DEVICE_PRESETS), default="auto",
                        help="auto, cuda, cuda:N or sim:<preset> (default: %(default)s)")
    report.add_argument("--notebooks", type=_name_list, default=None, metavar="01,02,...",
                        help="comma-separated notebook numbers or names (default: all)")
    report.add_argument("--force", action="store_true",
                        help="write into an existing directory that is not a previous kvlab report (beside its "
                             "files: a file kvlab did not write is never written over or deleted)")
    report.add_argument("--no-png", action="store_true", help="skip the PNG export (no browser needed)")
    report.add_argument("--notebook-dir", default=None, help="where the notebooks are (default: kvlab's, see kvlab.paths)")

    app = commands.add_parser(
        "app", help="serve one notebook as a Voila dashboard on 127.0.0.1 (code hidden, widgets live)",
        description="Serve a notebook with Voila for demos: only outputs and live widgets are shown.")
    app.add_argument("notebook", nargs="?", default="01", help="notebook number or name (default: %(default)s)")
    app.add_argument("--port", type=_port, default=8866, help="port on 127.0.0.1, 1 to 65535 (default: %(default)s)")
    app.add_argument("--device", type=_device_name(DEVICE_PRESETS, "cpu"), default=None,
                     help="KVLAB_DEVICE for the kernel: auto, cpu, cuda, cuda:N, sim:<preset>")
    app.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    app.add_argument("--cull-idle-seconds", type=_nonnegative_int, default=DEFAULT_CULL_IDLE_SECONDS, metavar="N",
                     help="shut down a page's kernel once it has been idle N s with no page connected "
                          "(a closed tab, a sleeping laptop); 0 = never (default: %(default)s)")
    app.add_argument("--notebook-dir", default=None, help="where the notebooks are (default: kvlab's, see kvlab.paths)")
    app.add_argument("--no-token", action="store_true",
                     help="serve without the random token in the printed URL: every user of this machine can then "
                          "open the page and run code as you")
    app.add_argument("--max-kernels", type=_nonnegative_int, default=DEFAULT_MAX_KERNELS, metavar="N",
                     help="pages (kernels) open at once; one more gets HTTP 503; 0 = no cap (default: %(default)s)")
    app.add_argument("--show-tracebacks", action="store_true",
                     help="show a failing cell's traceback on the page (default: hidden from viewers)")
    app.add_argument("--solutions", action="store_true",
                     help="workshops: each exercise offers its solution on the page (KVLAB_SOLUTIONS=1 for the kernels)")
    app.add_argument("--workshop", type=_nonnegative_int, default=0, metavar="N",
                     help="workshops: keep N pre-heated kernels that have already run the notebook, so a page shows "
                          "its panel at once (Voila's preheat_kernel; the page then renders whole, not cell by cell); "
                          "they come on top of --max-kernels (default: 0, off)")

    replay = commands.add_parser(
        "replay", help="replay a torch memory snapshot through the allocator model: fidelity and what-ifs",
        description="Replay a torch.cuda.memory._dump_snapshot pickle's trace through kvlab's model of the "
                    "caching allocator, report how exactly it reproduces the recording, and what other "
                    "PYTORCH_CUDA_ALLOC_CONF settings would have done with the same allocations.")
    replay.add_argument("snapshot", help="a _dump_snapshot pickle (or a pickled torch.cuda.memory_snapshot() list)")
    replay.add_argument("--device", type=_nonnegative_int, default=None,
                        help="device index (default: the first device with a trace)")
    replay.add_argument("--what-if", action="append", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                        help="settings to try, one scenario per flag (repeatable): expandable_segments, "
                             "max_split_size_mb, roundup_power2_divisions (default: expandable_segments=True)")
    replay.add_argument("--capacity", default=None, metavar="SIZE",
                        help="also say whether each scenario runs out of memory on a device of SIZE, e.g. 24GiB")
    replay.add_argument("--device-memory", default=None, metavar="SIZE",
                        help="the device's total memory, e.g. 80GiB (torch's totalGlobalMem): with expandable "
                             "segments it sets each segment's address space (default: from a recorded oom, else "
                             "unknown)")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _report(args) -> int:
    from kvlab.report import ReportStopped, build_report

    only = args.notebooks  # a list of names (argtypes.name_list), or None for all
    extra = {"notebook_dir": args.notebook_dir} if args.notebook_dir else {}
    try:
        report = build_report(args.out, device=args.device, notebooks=only, force=args.force, pngs=not args.no_png,
                              **extra)  # ReportError, ValueError, OSError: main() reports them
    except ReportStopped as stop:  # SIGINT, SIGTERM, SIGHUP: what was written, and 128 + the signal
        print(f"kvlab: {printable(stop.message)}", file=sys.stderr)
        return stop.exit_status
    for run in report.runs:
        state = "ok" if run.ok else "FAILED"
        print(f"  {printable(run.name):<32} {state:>6}  {run.seconds:6.1f} s")
    print(f"wrote {printable(report.out_dir / 'index.html')} ({len(report.runs)} notebooks, {len(report.pngs)} "
          f"figures, {report.seconds:.0f} s)")
    for run in report.failures:
        fail(run.error)
    if report.figure_error:
        fail(report.figure_error)
    return 0 if report.ok else 1


def _app(args) -> int:
    from kvlab.app import serve

    extra = {"notebook_dir": args.notebook_dir} if args.notebook_dir else {}
    return serve(args.notebook, port=args.port, device=args.device, open_browser=not args.no_browser,
                 cull_idle_seconds=args.cull_idle_seconds, token=not args.no_token, max_kernels=args.max_kernels,
                 show_tracebacks=args.show_tracebacks, solutions=args.solutions, pool_size=args.workshop, **extra)  # AppError: main() reports it


def _replay(args) -> int:
    import warnings

    from kvlab.device.replay.settings import parse_size
    from kvlab.device.replay.whatif import replay_with_what_ifs
    from kvlab.device.snapshot import SnapshotKeyWarning

    sizes = {}
    for flag, value in (("--capacity", args.capacity), ("--device-memory", args.device_memory)):
        try:
            sizes[flag] = None if value is None else parse_size(value)
        except ValueError as exc:
            return fail(f"{flag}: {exc}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SnapshotKeyWarning)
        result, what_ifs = replay_with_what_ifs(args.snapshot, args.device, args.what_if, sizes["--capacity"],
                                                device_memory=sizes["--device-memory"])
    for warning in caught:
        print(f"kvlab: warning: {printable(warning.message, lines=True)}", file=sys.stderr)
    print(json.dumps(result.to_json(what_ifs), indent=2) if args.json else printable(result.text(what_ifs), lines=True))
    return 0


def _write_tiny_checkpoint(args) -> int:
    from pathlib import Path

    from kvlab.model import get_model_config, write_checkpoint
    from kvlab.model.checkpoint import SAFETENSORS_FILE

    target = Path(args.out) / SAFETENSORS_FILE
    if target.exists() and not args.force:
        return fail(f"{target} exists; pass --force to overwrite it")
    path = write_checkpoint(args.out, get_model_config("tiny"), seed=args.seed)
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


def _simulate(args) -> int:
    from kvlab.experiments import shortfall_eviction
    from kvlab.mem_cache.options import PoolTooLargeError
    from kvlab.sched.config import check_pool, request_extent
    from kvlab.sched.scheduler import StepLimitError
    from kvlab.sweep.point import default_page_size, load_requests, parse_workload_params, pool_tokens, scheduler_config

    page_size = args.page_size or default_page_size(trace=args.trace)
    overrides = parse_workload_params(args.workload_param)
    if overrides and args.trace:
        raise ValueError("--workload-param applies to --workload, not to --trace")
    requests = load_requests(workload=args.workload, trace=args.trace, seed=args.seed, overrides=overrides)
    kv_tokens = pool_tokens(requests, page_size, kv_tokens=args.kv_tokens, kv_pages=args.kv_pages)
    check_pool(request_extent(requests), page_size=page_size, kv_tokens=kv_tokens, **_pool_flags(args, page_size))
    options = dict(page_size=page_size, kv_tokens=kv_tokens, max_running=args.max_running, policy=args.policy,
                   **_hicache_options(args))
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
        for totals in arms.values():  # wall-clock figures differ run to run: keep the JSON reproducible
            totals.pop("wall_s", None)
            totals.pop("cpu_s", None)
        shortfall, full = arms["shortfall"], arms["full"]
        title = (f"simulate --compare · {source} · page size {page_size} · KV pool {shortfall['kv_tokens']:,} tokens"
                 f" · policy {shortfall['policy']}")
        _print_compare(title, ("full", "the bug", full), ("shortfall", "the fix", shortfall),
                       skip=("eviction", "page_size", "kv_tokens", "policy"), as_json=args.json,
                       percent=("hit_rate",))
        return 0
    totals = result.totals()
    if args.json:
        print(json.dumps(totals, indent=2))
        return 0
    print(f"simulate · {source} · eviction {totals['eviction']} · page size {page_size} · "
          f"KV pool {totals['kv_tokens']:,} tokens · policy {totals['policy']}")
    if result.config.hicache:
        print(f"host tier (HiCache) · {_host_tier_line(result.config)}")
    width = max(map(len, totals))
    for key, value in totals.items():
        if key in ("eviction", "page_size", "kv_tokens", "policy"):
            continue
        shown = f"{value:.2%}" if key == "hit_rate" else (f"{value:,}" if isinstance(value, int) else f"{value:,.2f}")
        print(f"  {key:<{width}}  {shown:>14}")
    return 0


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
        if args.hicache_write_policy is not None:
            raise ValueError(f"--hicache-write-policy {args.hicache_write_policy} needs a host tier: give "
                             "--hicache-ratio R or --hicache-size GIB")
        return {}
    options = {"hicache_write_policy": args.hicache_write_policy or "write_through"}
    if args.hicache_ratio is not None:
        options["hicache_ratio"] = args.hicache_ratio
    else:
        options["hicache_size_gib"] = args.hicache_size
    return options


def _host_tier_line(config) -> str:
    """What ``kvlab simulate`` says of the host tier: its size as SGLang sizes it, the write policy, the link."""
    from kvlab.units import fmt_bytes

    pool, cost = config.host_pool(), config.cost
    given = (f"--hicache-ratio {config.hicache_ratio:g}" if config.hicache_ratio is not None
             else f"--hicache-size {config.hicache_size_gib:g} GiB")
    return (f"{given}: {pool.size_tokens:,} host tokens ({fmt_bytes(pool.size_bytes)} at "
            f"{cost.kv_bytes_per_token:,} B/token) · write policy {config.hicache_write_policy} · host link "
            f"{cost.host_to_device_bytes_per_s / 1e9:g} GB/s")


def _difference(bug: dict, fix: dict, skip: tuple = ()) -> dict:
    """fix − bug (kvlab.units' convention) for every numeric field both share (bools and text are not differences)."""
    out = {}
    for key, b in bug.items():
        a = fix.get(key)
        if key in skip or isinstance(a, bool) or isinstance(b, bool):
            continue
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out[key] = round(a - b, 6) if isinstance(a, float) or isinstance(b, float) else a - b
    return out


def _shown(key: str, value, percent: tuple = (), byte_keys: bool = False, signed: bool = False) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if key in percent:
        return fmt_points(value * 100) if signed else f"{value:.2%}"
    if byte_keys and key.endswith("_bytes"):
        return fmt_signed_bytes(value) if signed else fmt_bytes(value)
    if signed:
        return fmt_signed_int(value) if isinstance(value, int) else with_sign(f"{abs(value):,.2f}", value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def _print_compare(title: str, bug: tuple, fix: tuple, *, skip: tuple = (), as_json: bool = False,
                   percent: tuple = (), byte_keys: bool = False) -> None:
    """The bug's arm, the fix's, then fix − bug (kvlab.units' convention); ``bug``/``fix`` are (key, caption, fields)."""
    (bkey, bcap, bfields), (fkey, fcap, ffields) = bug, fix
    diff = _difference(bfields, ffields, skip)
    if as_json:
        print(json.dumps({bkey: bfields, fkey: ffields, "difference": {"of": f"{fkey} - {bkey}", **diff}}, indent=2))
        return
    print(title)
    keys = [k for k in bfields if k not in skip]
    width = max(map(len, keys))
    head = (f"{bkey} ({bcap})", f"{fkey} ({fcap})", DIFFERENCE_HEADER)
    cols = [max(16, len(h)) for h in head]
    print(f"  {'':<{width}}  {head[0]:>{cols[0]}}  {head[1]:>{cols[1]}}  {head[2]:>{cols[2]}}")
    notes = []
    for key in keys:
        b = _shown(key, bfields[key], percent, byte_keys)
        a = _shown(key, ffields.get(key), percent, byte_keys)
        d = _shown(key, diff[key], percent, byte_keys, signed=True) if key in diff and diff[key] else ""
        if max(len(a), len(b)) > max(cols[:2]):  # long text (an error message): under the table, per arm
            notes += [f"  {key} ({arm}): {text}" for arm, text in ((bkey, b), (fkey, a)) if text != "—"]
            b, a = ("see below" if t != "—" else t for t in (b, a))
        print(f"  {key:<{width}}  {b:>{cols[0]}}  {a:>{cols[1]}}  {d:>{cols[2]}}")
    for note in notes:
        print(note)


def _pool_compare(args) -> int:
    from kvlab.experiments import kv_pool_sizing

    if args.gc_before_measure is not None:
        flag = "--gc-before-measure" if args.gc_before_measure else "--no-gc-before-measure"
        return fail(f"--compare runs both arms: drop {flag}")
    no_gc, with_gc = kv_pool_sizing.compare(
        args.preset, empty_cache=args.empty_cache, mem_fraction_static=args.mem_fraction_static,
        prompt_tokens=args.prompt_tokens, device=args.device)
    left, right = with_gc.to_json(), no_gc.to_json()
    shared = ("preset", "gc_before_measure", "empty_cache", "mem_fraction_static", "tp_size", "device", "model",
              "prompt_tokens")
    title = (f"kv-pool-sizing --compare · preset {left['preset']} · device {left['device']} × TP{left['tp_size']}"
             f" · model {left['model']} · mem_fraction_static {left['mem_fraction_static']}"
             f" · prompt {left['prompt_tokens']:,} tokens")
    _print_compare(title, ("without_gc", "the bug", right), ("with_gc", "the fix", left), skip=shared,
                   as_json=args.json, byte_keys=True)
    if not args.json and args.preset == kv_pool_sizing.SGLANG_PR_4XH200.name:
        print(kv_pool_sizing.pr_numbers_note(right["max_total_num_tokens"], left["max_total_num_tokens"]))
    return 0


def _print_pool(result) -> None:
    data = result.to_json()
    arm = "with gc.collect() before measuring" if result.gc_before_measure else "WITHOUT gc.collect() before measuring"
    print(f"kv-pool-sizing · preset {data['preset']} · {arm}")
    print(f"  device {data['device']} × TP{data['tp_size']} · model {data['model']} · "
          f"mem_fraction_static {data['mem_fraction_static']} · empty_cache {'on' if data['empty_cache'] else 'off'}")
    rows = [
        ("free before load", fmt_bytes(data["pre_model_load_bytes"])),
        ("free after load (available)", fmt_bytes(data["available_bytes"])),
    ]
    if result.budget is not None:
        rows += [
            ("slack  pre × (1 − f)", fmt_bytes(data["slack_bytes"])),
            ("rest (KV budget)", fmt_bytes(data["rest_bytes"])),
            ("cell size", f"{fmt_bytes(data['cell_size_bytes'])} per token"),
            ("max_total_num_tokens", f"{data['max_total_num_tokens']:,}"),
            ("max_req_input_len", f"{data['max_req_input_len']:,}"),
        ]
    rows.append(("memory idle once gc has run", fmt_bytes(data["idle_bytes"])))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>16}")
    verdict = "ACCEPTED" if data["accepted"] else "REFUSED"
    print(f"  prompt of {data['prompt_tokens']:,} tokens: {verdict}")
    if data["error"]:
        print(f"  error: {data['error']}")
    if data["preset"] == "sglang-pr-4xh200":
        print("  (the PR measured 1,741 → 349,377 tokens: `kvlab repro kv-pool-sizing --compare` says why kvlab differs)")


def _explain_log(args) -> int:
    from kvlab.model.hf_config import load_model_config
    from kvlab.serving import explain_log
    from kvlab.serving.text import format_explanation

    config = None
    if args.model_config:
        config = load_model_config(args.model_config, kv_cache_dtype=args.kv_cache_dtype or "auto")
    exp = explain_log(args.log, model_config=config, mem_fraction_static=args.mem_fraction_static, gpu=args.gpu,
                      sglang_version=args.sglang_version, kv_cache_dtype=args.kv_cache_dtype,
                      what_if=args.what_if)
    comparison = _engine_comparison(args, exp) if args.compare_engines else None
    if args.json:
        data = exp.to_json()
        if comparison is not None:
            data["engine_comparison"] = comparison.to_json()
        print(json.dumps(data, indent=2))
    else:
        from kvlab.serving.text import format_comparison

        text = format_explanation(exp) + ("\n" + format_comparison(comparison) if comparison is not None else "")
        print(printable(text, lines=True))  # a config's _name_or_path or a log's text: escapes shown, not obeyed
    return 0


def _engine_comparison(args, exp):
    from kvlab.serving.engine_compare import compare_explanation
    from kvlab.serving.sglang_log import LogError
    from kvlab.serving.vllm_log import parse_vllm_log

    vllm_log = None
    if args.vllm_log:
        try:
            with open(args.vllm_log, encoding="utf-8", errors="replace") as f:
                vllm_log = parse_vllm_log(f.read(), args.vllm_log)
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            raise LogError(f"--vllm-log {args.vllm_log}: cannot read the log ({exc.strerror or exc})") from None
    return compare_explanation(exp, vllm_log=vllm_log, gpu_memory_utilization=args.gpu_memory_utilization,
                               vllm_version=args.vllm_version, max_num_batched_tokens=args.max_num_batched_tokens)


def _pool(args) -> int:
    from kvlab.experiments import kv_pool_sizing

    if args.compare:
        return _pool_compare(args)
    result = kv_pool_sizing.run(
        args.preset, gc_before_measure=args.gc_before_measure is not False, empty_cache=args.empty_cache,
        mem_fraction_static=args.mem_fraction_static, prompt_tokens=args.prompt_tokens, device=args.device,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _print_pool(result)
    return 0


def _sweep(args) -> int:
    from kvlab.sweep.command import main as sweep_main

    return sweep_main(args)


# subcommand (and, for `repro` and `data`, its first argument) -> the function that runs it
_COMMANDS = {
    ("repro", "kv-pool-sizing"): _pool,
    ("simulate", None): _simulate,
    ("sweep", None): _sweep,
    ("report", None): _report,
    ("app", None): _app,
    ("explain-log", None): _explain_log,
    ("replay", None): _replay,
    ("data", "tiny-checkpoint"): _write_tiny_checkpoint,
}


# What a user can act on: kvlab's own KvlabError (naming the file, line or field), and the builtin errors the
# readers and scenarios raise with a message for the user (a bad value, a file that cannot be read, a workload
# that runs out of memory or never finishes). A KvlabBug is never one of them, whatever its builtin base.
USER_ERRORS = (KvlabError, ValueError, RuntimeError, OSError)

# The flags that name a user's input, in the order a failure is attributed to them
_INPUT_ARGS = ("snapshot", "log", "trace", "model_config", "vllm_log", "workload", "preset", "notebook",
               "notebook_dir", "out")


def _inputs(args: argparse.Namespace) -> str:
    """The inputs a command ran on, for the one line an unexpected error prints."""
    named = [f"{getattr(args, key)}" for key in _INPUT_ARGS if getattr(args, key, None) not in (None, "", [])]
    return ", ".join(named) or "its defaults"


def crash_dir() -> str:
    """Where an unexpected error's full traceback is written: ``$KVLAB_CRASH_DIR``, else the temp folder."""
    import tempfile

    return os.environ.get("KVLAB_CRASH_DIR") or tempfile.gettempdir()


def _unexpected(args: argparse.Namespace, exc: BaseException) -> int:
    """An exception that is no user error (a KvlabBug or any other): one line naming the command, its inputs
    and the exception, plus the file holding the full traceback; exit 3."""
    import tempfile
    import traceback

    command = " ".join(part for part in (args.command, getattr(args, "finding", None) or getattr(args, "kind", None))
                       if part)
    what = f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if str(exc) else type(exc).__name__
    try:
        folder = crash_dir()
        os.makedirs(folder, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="kvlab-crash-", suffix=".txt", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"kvlab {command} on {_inputs(args)}\nargv: {sys.argv!r}\n\n")
            f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        saved = f"the full traceback is in {path}"
    except OSError as save_error:
        saved = f"the traceback could not be saved ({save_error})"
    print(f"kvlab: internal error: `kvlab {command}` failed on {_inputs(args)} with {what} (a kvlab bug, not "
          f"your input); {saved}: please include it in a bug report", file=sys.stderr)
    return 3


# (subcommand, attribute, how the error names it, what it must be): the inputs main() checks before running
_FILE_INPUTS = (
    ("replay", "snapshot", "{}", "file"),
    ("simulate", "trace", "--trace {}", "file"),
    ("sweep", "trace", "--trace {}", "file"),
    ("explain-log", "log", "{}", "file"),
    ("explain-log", "vllm_log", "--vllm-log {}", "file"),
    ("explain-log", "model_config", "--model-config {}", "file or folder"),
    ("report", "notebook_dir", "--notebook-dir {}", "folder"),
    ("app", "notebook_dir", "--notebook-dir {}", "folder"),
)


#: the file inputs read whole into memory, and their kind in kvlab.input_limits.EXPANSION
_READ_WHOLE = {"snapshot": "snapshot", "trace": "trace", "log": "log", "vllm_log": "log", "model_config": "config"}


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse a folder where a file goes (and a file where a folder goes), and anything that is not a regular
    file (a FIFO blocks forever, ``/dev/zero`` never ends), naming the flag; and a file too large to read in the
    memory this machine has (kvlab.input_limits). A missing path is left to the reader, whose message says what it
    looked for (``--model-config`` also takes a preset name)."""
    import stat

    from kvlab.input_limits import check_size

    for command, attr, shown, kind in _FILE_INPUTS:
        path = getattr(args, attr, None) if args.command == command else None
        if not path:
            continue
        try:
            status = os.stat(path)
            mode = status.st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise KvlabError(f"{shown.format(path)}: cannot be read ({exc.strerror or exc})") from None
        name = shown.format(path)
        if stat.S_ISDIR(mode) and "folder" not in kind:
            raise KvlabError(f"{name}: is a folder, not a file; give the file itself")
        if stat.S_ISREG(mode) and "file" not in kind:
            raise KvlabError(f"{name}: is a file, not a folder; give the folder holding the notebooks")
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise KvlabError(f"{name}: is not a regular file (a FIFO, socket or device); give a {kind}")
        if stat.S_ISREG(mode) and attr in _READ_WHOLE:
            check_size(path, name, _READ_WHOLE[attr], status.st_size)


def _command_named(argv: list[str]) -> str:
    """The subcommand ``argv`` names: its first word that is no option (the top level takes no option with a
    value), or "" when there is none (``kvlab --help``, ``kvlab``)."""
    return next((word for word in argv if not word.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; the one place that maps errors to exit codes.

    0: done; 1: done, but something the user asked for failed (a notebook in ``kvlab report``); 2: a user error
    (``kvlab: error: …``, see :data:`USER_ERRORS`; also argparse's usage errors); 3: an unexpected error or a
    :class:`~kvlab.errors.KvlabBug` (one line, traceback saved under :func:`crash_dir`); 130: interrupted."""
    parser = build_parser(_command_named(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    command = _COMMANDS.get((args.command, getattr(args, "finding", None) or getattr(args, "kind", None)))
    if command is None:  # pragma: no cover - argparse refuses unknown commands first
        parser.error("unknown command")
    if argv is None and args.command in _EXIT_WITHOUT_TEARDOWN:
        # the process ends when the command does (os._exit): the cyclic collector would only rescan the loaded trace
        # and the run's objects (a 12k-request simulation collects no garbage cycle worth the scans)
        gc.disable()
    try:
        check_inputs(args)
        code = command(args)
    except (KvlabBug, RecursionError) as exc:  # a RecursionError is a RuntimeError, but never a message for a user
        return _unexpected(args, exc)
    except USER_ERRORS as exc:
        return fail(exc)
    except Exception as exc:  # anything else is a kvlab bug: never a traceback on the user's terminal
        return _unexpected(args, exc)
    if argv is None and code == 0 and args.command in _EXIT_WITHOUT_TEARDOWN:
        _exit_now(code)
    return code


#: Commands that write nothing but stdout and stderr: run as the process (``kvlab …``, ``python -m kvlab …``; not a
#: caller's ``main([...])``), they exit as soon as their output is flushed, skipping the interpreter's teardown of the
#: run's objects (about half a second after a 12k-request ``kvlab simulate``: the tree, the rows, the requests).
_EXIT_WITHOUT_TEARDOWN = frozenset({"simulate"})


def _exit_now(code: int) -> None:
    """Flush stdout and stderr, then end the process with ``code`` at once (``os._exit``). When a flush fails (a
    closed pipe), return instead: the normal exit reports it."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
