"""``kvlab explain-log``: a server's KV pool recomputed from its start-up log, with what-ifs and the other engine's
rule beside it."""

from __future__ import annotations

import json

import kvlab.cli.flags as flags
from kvlab.argtypes import positive_int as _positive_int
from kvlab.safe_text import printable


def add_parser(commands, command: str | None) -> None:
    """``kvlab explain-log``'s options."""
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
    explain.add_argument("--mem-fraction-static", type=flags.fraction, default=None,
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
    explain.add_argument("--gpu-memory-utilization", type=flags.fraction_le1, default=None,
                         help="with --compare-engines: vLLM's utilization (default: the version's)")
    explain.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                         help="with --compare-engines: vLLM's profile-run tokens for the activation estimate "
                              "(default: vllm serve's for the card: 8192 on 70 GiB+ cards other than A100s, else "
                              "2048)")
    explain.add_argument("--replay", action="store_true",
                         help="with runtime lines: replay the load they imply through kvlab's scheduler with the "
                              "server's pool, print the distance from the logged usage and hit rate, and what-ifs "
                              "(pool x2, a host tier, full eviction)")
    explain.add_argument("--page-size", type=_positive_int, default=1, help="with --replay: the server's page size")
    explain.add_argument("--pool-tokens", type=_positive_int, default=None,
                         help="the KV pool in tokens, where the log prints no max_total_num_tokens (runtime usage "
                              "in tokens; --replay)")
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")


def run(args) -> int:
    from kvlab.model.hf_config import load_model_config
    from kvlab.serving import explain_log
    from kvlab.serving.runtime.report import format_runtime as runtime_text
    from kvlab.serving.sglang_log import NoStartupReadings
    from kvlab.serving.text import format_explanation

    config = None
    if args.model_config:
        config = load_model_config(args.model_config, kv_cache_dtype=args.kv_cache_dtype or "auto")
    try:
        exp = explain_log(args.log, model_config=config, mem_fraction_static=args.mem_fraction_static, gpu=args.gpu,
                          sglang_version=args.sglang_version, kv_cache_dtype=args.kv_cache_dtype,
                          what_if=args.what_if)
    except NoStartupReadings as exc:  # a log of runtime lines alone is explained as such (issue 36)
        runtime = _runtime(args, None)
        if runtime is None:
            raise
        text = f"Start-up: not explained ({exc})\n\n" + runtime_text(runtime)
        print(json.dumps({"runtime": _no_text(runtime)}, indent=2) if args.json else printable(text, lines=True))
        return 0
    runtime = _runtime(args, exp)
    comparison = _engine_comparison(args, exp) if args.compare_engines else None
    if args.json:
        data = exp.to_json()
        if comparison is not None:
            data["engine_comparison"] = comparison.to_json()
        if runtime is not None:
            data["runtime"] = _no_text(runtime)
        print(json.dumps(data, indent=2))
    else:
        from kvlab.serving.text import format_comparison

        text = format_explanation(exp) + ("\n" + format_comparison(comparison) if comparison is not None else "")
        text += "\n\n" + runtime_text(runtime) if runtime is not None else ""
        print(printable(text, lines=True))  # a config's _name_or_path or a log's text: escapes shown, not obeyed
    return 0


def _no_text(runtime: dict) -> dict:
    return {k: v for k, v in runtime.items() if k != "replay_text"}


def _runtime(args, exp) -> dict | None:
    """The runtime section (issue 36): None when the log has no runtime line, so the output is unchanged."""
    from kvlab.serving.runtime.report import has_readings, runtime_json, runtime_timeline

    pool, source = getattr(exp, "max_total_num_tokens_logged", None), "the start-up lines' max_total_num_tokens"
    if args.pool_tokens:
        pool, source = args.pool_tokens, f"--pool-tokens {args.pool_tokens}"
    tl = runtime_timeline(args.log, pool_tokens=pool, pool_source=source if pool else None)
    if not has_readings(tl):
        return None
    data = runtime_json(tl)
    if args.replay:
        from kvlab.experiments.runtime_replay import format_replay, replay_runtime

        replay = replay_runtime(tl, page_size=args.page_size)
        data["replay"], data["replay_text"] = replay.to_json(), format_replay(replay)
    return data


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
