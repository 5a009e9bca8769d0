"""Read a vLLM start-up log (and write one, for the examples); :mod:`kvlab.serving.vllm_explain` recomputes its KV
pool from "Available KV cache memory".

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

from kvlab.serving.provenance import marker_line, parse_reconstructed
from kvlab.serving.sglang_log import LogError

_MARKERS = ("Model loading took", "Loading model weights took", "Available KV cache memory", "GPU KV cache size",
            "# GPU blocks:", "vLLM API server version", "Initializing a V1 LLM engine")
_WORKER = re.compile(r"\((?:VllmWorker|Worker)[^)]*?rank=(\d+)[^)]*\)|\(Worker_TP(\d+)[^)]*\)")
_PATTERNS = {
    "weights": re.compile(r"(?:Model loading took|Loading model weights took) (\d+(?:\.\d+)?) (?:GiB|GB)"),
    "available": re.compile(r"Available KV cache memory: (\d+(?:\.\d+)?) GiB"),
    "tokens": re.compile(r"KV cache size: (\d{1,3}(?:,\d{3})+|\d+) tokens"),  # vLLM prints {:,}
    "blocks": re.compile(r"# GPU blocks: (\d+)"),
    "concurrency": re.compile(r"Maximum concurrency for (\d{1,3}(?:,\d{3})+|\d+) tokens per request: (\d+(?:\.\d+)?)x"),
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
    reconstructed: dict[str, str] = field(default_factory=dict)  # kvlab.serving.provenance: rebuilt readings
    # A log holding several server starts (a server restarted, its output appended to one file): a "vLLM API server
    # version" line after the first pool reading begins a new start, and the last start is read (as for SGLang logs).
    start_line: int = 1
    earlier_starts: list[tuple[int, int]] = field(default_factory=list)  # (first, last line) of each set aside
    # a reading printed again within one start with another value: (who, message, line kept, line set aside); the
    # first is kept
    repeats: list[tuple[str, str, int, int]] = field(default_factory=list)
    _seen: dict = field(default_factory=dict, repr=False)  # (reading, rank) -> (line, value) within this start


def looks_like_vllm(text: str) -> bool:
    return any(marker in text for marker in _MARKERS)


def parse_vllm_log(text: str, path: str = "<log>") -> VLLMStartup:
    log = VLLMStartup(path)
    for number, line in enumerate(text.splitlines(), start=1):
        worker = _WORKER.search(line)
        where = f"{path}:{number}"
        rank = _reading(worker.group(1) or worker.group(2), where, "worker rank", int, 1_000_000) if worker else 0
        if _START in line and log._seen:
            _new_start(log, number)
        for name, pattern in _PATTERNS.items():
            m = pattern.search(line)
            if not m:
                _unread(name, line, where)
                continue
            log.lines.setdefault(name, number)
            if name in _POOL_READINGS:
                value = _reading(m.group(1), where, *_POOL_READINGS[name])
                if not _first(log, name, rank, number, value):
                    continue
                if name == "weights":
                    log.weights_gib[rank] = value
                elif name in ("available", "kv_rest"):
                    log.available_gib.setdefault(rank, value)
                elif name == "tokens":
                    log.tokens = value
                else:
                    log.blocks = value
            elif name == "concurrency":
                log.max_model_len = _reading(m.group(1), where, "tokens per request", int)
            elif name == "version" and log.version is None:
                log.version = m.group(1)
            elif name == "tp" and log.tp_size is None:
                log.tp_size = _reading(m.group(1), where, "tensor_parallel_size", int, 1 << 16, minimum=1)
            elif name == "util" and log.gpu_memory_utilization is None:
                log.gpu_memory_utilization = _reading(m.group(1) or m.group(2), where, "gpu_memory_utilization", float, 1)
            elif name == "block" and log.block_size is None:
                log.block_size = _reading(m.group(1), where, "block_size", int, 1_000_000, minimum=1)
    log.reconstructed = parse_reconstructed(text, path)
    return log


_START = "vLLM API server version"  # printed once as `vllm serve` starts
_POOL_READINGS = {"weights": ("weights GiB", float), "available": ("available GiB", float),
                  "kv_rest": ("available GiB", float), "tokens": ("KV cache tokens", int),
                  "blocks": ("KV cache blocks", int)}
_MESSAGE = {"weights": "Model loading took", "available": "Available KV cache memory",
            "kv_rest": "reserved for KV Cache", "tokens": "GPU KV cache size", "blocks": "# GPU blocks"}


# vLLM's own messages for the readings a pool is recomputed from (and the context length): a line carrying one
# without a number kvlab can read is an error naming the line, never skipped (as for an SGLang log's messages)
_ANCHORS = {"weights": ("Model loading took", "Loading model weights took"), "available": ("Available KV cache memory",),
            "kv_rest": ("reserved for KV Cache is",), "tokens": ("GPU KV cache size",), "blocks": ("# GPU blocks:",),
            "concurrency": ("Maximum concurrency for",)}


def _unread(name: str, line: str, where: str) -> None:
    """A LogError naming ``where`` if ``line`` carries reading ``name``'s message but ``_PATTERNS`` read no number."""
    anchor = next((a for a in _ANCHORS.get(name, ()) if a in line), None)
    if anchor is not None:
        raise LogError(f"{where}: '{anchor}' line without a readable number: {line.strip()[:160]!r}")


def _new_start(log: VLLMStartup, number: int) -> None:
    """Line ``number`` starts the server again: set aside everything read from the current start."""
    log.earlier_starts.append((log.start_line, number - 1))
    log.start_line = number
    log.version = log.tp_size = log.gpu_memory_utilization = log.block_size = None
    log.tokens = log.blocks = log.max_model_len = None
    log.weights_gib, log.available_gib, log.lines, log.repeats, log._seen = {}, {}, {}, [], {}


def _first(log: VLLMStartup, name: str, rank: int, number: int, value) -> bool:
    """Is this the reading's first line (for this worker) in this start? A later one with another value is noted
    in ``repeats`` and not used."""
    key = (_MESSAGE[name], rank)
    if key not in log._seen:
        log._seen[key] = (number, value)
        return True
    kept, seen = log._seen[key]
    if value != seen:
        log.repeats.append((f"worker rank {rank}" if name in ("weights", "available", "kv_rest") else "the engine",
                            _MESSAGE[name], kept, number))
    return False


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
def render_vllm_log(version: str, *, weights_gib: float, available_gib, tokens: int, max_model_len: int,
                    tp_size: int = 1, gpu_memory_utilization: float = 0.9, reconstructed=(),
                    reconstructed_why: str = "") -> str:
    """A vLLM start-up excerpt in the format of 0.10.1.1 (V1, separate lines) or 0.34.0 (one line).
    ``available_gib`` is one value or one per worker; ``reconstructed`` names the readings that were rebuilt
    (a ``# kvlab-reconstructed:`` line at the end, :mod:`kvlab.serving.provenance`)."""
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
    if reconstructed:
        lines.append(marker_line(reconstructed, reconstructed_why))
    return "\n".join(lines) + "\n"
