"""Read a vLLM start-up log and recompute its KV pool from "Available KV cache memory".

Strings read from vLLM's wheels (``pip download --no-deps vllm==X``):

- 0.6.3 (V0): ``Loading model weights took %.4f GB`` (model_runner.py), ``# GPU blocks: %d, # CPU blocks: %d``
  (gpu_executor.py), ``Maximum concurrency for %s tokens per request: %.2fx``;
- 0.10.1.1 (V1): ``Model loading took %.4f GiB and %.6f seconds`` (gpu_model_runner.py),
  ``Available KV cache memory: %.2f GiB`` (gpu_worker.py), ``GPU KV cache size: %s tokens`` and
  ``Maximum concurrency for %s tokens per request: %.2fx`` (kv_cache_utils.py), V0's
  ``Memory profiling takes ...`` block (worker.py);
- 0.34.0: ``Model loading took %s GiB memory and %.6f seconds``, ``Available KV cache memory: %s GiB`` (%s =
  ``round(x, 2)``), ``GPU KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx``.

vLLM V1 sizes the pool as ``num_blocks = int(available // page_size // num_layers)`` with ``page_size =
block_size × per-layer bytes per token``, i.e. ``tokens = floor(available / (block_size × cell)) × block_size``
(``get_num_blocks``, ``kv_cache_utils.py``); ``cell`` counts KV heads per rank as SGLang does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvlab.serving.pool import HALF_STEP
from kvlab.serving.sglang_log import LogError
from kvlab.units import GiB

_MARKERS = ("Model loading took", "Loading model weights took", "Available KV cache memory", "GPU KV cache size",
            "# GPU blocks:", "vLLM API server version", "Initializing a V1 LLM engine")
_WORKER = re.compile(r"\((?:VllmWorker|Worker)[^)]*?rank=(\d+)[^)]*\)|\(Worker_TP(\d+)[^)]*\)")
_PATTERNS = {
    "weights": re.compile(r"(?:Model loading took|Loading model weights took) (\d+(?:\.\d+)?) (?:GiB|GB)"),
    "available": re.compile(r"Available KV cache memory: (\d+(?:\.\d+)?) GiB"),
    "tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
    "blocks": re.compile(r"# GPU blocks: (\d+)"),
    "concurrency": re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: (\d+(?:\.\d+)?)x"),
    "version": re.compile(r"(?:vLLM API server version|LLM engine \(v|vLLM version:?)\s*v?(\d+\.\d+\.\d+(?:\.\w+)?)"),
    "tp": re.compile(r"tensor_parallel_size['\"]?[=:]\s*(\d+)"),
    "util": re.compile(r"gpu_memory_utilization['\"]?[=:]\s*(\d*\.\d+)|gpu_memory_utilization \((\d*\.\d+)\)"),
    "block": re.compile(r"\bblock_size['\"]?[=:]\s*(\d+)"),
    "kv_rest": re.compile(r"the rest of the memory reserved for KV Cache is (\d+(?:\.\d+)?)GiB"),
}


@dataclass
class VLLMStartup:
    path: str
    version: str | None = None
    tp_size: int | None = None
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    weights_gib: dict[int, float] = field(default_factory=dict)  # worker rank -> GiB
    available_gib: dict[int, float] = field(default_factory=dict)
    tokens: int | None = None
    blocks: int | None = None
    max_model_len: int | None = None
    lines: dict[str, int] = field(default_factory=dict)


def looks_like_vllm(text: str) -> bool:
    return any(marker in text for marker in _MARKERS)


def parse_vllm_log(text: str, path: str = "<log>") -> VLLMStartup:
    log = VLLMStartup(path)
    for number, line in enumerate(text.splitlines(), start=1):
        worker = _WORKER.search(line)
        where = f"{path}:{number}"
        rank = _reading(worker.group(1) or worker.group(2), where, "worker rank", int, 1 << 20) if worker else 0
        for name, pattern in _PATTERNS.items():
            m = pattern.search(line)
            if not m:
                continue
            log.lines.setdefault(name, number)
            if name == "weights":
                log.weights_gib[rank] = _reading(m.group(1), where, "weights GiB", float)
            elif name in ("available", "kv_rest"):
                log.available_gib.setdefault(rank, _reading(m.group(1), where, "available GiB", float))
            elif name == "tokens":
                log.tokens = _reading(m.group(1), where, "KV cache tokens", int)
            elif name == "blocks":
                log.blocks = _reading(m.group(1), where, "KV cache blocks", int)
            elif name == "concurrency":
                log.max_model_len = _reading(m.group(1), where, "tokens per request", int)
            elif name == "version" and log.version is None:
                log.version = m.group(1)
            elif name == "tp" and log.tp_size is None:
                log.tp_size = _reading(m.group(1), where, "tensor_parallel_size", int, 1 << 16, minimum=1)
            elif name == "util" and log.gpu_memory_utilization is None:
                log.gpu_memory_utilization = _reading(m.group(1) or m.group(2), where, "gpu_memory_utilization", float, 1)
            elif name == "block" and log.block_size is None:
                log.block_size = _reading(m.group(1), where, "block_size", int, 1 << 20, minimum=1)
    return log


def _reading(text: str, where: str, what: str, kind: type, limit: float = 1e12, minimum: float = 0):
    """A number the log printed, as ``kind``, in [minimum, limit]; anything else (400 digits, a zero block size)
    is a :class:`LogError` naming file:line, the reading and the value."""
    try:
        value = kind(text.replace(",", ""))
    except ValueError:
        value = None
    if value is None or not minimum <= value <= limit:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise LogError(f"{where}: {what} {shown!r} is not a reading kvlab can use (expected a number in "
                       f"[{minimum:g}, {limit:g}])")
    return value


def explain_vllm(log: VLLMStartup, *, model_config=None, gpu=None, what_if=()):
    from kvlab.serving.explain import resolve_gpu
    from kvlab.serving.result import Explanation

    if what_if:
        raise LogError(f"{log.path}: --what-if is implemented for SGLang logs only")
    if not log.available_gib:
        raise LogError(f"{log.path}: no 'Available KV cache memory: X GiB' line (vLLM V1 prints it at start-up; "
                       f"a V0 log needs the 'Memory profiling' block): kvlab has no KV budget to recompute from")
    logged = log.tokens if log.tokens is not None else None
    block = log.block_size or 16
    if logged is None and log.blocks is not None:
        logged = log.blocks * block
    avail = min(log.available_gib.values())
    if not 0 < avail < 1e6:  # GiB: a zero, negative or absurd reading leaves no pool to recompute
        raise LogError(f"{log.path}: 'Available KV cache memory: {avail} GiB' is not a pool kvlab can recompute "
                       f"(expected a positive size under a million GiB)")
    tp = log.tp_size or 1 + max(log.available_gib)
    if model_config is not None:
        heads = max(1, model_config.num_kv_heads // tp)
        if model_config.attention == "mla":
            cell = (model_config.kv_lora_rank + model_config.qk_rope_head_dim) * model_config.num_layers * \
                model_config.kv_dtype_bytes
        else:
            cell = heads * (model_config.head_dim + (model_config.v_head_dim or model_config.head_dim)) * \
                model_config.num_layers * model_config.kv_dtype_bytes
        cell_lo = cell_hi = cell
        source = f"config {model_config.source or model_config.name} at TP {tp}, {model_config.kv_dtype} KV"
    elif logged:
        cell = round(avail * GiB / logged)
        if cell < 1:
            raise LogError(f"{log.path}: {avail} GiB of KV memory for {logged:,} tokens is under one byte per token: "
                           f"the log's readings disagree")
        cell_lo, cell_hi = int((avail - HALF_STEP) * GiB // (logged + block)), int((avail + HALF_STEP) * GiB // logged)
        source = "from the log's available KV memory over its token count (no config given: only a consistency check)"
    else:
        raise LogError(f"{log.path}: no pool size in the log and no config: pass --model-config CONFIG")
    tokens = int(avail * GiB // (block * cell)) * block
    lo = int((avail - HALF_STEP) * GiB // (64 * cell_hi)) * 64 if log.block_size is None else \
        int((avail - HALF_STEP) * GiB // (block * cell_hi)) * block
    hi = int((avail + HALF_STEP) * GiB // cell_lo) if log.block_size is None else \
        int((avail + HALF_STEP) * GiB // (block * cell_lo)) * block
    device, gpu_source = resolve_gpu(gpu, None)
    weights = min(log.weights_gib.values()) if log.weights_gib else None
    terms = [{"name": "model weights (per worker)", "gib": weights, "how": "'Model loading took'"},
             {"name": "available KV cache memory", "gib": avail, "how": "requested − non-KV memory (vLLM's profile)"},
             {"name": "KV pool", "gib": round(tokens * cell / GiB, 4), "how": f"{tokens:,} tokens × {cell:,} B"}]
    exp = Explanation(
        log_path=log.path, engine="vllm", version=log.version, version_source="log" if log.version else "not printed",
        rules_version=None, tp_size=tp, tp_size_source="log config" if log.tp_size else "workers printed",
        mem_fraction_static=None, mem_fraction_static_source="n/a (vLLM uses gpu_memory_utilization)",
        avail_before_load_gib=None, avail_after_load_gib=None, cell_size_bytes=cell, cell_size_source=source,
        cell_range=(cell_lo, cell_hi), max_total_num_tokens_logged=logged, max_total_num_tokens_computed=tokens,
        computed_range=(lo, hi), gpu=device.name if device else None, gpu_source=gpu_source,
        model=model_config.name if model_config else None, context_len=log.max_model_len, page_size=block,
        model_config=model_config, device=device,
        extra={"gpu_memory_utilization": log.gpu_memory_utilization, "available_kv_cache_gib": avail,
               "weights_gib": weights, "block_size": block,
               "block_size_source": "log" if log.block_size else "assumed 16 (range allows 1-64)", "terms": terms},
    )
    if exp.consistent is False:
        exp.findings.append({"id": "outside_interval", "severity": "warning", "message":
                             f"logged {logged:,} tokens is outside the {lo:,}–{hi:,} the available KV memory allows "
                             f"with this cell size: the config, KV dtype or TP may not match the served model"})
    return exp


def render_vllm_log(version: str, *, weights_gib: float, available_gib, tokens: int, max_model_len: int,
                    tp_size: int = 1, gpu_memory_utilization: float = 0.9) -> str:
    """A vLLM start-up excerpt in the format of 0.10.1.1 (V1, separate lines) or 0.34.0 (one line).
    ``available_gib`` is one value or one per worker."""
    per_worker = list(available_gib) if isinstance(available_gib, (list, tuple)) else [available_gib] * tp_size
    stamp = "INFO 01-02 03:04:05"
    lines = [f"{stamp} [api_server.py:1805] vLLM API server version {version}",
             f"{stamp} [utils.py:326] non-default args: {{'tensor_parallel_size': {tp_size}, "
             f"'gpu_memory_utilization': {gpu_memory_utilization}}}"]
    concurrency = tokens / max_model_len
    for rank in range(tp_size):
        who = f"(VllmWorker rank={rank} pid={100 + rank}) " if tp_size > 1 else ""
        if version.startswith("0.10"):
            lines.append(f"{who}{stamp} [gpu_model_runner.py:2007] Model loading took {weights_gib:.4f} GiB and "
                         f"3.141593 seconds")
            lines.append(f"{who}{stamp} [gpu_worker.py:276] Available KV cache memory: {per_worker[rank]:.2f} GiB")
        else:
            lines.append(f"{who}{stamp} [model_runner.py:442] Model loading took {round(weights_gib, 2)} GiB memory "
                         f"and 3.141593 seconds")
            lines.append(f"{who}{stamp} [gpu_worker.py:796] Available KV cache memory: {round(per_worker[rank], 2)} GiB")
    if version.startswith("0.10"):
        lines += [f"{stamp} [kv_cache_utils.py:849] GPU KV cache size: {tokens:,} tokens",
                  f"{stamp} [kv_cache_utils.py:853] Maximum concurrency for {max_model_len:,} tokens per request: "
                  f"{concurrency:.2f}x"]
    else:
        lines.append(f"{stamp} [kv_cache_utils.py:1170] GPU KV cache size: {tokens:,} tokens, Maximum concurrency "
                     f"for {max_model_len:,} tokens per request: {concurrency:.2f}x")
    return "\n".join(lines) + "\n"
