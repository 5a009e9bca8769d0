"""``kvlab repro kv-pool-sizing``: finding 1 headless, one arm or both side by side."""

from __future__ import annotations

import argparse
import json

import kvlab.cli.flags as flags
from kvlab.argtypes import positive_int as _positive_int
from kvlab.cli.output import print_compare
from kvlab.errors import fail
from kvlab.units import fmt_bytes


def add_parser(commands, command: str | None) -> None:
    """``kvlab repro kv-pool-sizing``'s options (the scenario presets are loaded only when it is the command)."""
    SCENARIO_PRESETS = flags.registry("kvlab.experiments.kv_pool_sizing", "SCENARIO_PRESETS", command in (None, "repro"))
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
    pool.add_argument("--mem-fraction-static", type=flags.fraction, default=None, help="override the preset's fraction")
    pool.add_argument("--prompt-tokens", type=_positive_int, default=None, help="prompt length to check (default: preset's)")
    pool.add_argument("--device", default=None, help="override the preset's device: cuda, sim:<preset>")
    pool.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    from kvlab.experiments import kv_pool_sizing

    if args.compare:
        return _compare(args)
    result = kv_pool_sizing.run(
        args.preset, gc_before_measure=args.gc_before_measure is not False, empty_cache=args.empty_cache,
        mem_fraction_static=args.mem_fraction_static, prompt_tokens=args.prompt_tokens, device=args.device,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _print_pool(result)
    return 0


def _compare(args) -> int:
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
    print_compare(title, ("without_gc", "the bug", right), ("with_gc", "the fix", left), skip=shared,
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
