"""Explain a server's KV pool from its start-up log and (optionally) the model's config.json.

``explain_log(path, model_config=..., ...)`` reads an SGLang or vLLM start-up log, recomputes the pool
with that version's rules (kvlab.serving.sglang_versions) and the cell size from the config (or from the
log's own K/V sizes, marked as such), gives the range the log's 2-decimal rounding allows, and lists
findings and what-ifs. Every input it cannot use raises ``LogError`` / ``ConfigError`` naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvlab.input_limits import reading
from kvlab.model.config import ModelConfig
from kvlab.serving.cell import config_cell
from kvlab.serving.findings import sglang_findings
from kvlab.serving.gpu import resolve_gpu
from kvlab.serving.pool import Pool, cell_from_logged_sizes, sglang_tokens_range
from kvlab.serving.provenance import assumed_words
from kvlab.serving.result import Explanation
from kvlab.serving.sglang_log import (
    MAX_PARALLEL,
    LogError,
    NoStartupReadings,
    RankReadings,
    SGLangStartup,
    parse_sglang_log,
)
from kvlab.serving.sglang_versions import (
    EXPLAINED_SINCE,
    KNOWN_RANGE,
    ROPE_RESERVE_SINCE,
    at_least,
    cell_rule,
    default_mem_fraction,
    expert_map_segment_bytes,
    is_known,
    is_newer_than_read,
    nearest_read,
    parse_version,
    rope_reserve_for_config,
)
from kvlab.serving.vllm_explain import explain_vllm
from kvlab.serving.vllm_log import looks_like_vllm, parse_vllm_log
from kvlab.serving.whatif import apply_what_ifs
from kvlab.units import GiB

TORCH_DTYPE_BYTES = {"torch.bfloat16": 2, "torch.float16": 2, "torch.half": 2, "torch.float32": 4,
                     "torch.float8_e4m3fn": 1, "torch.float8_e5m2": 1, "torch.float8_e4m3fnuz": 1,
                     "torch.float8_e5m2fnuz": 1, "torch.uint8": 1}
OPTION_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1,
                      "float32": 4}


def _assumed_version(log: SGLangStartup, given: str | None) -> tuple[str | None, str, str | None]:
    if given:
        _check_given_version(given)
        return given, "--sglang-version", nearest_read(given)
    if log.version:
        return log.version, log.version_source, nearest_read(log.version)
    if log.format_hints:
        floor = max(log.format_hints, key=parse_version)
        return None, f"not printed; its line formats first appear in sglang {floor}", floor
    return None, "not printed", None


def _check_given_version(given: str) -> None:
    """A LogError naming --sglang-version and its value where it is no version or one older than any kvlab can
    explain (their logs print no memory readings). A release newer than the newest kvlab read is taken: the newest
    rules apply, and the findings say so (``version_unknown``)."""
    shown = given if len(given) <= 40 else given[:37] + "..."
    try:
        known = is_known(given)
    except ValueError as exc:
        raise LogError(f"--sglang-version {shown}: {exc}") from None
    if not known and not is_newer_than_read(given):
        raise LogError(f"--sglang-version {shown}: older than any SGLang version kvlab knows, {KNOWN_RANGE} (releases "
                       f"before {EXPLAINED_SINCE} print no memory readings to explain)")


#: the largest max_total_tokens or context_length kvlab takes from a log (tokens)
MAX_LOG_TOKENS = 10 ** 12


def tp_size_of(log: SGLangStartup) -> tuple[int, str]:
    """(the TP size, where it was read): server_args / the launch command, else the TP ranks the log prints."""
    value, where = log.setting("tp_size")
    if value is not None:
        return _bounded(_int_or(value, None, f"{log.path}: {where}", "tp_size"), 1, MAX_PARALLEL,
                        f"{log.path}: {where}", "tp_size"), where
    seen = 1 + max(r.tp_rank for r in log.ranks.values())
    if seen > MAX_PARALLEL:
        raise LogError(f"{log.where('begin')}: TP rank {seen - 1} is more than kvlab takes (at most "
                       f"{MAX_PARALLEL:,} ranks)")
    return seen, f"{seen} TP rank(s) printed in the log"


def _bounded(value: int | None, low: int, high: int, where: str, name: str) -> int | None:
    """``value`` when in [low, high] (or None), else a LogError naming the file and line it was read from."""
    if value is not None and not low <= value <= high:
        raise LogError(f"{_at(where)}: {name} must be from {low} to {high:,}")
    return value


def _at(where: str) -> str:
    """``log: server_args tp_size=0 (line 1)`` -> ``log:1: server_args tp_size=0`` (a long value cut)."""
    path, _, rest = where.partition(": ")
    m = re.search(r" \(line (\d+)\)$", rest)
    if m:
        path, rest = f"{path}:{m.group(1)}", rest[: m.start()]
    return f"{path}: {rest if len(rest) <= 100 else rest[:97] + '...'}"


def _fraction(log, override, version, rules, tp, device, extra) -> tuple[float, str, bool]:
    if override is not None:
        return override, "--mem-fraction-static", False
    value, where = log.setting("mem_fraction_static")
    if value is not None:
        try:
            fraction = float(value)
        except ValueError:
            raise LogError(f"{log.path}: {where}: mem_fraction_static is not a number") from None
        if not 0 < fraction < 1:  # NaN too
            raise LogError(f"{_at(f'{log.path}: {where}')}: mem_fraction_static must be in (0, 1)")
        return fraction, where, False
    if rules is None:
        raise LogError(f"{log.path}: no mem_fraction_static in the log (no server_args line or --mem-fraction-static "
                       f"on a launch command) and no SGLang version to take its default from: pass "
                       f"--mem-fraction-static F or --sglang-version X")
    default = default_mem_fraction(version or rules, tp, device.smi_mib if device else None,
                                   chunked_prefill_size=_tokens_field_int(log, "chunked_prefill_size"),
                                   speculative=extra["speculative"], dp_attention=extra["dp_attention"])
    return default.value, f"default: {default.rule}", True


def _int_or(value: str | None, default: int | None, where: str, name: str) -> int | None:
    if value in (None, "None"):
        return default
    try:
        return int(value)
    except ValueError:
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise LogError(f"{where}: {name}={shown} is not an integer") from None


def _tokens_field_int(log: SGLangStartup, name: str) -> int | None:
    """An integer from the 'max_total_num_tokens=…, name=…' line, None where the line lacks it; out of its range
    (``_SETTING_RANGES``) a LogError naming the line."""
    number = _int_or(log.tokens_fields.get(name), None, log.where("tokens"), name)
    low, high = _SETTING_RANGES.get(name, (-(10 ** 18), 10 ** 18))
    return _bounded(number, low, high, f"{log.where('tokens')}: {name}={log.tokens_fields.get(name)}", name)


_SETTING_RANGES = {"dp_size": (1, MAX_PARALLEL), "pp_size": (1, MAX_PARALLEL), "page_size": (1, 1_048_576),
                   "max_total_tokens": (1, MAX_LOG_TOKENS), "context_length": (1, MAX_LOG_TOKENS),
                   "context_len": (1, MAX_LOG_TOKENS), "chunked_prefill_size": (-1, MAX_LOG_TOKENS),
                   "speculative_num_steps": (0, MAX_PARALLEL), "speculative_num_draft_tokens": (0, MAX_PARALLEL)}


def _setting_int(log: SGLangStartup, name: str, default: int | None) -> int | None:
    """An integer from server_args or the launch command line, ``default`` where neither sets it; out of its
    range (``_SETTING_RANGES``) a LogError naming the line."""
    value, where = log.setting(name)
    number = _int_or(value, default, f"{log.path}: {where}", name)
    low, high = _SETTING_RANGES.get(name, (-(10 ** 18), 10 ** 18))
    return number if number is default else _bounded(number, low, high, f"{log.path}: {where}", name)


def _kv_bytes(log: SGLangStartup, config: ModelConfig | None, rule, override: str | None) -> tuple[int | None, str]:
    if override not in (None, "", "auto"):
        if override not in OPTION_DTYPE_BYTES:
            raise LogError(f"--kv-cache-dtype {override!r}: expected one of {sorted(OPTION_DTYPE_BYTES)}")
        return OPTION_DTYPE_BYTES[override], f"--kv-cache-dtype {override}"
    if rule.kv_dtype == "fp16":
        return 2, f"sglang {rule.read} hard-codes 2-byte (fp16) KV"
    if log.kv_dtype in TORCH_DTYPE_BYTES:
        return TORCH_DTYPE_BYTES[log.kv_dtype], f"log prints KV dtype {log.kv_dtype}"
    option, where = log.setting("kv_cache_dtype")
    if rule.kv_dtype == "option" and option and option != "auto":
        if option not in OPTION_DTYPE_BYTES:
            raise LogError(f"{log.path}: {where}: unknown kv_cache_dtype {option!r}")
        return OPTION_DTYPE_BYTES[option], where
    if log.model_dtype in TORCH_DTYPE_BYTES:
        return TORCH_DTYPE_BYTES[log.model_dtype], f"kv_cache_dtype auto = model dtype {log.model_dtype} (log)"
    if config is not None:
        return config.kv_dtype_bytes, f"kv_cache_dtype auto = {config.kv_dtype} (config)"
    return None, "unknown"


def _logged_cell(log: SGLangStartup, rank: RankReadings, page: int) -> tuple[int, int, int, str] | None:
    for r in [rank, *log.ranks.values()]:
        total = (r.k_gib + r.v_gib) if r.k_gib is not None else r.kv_gib
        n_rounded = 2 if r.k_gib is not None else 1
        tokens = r.kv_tokens or r.max_total_num_tokens
        if total and tokens:
            est, lo, hi = cell_from_logged_sizes(total, tokens + page, n_rounded)
            return est, lo, hi, (f"from the log's K/V sizes ({total:.2f} GiB over {tokens:,} + {page} slots, line "
                                 f"{r.lines.get('kv')}): {lo:,}–{hi:,} B, no config given")
    return None


def _sglang_cell(log: SGLangStartup, model_config: ModelConfig | None, rule, tp: int, attn_tp: int,
                 kv: tuple[int | None, str], low_rank: RankReadings, page: int) -> tuple[int, int, int, str, int | None]:
    """The cell size: (cell, low, high, where it came from, KV dtype bytes), from the config where one is given,
    else from the log's own K/V sizes."""
    dtype_bytes, dtype_source = kv
    if model_config is None:
        logged = _logged_cell(log, low_rank, page)
        if logged is None:
            raise LogError(f"{log.path}: no cell size: the log prints no 'KV Cache is allocated' sizes and no "
                           f"config was given: pass --model-config CONFIG (a config.json, its folder, or a preset)")
        return (*logged, dtype_bytes)
    if dtype_bytes is None:
        dtype_bytes = model_config.kv_dtype_bytes
    mla_on = {"no": False, "flag": log.setting("enable_mla")[0] == "True",
              "default": log.setting("disable_mla")[0] != "True"}[rule.mla]
    cell = config_cell(model_config, rule, attn_tp, dtype_bytes, mla_on, log.path)
    source = (f"config {model_config.source or model_config.name}: {model_config.attention.upper()} cell at "
              f"{'attention ' if attn_tp != tp else ''}TP {attn_tp}, {dtype_bytes}-byte KV ({dtype_source}), "
              f"sglang {rule.read} formula")
    return cell, cell, cell, source, dtype_bytes


def _logged_tokens(log: SGLangStartup) -> int | None:
    """The smallest pool size in tokens any rank logged, or None."""
    logged = [r.max_total_num_tokens if r.max_total_num_tokens is not None else r.kv_tokens
              for r in log.ranks.values()]
    logged = [t for t in logged if t is not None]
    return min(logged) if logged else None


def _kv_sizes_check(exp: Explanation, log: SGLangStartup, low_rank: RankReadings, pool: Pool) -> None:
    """With a config, also record what the log's own K/V sizes allow (the check without a config)."""
    if exp.model_config is not None and (kv_sizes := _logged_cell(log, low_rank, pool.page_size)) is not None:
        _, kv_lo, kv_hi, _ = kv_sizes
        exp.extra["kv_sizes_cell_range"] = [kv_lo, kv_hi]
        exp.extra["kv_sizes_computed_range"] = list(sglang_tokens_range(
            pool.before_gib, pool.after_gib, pool.mem_fraction_static, kv_lo, kv_hi, pool.page_size,
            pool.max_total_tokens))


def explain_sglang(log: SGLangStartup, *, model_config: ModelConfig | None = None, mem_fraction_static=None,
                   gpu: str | None = None, sglang_version: str | None = None, kv_cache_dtype: str | None = None,
                   what_if=()) -> Explanation:
    with_readings = [r for r in log.ranks.values() if r.before_gib is not None and r.after_gib is not None]
    require_readings(log, with_readings)
    _require_possible_readings(log, with_readings)
    version, version_source, rules = _assumed_version(log, sglang_version)
    tp, tp_source = tp_size_of(log)
    dp = _setting_int(log, "dp_size", 1)
    flags = {"speculative": log.setting("speculative_algorithm")[0] not in (None, "None"),
             "dp_attention": log.setting("enable_dp_attention")[0] == "True"}
    device, gpu_source = resolve_gpu(gpu, log.gpu_name)
    fraction, fraction_source, from_default = _fraction(log, mem_fraction_static, version, rules, tp, device, flags)
    page = _setting_int(log, "page_size", 1)
    cap = _setting_int(log, "max_total_tokens", None)
    before = min(r.before_gib for r in with_readings)
    after = min(r.after_gib for r in with_readings)
    rule = cell_rule(version or rules)
    attn_tp = max(1, tp // dp) if flags["dp_attention"] and rule.attn_tp else tp
    low_rank = min(with_readings, key=lambda r: r.after_gib)
    cell, cell_lo, cell_hi, cell_source, dtype_bytes = _sglang_cell(
        log, model_config, rule, tp, attn_tp, _kv_bytes(log, model_config, rule, kv_cache_dtype), low_rank, page)
    post_load, uncounted = _post_load_terms(log, model_config, version or rules)
    pre_load = _pre_load_terms(log, version or rules, tp)
    used_before = before + sum(t["bytes"] for t in pre_load) / GiB
    used_after = after - sum(t["bytes"] for t in post_load) / GiB
    pool = Pool(used_before, used_after, fraction, cell, page, cap)
    context = _tokens_field_int(log, "context_len")
    exp = Explanation(
        log_path=log.path, engine="sglang", version=version, version_source=version_source, rules_version=rules,
        tp_size=tp, tp_size_source=tp_source, mem_fraction_static=fraction, mem_fraction_static_source=fraction_source,
        avail_before_load_gib=before, avail_after_load_gib=after, cell_size_bytes=cell, cell_size_source=cell_source,
        cell_range=(cell_lo, cell_hi), max_total_num_tokens_logged=_logged_tokens(log),
        max_total_num_tokens_computed=pool.tokens,
        computed_range=sglang_tokens_range(used_before, used_after, fraction, cell_lo, cell_hi, page, cap), pool=pool,
        ranks=[_rank_json(r) for r in log.ranks.values()], gpu=device.name if device else log.gpu_name,
        gpu_source=gpu_source, model=model_config.name if model_config else log.arch,
        context_len=context if context is not None else (model_config.context_len if model_config
                                                                       else None),
        page_size=page, model_config=model_config, device=device, fraction_from_default=from_default,
        kv_dtype_bytes=dtype_bytes, weights_gib=low_rank.before_gib - low_rank.after_gib,
        extra={"pre_load_terms": pre_load, "post_load_terms": post_load, "dp_size": dp, "attention_tp_size": attn_tp,
               "max_total_tokens_cap": cap, "rocm": log.rocm, **flags,
               **({"uncounted_terms": uncounted} if uncounted else {})},
    )
    _kv_sizes_check(exp, log, low_rank, pool)
    exp.assumed = {name: assumed_words(name, {"free_before_load": before, "free_after_load": after}[name])
                   for name in _marks(log.reconstructed, ("free_before_load", "free_after_load"))}
    if log.reconstructed:
        exp.extra["reconstructed"] = log.reconstructed
    exp.findings = sglang_findings(exp, log)
    exp.what_if = apply_what_ifs(exp, what_if)
    return exp


def _marks(marks: dict[str, str], names) -> dict[str, str]:
    """{name: why} for those of ``names`` marked rebuilt on any rank (SGLang takes the minimum over ranks)."""
    out = {}
    for key, why in marks.items():
        name = key.split("@")[0]
        if name in names:
            out.setdefault(name, why)
    return out


def _pre_load_terms(log: SGLangStartup, version: str | None, tp: int) -> list[dict]:
    """GPU memory the version allocates after its own "before" reading (end of init_torch_distributed) and before
    the printed 'Load weight begin', where the source gives its size: that much more was free at SGLang's reading."""
    pp = _setting_int(log, "pp_size", 1) or 1
    size = expert_map_segment_bytes(version, tp * pp)
    if not size:
        return []
    return [{"key": "expert_location_map", "name": "expert-location map (after the reading)", "bytes": size,
             "how": f"compute_initial_expert_location_metadata (sglang 0.4.7.post1/0.4.9 expert_location.py) puts "
                    f"the process's first CUDA tensors on the GPU after init_torch_distributed's reading: one 2 MiB "
                    f"allocator segment = {size:,} B (its lazily loaded kernels are not counted)"}]


def _post_load_terms(log: SGLangStartup, config: ModelConfig | None,
                     version: str | None) -> tuple[list[dict], list[dict]]:
    """GPU memory the version allocates after "Load weight end" and before the reading it sizes the pool with,
    where the source gives its size (sglang_versions.reading_gaps lists the steps that have none); and, where
    the config lacks a field a term needs, what is not counted ({name, missing_fields, message})."""
    if config is None or config.attention != "mha" or not at_least(version, ROPE_RESERVE_SINCE):
        return [], []
    logged_context = _tokens_field_int(log, "context_len")
    context = logged_context or _setting_int(log, "context_length", None) or config.context_len
    rows, rows_from = config.context_len, "max_position_embeddings"
    if rows is None:
        if logged_context is None or _setting_int(log, "context_length", None) is not None:
            message = (f"the config has no 'max_position_embeddings': sglang {version} grows the RoPE cos/sin cache "
                       f"from that many rows to align128(context + 256) rows × {config.head_dim} × 4 B after 'Load "
                       f"weight end' (reserve_rope_cache_for_long_sequences); that term is not counted, so the pool "
                       f"may be a few tokens smaller than shown")
            return [], [{"key": "rope_cache", "name": "RoPE cache expansion before profiling", "missing_fields": ["max_position_embeddings"],
                         "message": message}]
        # SGLang derives context_len from max_position_embeddings where --context-length is not set
        rows, rows_from = logged_context, ("the log's context_len (SGLang's own reading of max_position_embeddings, "
                                           "which the config lacks; --context-length not set)")
    steps = _setting_int(log, "speculative_num_steps", 0)
    draft = _setting_int(log, "speculative_num_draft_tokens", 0)
    size = rope_reserve_for_config(version, config, context, steps, draft, cache_rows=rows)
    if not size:
        return [], []
    return [{"key": "rope_cache", "name": "RoPE cache expansion before profiling", "bytes": size,
             "how": f"reserve_rope_cache_for_long_sequences (sglang utils/common.py): cos/sin cache grown from "
                    f"{rows:,} rows ({rows_from}) to align128(context {context:,} + 256) rows × rotary dim "
                    f"{config.head_dim} × 4 B (FP32) = {size:,} B; its allocator segment is not counted"}], []


def require_readings(log: SGLangStartup, with_readings: list[RankReadings]) -> None:
    """A LogError naming what is missing where no rank printed both memory readings (a cut log, a log of a version
    that printed none, or no start-up log at all)."""
    if with_readings:
        return
    begun = [r for r in log.ranks.values() if r.before_gib is not None]
    if begun:
        r = begun[0]
        raise LogError(f"{log.path}:{r.lines['begin']}: truncated: 'Load weight begin' on {r.label} has no "
                       f"'Load weight end' after it (the log stops at line {log.n_lines}); kvlab needs both readings")
    sized = [r for r in log.ranks.values() if r.max_total_num_tokens is not None or r.kv_tokens is not None]
    if sized:
        where = log.where("tokens") if any("tokens" in r.lines for r in sized) else log.where("kv")
        old = " (SGLang before 0.1.17 printed none)" if log.version and not at_least(log.version, "0.1.17") else ""
        raise NoStartupReadings(f"{where}: no memory readings: the log has the pool size but no 'Load weight begin. avail "
                       f"mem=' / 'Load weight end. ... avail mem=' lines{old}; kvlab needs both to recompute the pool")
    raise NoStartupReadings(f"{log.path}: not an SGLang or vLLM start-up log: none of 'Load weight begin', 'Load weight end', "
                   f"'KV Cache is allocated', 'max_total_num_tokens=' (SGLang) or 'Model loading took', "
                   f"'GPU KV cache size' (vLLM) appears in its {log.n_lines} lines")


def _require_possible_readings(log: SGLangStartup, with_readings: list[RankReadings]) -> None:
    """Refuse a reading no server that went on to start can print (issue 26: ``avail mem=0.00 GB`` was a
    ZeroDivisionError, or a waterfall of negative weights and pools): 0 GiB free before loading weights (they
    were then loaded), or 0 GiB free after loading on a log that goes on to show a KV pool (it was then
    allocated). Every number kvlab computes rests on these readings, so none is printed."""
    for r in with_readings:
        if r.before_gib <= 0:
            end = f"line {r.lines['end']}" if "end" in r.lines else "later"
            raise LogError(f"{_line_of(log, r, 'begin')}: 'Load weight begin' on {r.label} reads avail mem="
                           f"{r.before_gib:.2f} GB, yet the weights were loaded ('Load weight end', {end}): a GPU with "
                           f"no free memory cannot hold them, so this reading is wrong (an edited or damaged log?) "
                           f"and every number computed from it would be meaningless")
    pool = [r for r in log.ranks.values() if (r.max_total_num_tokens or r.kv_tokens or 0) > 0]
    for r in with_readings:
        if r.after_gib <= 0 and pool:
            shown = pool[0]
            key = "tokens" if shown.max_total_num_tokens else "kv"
            tokens = shown.max_total_num_tokens or shown.kv_tokens
            raise LogError(f"{_line_of(log, r, 'end')}: 'Load weight end' on {r.label} reads avail mem="
                           f"{r.after_gib:.2f} GB, yet a KV pool of {tokens:,} tokens was allocated after it "
                           f"({_line_of(log, shown, key)}): with no free memory left it could not have been, so this "
                           f"reading is wrong (an edited or damaged log?) and every number computed from it would "
                           f"be meaningless")


def _line_of(log: SGLangStartup, r: RankReadings, message: str) -> str:
    return f"{log.path}:{r.lines[message]}" if message in r.lines else log.path


def _rank_json(r: RankReadings) -> dict:
    return {"rank": r.label, "avail_before_load_gib": r.before_gib, "avail_after_load_gib": r.after_gib,
            "memory_pool_end_gib": r.pool_end_gib, "max_total_num_tokens": r.max_total_num_tokens,
            "kv_tokens": r.kv_tokens, "lines": r.lines}


def explain_text(text: str, name: str, *, model_config: ModelConfig | None = None, mem_fraction_static=None,
                 gpu=None, sglang_version=None, kv_cache_dtype=None, what_if=()) -> Explanation:
    """Explain a start-up log's ``text`` (SGLang or vLLM, told apart by their messages), called ``name`` in every
    message: a pasted log as well as a file."""
    log = parse_sglang_log(text, name)
    if not log.ranks and looks_like_vllm(text):
        return explain_vllm(parse_vllm_log(text, name), model_config=model_config, gpu=gpu, what_if=what_if)
    return explain_sglang(log, model_config=model_config, mem_fraction_static=mem_fraction_static, gpu=gpu,
                          sglang_version=sglang_version, kv_cache_dtype=kv_cache_dtype, what_if=what_if)


def explain_log(path, *, model_config: ModelConfig | None = None, mem_fraction_static=None, gpu=None,
                sglang_version=None, kv_cache_dtype=None, what_if=()) -> Explanation:
    """Explain the start-up log at ``path`` (SGLang or vLLM, told apart by their messages)."""
    path = Path(path)
    with reading(path):  # a MemoryError names the file (kvlab.input_limits)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            raise LogError(f"{path}: cannot read the log ({exc.strerror or exc})") from None
        return explain_text(text, str(path), model_config=model_config, mem_fraction_static=mem_fraction_static,
                            gpu=gpu, sglang_version=sglang_version, kv_cache_dtype=kv_cache_dtype, what_if=what_if)
