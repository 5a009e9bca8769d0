"""Explain a vLLM start-up log: its KV pool recomputed from "Available KV cache memory" (read by
:mod:`kvlab.serving.vllm_log`) and the cell size from the config, or from the log's own numbers."""

from __future__ import annotations

from kvlab.serving.findings import start_findings
from kvlab.serving.gpu import resolve_gpu
from kvlab.serving.pool import HALF_STEP
from kvlab.serving.provenance import assumed_words, rebuilt_why
from kvlab.serving.result import Explanation, Finding, WaterfallTerm
from kvlab.serving.sglang_log import LogError
from kvlab.serving.vllm_log import VLLMStartup
from kvlab.units import GiB


def _vllm_cell(log: VLLMStartup, model_config, tp: int, avail: float, logged: int | None,
               block: int) -> tuple[int, int, int, str]:
    """The cell size: (cell, low, high, where it came from), from the config where one is given, else from
    the available KV memory over the logged token count."""
    if model_config is not None:
        heads = max(1, model_config.num_kv_heads // tp)
        if model_config.attention == "mla":
            cell = (model_config.kv_lora_rank + model_config.qk_rope_head_dim) * model_config.num_layers * \
                model_config.kv_dtype_bytes
        else:
            cell = heads * (model_config.head_dim + (model_config.v_head_dim or model_config.head_dim)) * \
                model_config.num_layers * model_config.kv_dtype_bytes
        return cell, cell, cell, f"config {model_config.source or model_config.name} at TP {tp}, " \
                                 f"{model_config.kv_dtype} KV"
    if not logged:
        raise LogError(f"{log.path}: no pool size in the log and no config: pass --model-config CONFIG")
    cell, cell_lo, cell_hi = logged_cell(log, avail, logged, block)
    return cell, cell_lo, cell_hi, ("from the log's available KV memory over its token count (no config given: "
                                    "only a consistency check)")


def logged_cell(log: VLLMStartup, avail: float, logged: int, block: int) -> tuple[int, int, int]:
    """(cell, low, high): the bytes per token the log's available KV memory over its token count allows."""
    cell = round(avail * GiB / logged)
    if cell < 1:
        raise LogError(f"{log.path}: {avail} GiB of KV memory for {logged:,} tokens is under one byte per token: "
                       f"the log's readings disagree")
    return cell, int((avail - HALF_STEP) * GiB // (logged + block)), int((avail + HALF_STEP) * GiB // logged)


def _cell_check(log: VLLMStartup, exp, avail: float, logged: int | None, block: int) -> list[Finding]:
    """With a config: a ``cell_mismatch`` error where its cell is outside what the log's own numbers allow (the
    config contradicts the log: another model, KV dtype or TP)."""
    if exp.model_config is None or not logged:
        return []
    _, lo, hi = logged_cell(log, avail, logged, block)
    if lo <= exp.cell_size_bytes <= hi:
        return []
    return [Finding("cell_mismatch", "error", f"the config gives {exp.cell_size_bytes:,} B per token but the log's "
                    f"available KV memory ({avail:.2f} GiB) over its {logged:,} tokens allows {lo:,}–{hi:,} B: the "
                    f"config contradicts the log (a different model, KV dtype or TP)",
                    {"logged_cell_range": [lo, hi]}, assumed=exp.rests_on("available"))]


def _vllm_assumed(log: VLLMStartup, weights: float | None, avail: float, avail_rank) -> dict[str, str]:
    """{reading: words} for the readings kvlab rebuilt from a damaged log."""
    assumed = {}
    if weights is not None and rebuilt_why(log.reconstructed, "model_loading",
                                           min(log.weights_gib, key=log.weights_gib.get)):
        assumed["model_loading"] = assumed_words("model_loading", weights)
    if rebuilt_why(log.reconstructed, "available", avail_rank):
        assumed["available"] = assumed_words("available", avail)
    return assumed


def _vllm_terms(weights: float | None, avail: float, tokens: int, cell: int, assumed: dict) -> list[WaterfallTerm]:
    """The waterfall: weights, available KV memory and the KV pool, each with the rebuilt readings it rests on."""
    rests = {"weights": ("model_loading",), "available": ("available",), "kv_pool": ("available",)}
    return [WaterfallTerm(key, name, gib, how, tuple(assumed[r] for r in rests[key] if r in assumed))
            for key, name, gib, how in (
                ("weights", "model weights (per worker)", weights, "'Model loading took'"),
                ("available", "available KV cache memory", avail, "requested − non-KV memory (vLLM's profile)"),
                ("kv_pool", "KV pool", round(tokens * cell / GiB, 4), f"{tokens:,} tokens × {cell:,} B"))]


def explain_vllm(log: VLLMStartup, *, model_config=None, gpu=None, what_if=()):
    if what_if:
        raise LogError(f"{log.path}: --what-if is implemented for SGLang logs only")
    if not log.available_gib:
        raise LogError(f"{log.path}: no 'Available KV cache memory: X GiB' line (vLLM V1 prints it at start-up; "
                       f"a V0 log needs the 'Memory profiling' block): kvlab has no KV budget to recompute from")
    logged = log.tokens if log.tokens is not None else None
    block = log.block_size or 16
    if logged is None and log.blocks is not None:
        logged = log.blocks * block
    avail_rank = min(log.available_gib, key=log.available_gib.get)
    avail = log.available_gib[avail_rank]
    if not 0 < avail < 1e6:  # GiB: a zero, negative or absurd reading leaves no pool to recompute
        raise LogError(f"{log.path}: 'Available KV cache memory: {avail} GiB' is not a pool kvlab can recompute "
                       f"(expected a positive size under a million GiB)")
    tp = log.tp_size or 1 + max(log.available_gib)
    cell, cell_lo, cell_hi, source = _vllm_cell(log, model_config, tp, avail, logged, block)
    tokens = int(avail * GiB // (block * cell)) * block
    lo = int((avail - HALF_STEP) * GiB // (64 * cell_hi)) * 64 if log.block_size is None else \
        int((avail - HALF_STEP) * GiB // (block * cell_hi)) * block
    hi = int((avail + HALF_STEP) * GiB // cell_lo) if log.block_size is None else \
        int((avail + HALF_STEP) * GiB // (block * cell_lo)) * block
    device, gpu_source = resolve_gpu(gpu, None)
    weights = min(log.weights_gib.values()) if log.weights_gib else None
    assumed = _vllm_assumed(log, weights, avail, avail_rank)
    terms = _vllm_terms(weights, avail, tokens, cell, assumed)
    exp = Explanation(
        log_path=log.path, engine="vllm", version=log.version, version_source="log" if log.version else "not printed",
        rules_version=None, tp_size=tp, tp_size_source="log config" if log.tp_size else "workers printed",
        mem_fraction_static=None, mem_fraction_static_source="n/a (vLLM uses gpu_memory_utilization)",
        avail_before_load_gib=None, avail_after_load_gib=None, cell_size_bytes=cell, cell_size_source=source,
        cell_range=(cell_lo, cell_hi), max_total_num_tokens_logged=logged, max_total_num_tokens_computed=tokens,
        computed_range=(lo, hi), gpu=device.name if device else None, gpu_source=gpu_source,
        model=model_config.name if model_config else None, context_len=log.max_model_len, page_size=block,
        model_config=model_config, device=device, assumed=assumed,
        extra={"gpu_memory_utilization": log.gpu_memory_utilization, "available_kv_cache_gib": avail,
               **({"reconstructed": log.reconstructed} if log.reconstructed else {}), "weights_gib": weights, "block_size": block,
               "block_size_source": "log" if log.block_size else "assumed 16 (range allows 1-64)", "terms": terms},
    )
    exp.findings.extend(start_findings(
        log, marker="a 'vLLM API server version' line", between="no new 'vLLM API server version' line between",
        why="lines pasted twice, or several engines logging to one file; kvlab uses the first, line {kept}"))
    exp.findings.extend(_cell_check(log, exp, avail, logged, block))
    if exp.consistent is False:
        exp.findings.append(Finding("outside_interval", "warning",
                                    f"logged {logged:,} tokens is outside the {lo:,}–{hi:,} the available KV memory "
                                    f"allows with this cell size: the config, KV dtype or TP may not match the "
                                    f"served model", assumed=exp.rests_on("available")))
    return exp
