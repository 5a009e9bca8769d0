"""The ``kvlab`` console script: headless reproductions of the findings.

    kvlab repro kv-pool-sizing [--preset P] [--gc-before-measure | --no-gc-before-measure]
                               [--prompt-tokens N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from kvlab.units import fmt_bytes


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"--mem-fraction-static must be in (0, 1), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from kvlab.experiments.kv_pool_sizing import SCENARIO_PRESETS

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
    pool.add_argument("--gc-before-measure", action=argparse.BooleanOptionalAction, default=True,
                      help="run gc.collect() before reading free memory (the fix; default: on)")
    pool.add_argument("--empty-cache", action=argparse.BooleanOptionalAction, default=True,
                      help="call empty_cache() inside the reading, as SGLang does (default: on)")
    pool.add_argument("--mem-fraction-static", type=_fraction, default=None, help="override the preset's fraction")
    pool.add_argument("--prompt-tokens", type=_positive_int, default=None, help="prompt length to check (default: preset's)")
    pool.add_argument("--device", default=None, help="override the preset's device: cuda, sim:<preset>")
    pool.add_argument("--json", action="store_true", help="print the result as JSON")

    data = commands.add_parser("data", help="regenerate the files kvlab ships in data/")
    data_kinds = data.add_subparsers(dest="kind", required=True)
    tiny = data_kinds.add_parser("tiny-checkpoint", help="write the tiny model's safetensors checkpoint")
    tiny.add_argument("--out", default="data/tiny-llama", help="output directory (default: %(default)s)")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--force", action="store_true", help="overwrite an existing checkpoint")
    return parser


def _write_tiny_checkpoint(args) -> int:
    from pathlib import Path

    from kvlab.model import get_model_config, write_checkpoint
    from kvlab.model.checkpoint import SAFETENSORS_FILE

    target = Path(args.out) / SAFETENSORS_FILE
    if target.exists() and not args.force:
        print(f"kvlab: error: {target} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    path = write_checkpoint(args.out, get_model_config("tiny"), seed=args.seed)
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
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
            ("cell size", f"{data['cell_size_bytes']:,} B/token"),
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "repro" and args.finding == "kv-pool-sizing":
        from kvlab.experiments import kv_pool_sizing

        try:
            result = kv_pool_sizing.run(
                args.preset, gc_before_measure=args.gc_before_measure, empty_cache=args.empty_cache,
                mem_fraction_static=args.mem_fraction_static, prompt_tokens=args.prompt_tokens, device=args.device,
            )
        except (ValueError, RuntimeError, FileNotFoundError) as exc:
            print(f"kvlab: error: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(result.to_json(), indent=2))
        else:
            _print_pool(result)
        return 0
    if args.command == "data" and args.kind == "tiny-checkpoint":
        return _write_tiny_checkpoint(args)
    parser.error("unknown command")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
