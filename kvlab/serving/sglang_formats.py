"""SGLang start-up lines as each version prints them, and a renderer that writes a whole start-up log.

The templates are this module's own strings, written from each version's f-strings (read from its wheel;
file and version in the comments). ``render_sglang_log`` is how kvlab makes example logs and test
fixtures: nothing here is copied from anyone's log.

Prefixes (``configure_logger``, ``scheduler.py``): 0.1.x/0.2.0 print ``[gpu_id=N] `` inside the message
and no timestamp; 0.2.9 ``[gpu=N] ``; 0.2.15/0.3.0 ``[HH:MM:SS TPn] ``; 0.3.6-0.4.5 ``[YYYY-MM-DD HH:MM:SS TPn] ``;
0.4.7+ drop ``TPn`` when tp_size is 1 and add ``DPn`` under data parallelism. 0.4.7.post1-0.5.1 add a
``RankZeroFilter`` to the model runner's logger: its INFO lines (load, memory pool) come from rank 0 only.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from kvlab.serving.sglang_versions import nearest_read, parse_version
from kvlab.units import GiB


@dataclass(frozen=True)
class Format:
    read: str  # the release these strings were read from
    prefix: str  # "msg_gpu_id" | "msg_gpu" | "log_hms" | "log_ymd" | "log_ymd_tp_gt1"
    load_end: str
    tokens: str
    init_dist: str = ""
    kv_alloc: str = ""
    kv_alloc_mla: str = ""
    kv_dtype: str = ""
    server_args: bool = True
    rank0_runner: bool = False  # RankZeroFilter on the model runner's logger
    rank0_tokens: bool = False  # only tp rank 0 prints the max_total_num_tokens line


_BEGIN = "Load weight begin. avail mem={before:.2f} GB"  # model_runner.py, every version from 0.1.17
_POOL_END = "Memory pool end. avail mem={end:.2f} GB"
_END_TYPE = "Load weight end. type={arch}, dtype={dtype}, avail mem={after:.2f} GB"
_END_USAGE = _END_TYPE + ", mem usage={usage:.2f} GB."
_END_ELAPSED = "Load weight end. elapsed={elapsed:.2f} s, type={arch}, avail mem={after:.2f} GB, mem usage={usage:.2f} GB."
_TOK_RUNNING = ("max_total_num_tokens={tokens}, max_prefill_tokens={max_prefill}, "
                "max_running_requests={max_running}, context_len={context}")
_TOK_CHUNKED = ("max_total_num_tokens={tokens}, chunked_prefill_size={chunked}, max_prefill_tokens={max_prefill}, "
                "max_running_requests={max_running}, context_len={context}")
_TOK_AVAIL = _TOK_CHUNKED + ", available_gpu_mem={avail:.2f} GB"
_KV_NUM = "KV Cache is allocated. #tokens: {tokens}, K size: {k:.2f} GB, V size: {v:.2f} GB"  # memory_pool.py
_KV_NUM_MLA = "KV Cache is allocated. #tokens: {tokens}, KV size: {kv:.2f} GB"
_INIT = "Init torch distributed ends. mem usage={init:.2f} GB"
_INIT_ELAPSED = "Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={init:.2f} GB"

FORMATS = {f.read: f for f in (
    # 0.1.14 (managers/router) prints no memory readings at all: "Rank 0: max_total_num_token=..."
    Format("0.1.14", "msg_rank", "", "max_total_num_token={tokens}, max_prefill_num_token={max_prefill}, "
           "context_len={context}, ", server_args=False),
    # 0.1.17 managers/controller/model_runner.py + tp_worker.py ("[gpu_id=N] " inside every message)
    Format("0.1.17", "msg_gpu_id", "Load weight end. type={arch}, avail mem={after:.2f} GB",
           "max_total_num_tokens={tokens}, max_prefill_tokens={max_prefill}, context_len={context}, ",
           server_args=False),
    Format("0.2.0", "msg_gpu_id", _END_TYPE, _TOK_RUNNING),  # server.py: logger.info(f"{server_args=}")
    Format("0.2.9", "msg_gpu", _END_TYPE, _TOK_RUNNING),
    Format("0.2.15", "log_hms", _END_TYPE, _TOK_RUNNING),  # utils.configure_logger, datefmt %H:%M:%S
    Format("0.3.0", "log_hms", _END_TYPE, _TOK_RUNNING),
    Format("0.3.6", "log_ymd", _END_TYPE, _TOK_RUNNING),  # datefmt %Y-%m-%d %H:%M:%S
    Format("0.4.0", "log_ymd", _END_TYPE, _TOK_RUNNING),
    Format("0.4.2.post3", "log_ymd", _END_TYPE, _TOK_CHUNKED,
           kv_alloc="KV Cache is allocated. K size: {k:.2f} GB, V size: {v:.2f} GB."),
    Format("0.4.3.post3", "log_ymd", _END_USAGE, _TOK_CHUNKED, init_dist=_INIT, kv_alloc=_KV_NUM),
    Format("0.4.5", "log_ymd", _END_USAGE, _TOK_CHUNKED, init_dist=_INIT, kv_alloc=_KV_NUM),
    Format("0.4.7.post1", "log_ymd_tp_gt1", _END_USAGE, _TOK_AVAIL, init_dist=_INIT, kv_alloc=_KV_NUM,
           kv_alloc_mla=_KV_NUM_MLA, rank0_runner=True),
    Format("0.4.9", "log_ymd_tp_gt1", _END_USAGE, _TOK_AVAIL, init_dist=_INIT, kv_alloc=_KV_NUM,
           kv_alloc_mla=_KV_NUM_MLA, rank0_runner=True),
    Format("0.5.0rc0", "log_ymd_tp_gt1", _END_USAGE, _TOK_AVAIL, init_dist=_INIT, kv_alloc=_KV_NUM,
           kv_alloc_mla=_KV_NUM_MLA, rank0_runner=True),
    Format("0.5.1", "log_ymd_tp_gt1", _END_USAGE, _TOK_AVAIL, init_dist=_INIT, kv_alloc=_KV_NUM,
           kv_alloc_mla=_KV_NUM_MLA, rank0_runner=True),
    Format("0.5.4", "log_ymd_tp_gt1", _END_USAGE, _TOK_AVAIL, init_dist=_INIT, kv_alloc=_KV_NUM,
           kv_alloc_mla=_KV_NUM_MLA, kv_dtype="Using KV cache dtype: {kv_dtype}"),
    Format("0.5.10.post1", "log_ymd_tp_gt1", _END_ELAPSED, _TOK_AVAIL, init_dist=_INIT_ELAPSED, kv_alloc=_KV_NUM,
           kv_alloc_mla=_KV_NUM_MLA, kv_dtype="Using KV cache dtype: {kv_dtype}"),
    Format("0.5.16", "log_ymd_tp_gt1", _END_ELAPSED, _TOK_AVAIL, init_dist=_INIT_ELAPSED,
           kv_alloc="KV Cache is allocated. dtype: {kv_dtype}, #tokens: {tokens}, K size: {k:.2f} GB, V size: {v:.2f} GB",
           kv_alloc_mla="KV Cache is allocated. dtype: {kv_dtype}, #tokens: {tokens}, KV size: {kv:.2f} GB",
           rank0_tokens=True),
    # 0.5.23: memory_pool.py same KV line; init line became "Memory baseline taken" (left out here)
    Format("0.5.23", "log_ymd_tp_gt1", _END_ELAPSED, _TOK_AVAIL,
           kv_alloc="KV Cache is allocated. dtype: {kv_dtype}, #tokens: {tokens}, K size: {k:.2f} GB, V size: {v:.2f} GB",
           kv_alloc_mla="KV Cache is allocated. dtype: {kv_dtype}, #tokens: {tokens}, KV size: {kv:.2f} GB",
           rank0_tokens=True),
)}


def format_for(version: str) -> Format:
    return FORMATS[nearest_read(version)]


def _prefix(fmt: Format, when: datetime.datetime, rank: int | None, tp_size: int, dp_rank: int | None) -> str:
    """The text before the message; rank None = the main process (server_args line)."""
    if fmt.prefix in ("msg_rank", "msg_gpu_id", "msg_gpu"):
        if rank is None:
            return ""
        return {"msg_rank": f"Rank {rank}: ", "msg_gpu_id": f"[gpu_id={rank}] ", "msg_gpu": f"[gpu={rank}] "}[fmt.prefix]
    stamp = when.strftime("%H:%M:%S" if fmt.prefix == "log_hms" else "%Y-%m-%d %H:%M:%S")
    tags = ""
    if rank is not None:
        if dp_rank is not None:
            tags += f" DP{dp_rank}"
        if tp_size > 1 or fmt.prefix != "log_ymd_tp_gt1":
            tags += f" TP{rank}"
    return f"[{stamp}{tags}] "


def server_args_repr(fields: dict) -> str:
    """``ServerArgs(k=v, ...)`` as dataclass repr prints it (strings quoted)."""
    return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def render_sglang_log(version: str, *, before_gib, after_gib, pool_end_gib, tokens: int, context_len: int,
                      cell_size_bytes: int, tp_size: int = 1, page_size: int = 1, mla: bool = False,
                      server_args: dict | None = None, arch: str = "LlamaForCausalLM", dtype: str = "torch.bfloat16",
                      chunked_prefill_size: int = 8192, max_prefill_tokens: int = 16384,
                      max_running_requests: int = 2048, version_line: bool = True,
                      start: datetime.datetime = datetime.datetime(2025, 1, 2, 3, 4, 5)) -> str:
    """A start-up log in ``version``'s format. ``before_gib`` / ``after_gib`` / ``pool_end_gib`` are one value
    or one per TP rank; K/V sizes follow from ``tokens``, ``page_size`` and ``cell_size_bytes``."""
    fmt = format_for(version)
    per_rank = lambda x: list(x) if isinstance(x, (list, tuple)) else [x] * tp_size  # noqa: E731
    before, after, end = per_rank(before_gib), per_rank(after_gib), per_rank(pool_end_gib)
    kv_bytes = (tokens + page_size) * cell_size_bytes  # the pool keeps page_size padding slots
    values = dict(arch=arch, dtype=dtype, kv_dtype=dtype, tokens=tokens, context=context_len,
                  max_prefill=max_prefill_tokens, max_running=max_running_requests, chunked=chunked_prefill_size,
                  k=kv_bytes / 2 / GiB, v=kv_bytes / 2 / GiB, kv=kv_bytes / GiB, elapsed=1.5, init=0.12)
    clock = iter(start + datetime.timedelta(seconds=s) for s in range(10_000))
    lines = []

    def emit(template: str, rank: int | None, **extra) -> None:
        lines.append(_prefix(fmt, next(clock), rank, tp_size, None) + template.format(**values, **extra))

    if fmt.server_args and server_args is not None:
        emit("server_args=" + server_args_repr(server_args).replace("{", "{{").replace("}", "}}"), None)
    elif server_args is not None:  # versions that print no server_args: the launch command the user ran
        flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in server_args.items()
                        if k in ("model_path", "tp_size", "mem_fraction_static") and v is not None)
        lines.append(f"$ python -m sglang.launch_server{flags}")
    runner_ranks = [0] if fmt.rank0_runner else range(tp_size)
    if fmt.init_dist:
        for r in runner_ranks:
            emit(fmt.init_dist, r)
    if fmt.prefix != "msg_rank":
        for r in runner_ranks:
            emit(_BEGIN, r, before=before[r])
        for r in runner_ranks:
            emit(fmt.load_end, r, after=after[r], usage=before[r] - after[r])
        if fmt.kv_dtype:
            emit(fmt.kv_dtype, 0)
        if fmt.kv_alloc:
            for r in range(tp_size):
                emit(fmt.kv_alloc_mla if mla and fmt.kv_alloc_mla else fmt.kv_alloc, r)
        for r in runner_ranks:
            emit(_POOL_END, r, end=end[r])
    for r in ([0] if fmt.rank0_tokens else range(tp_size)):
        emit(fmt.tokens, r, avail=end[r] - 0.09)
    if version_line:
        lines.append(f"sglang: {version}")
    return "\n".join(lines) + "\n"


def default_server_args(version: str, *, tp_size: int, mem_fraction_static: float, page_size: int = 1,
                        kv_cache_dtype: str = "auto", dp_size: int = 1) -> dict:
    """The few ServerArgs fields the explanation reads, in the order a real repr prints them."""
    fields = {"model_path": "org/model", "kv_cache_dtype": kv_cache_dtype, "mem_fraction_static": mem_fraction_static,
              "max_total_tokens": None, "tp_size": tp_size}
    if parse_version(version) >= parse_version("0.4.5"):
        fields["page_size"] = page_size
    fields.update(dp_size=dp_size, speculative_algorithm=None, enable_dp_attention=False)
    return fields
