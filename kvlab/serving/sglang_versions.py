"""What differs between SGLang versions for the KV pool: the default ``mem_fraction_static`` and the
cell-size formula. Each rule names the release whose source it was read from (``pip download --no-deps
sglang==X``: ``server_args.py``, ``model_executor/model_runner.py``, ``mem_cache/kv_cache_configurator.py``).

Versions read: 0.1.14, 0.1.17, 0.2.0, 0.2.9, 0.2.15, 0.3.0, 0.3.6, 0.4.0, 0.4.2.post3, 0.4.3.post3, 0.4.5,
0.4.7.post1, 0.4.9, 0.5.0rc0, 0.5.1, 0.5.4, 0.5.10.post1, 0.5.16, 0.5.23. A version between two read ones
gets the rule of the nearest read version at or below it, and the explanation says so.

The pool formula itself is the same in every version read (``profile_max_num_token`` /
``_profile_available_bytes``): ``rest = avail_after_load − avail_before_load × (1 − f)`` in GiB, both
readings the minimum over ranks (``get_available_gpu_memory(distributed=True)``), then
``tokens = int(rest × 2^30) // cell``, capped by ``--max-total-tokens`` and floored to the page.

Those two readings are not the printed "Load weight begin/end" ones: ``before`` is taken at the end of
init_torch_distributed, ``after`` inside profile_max_num_token. ``reading_gaps`` names the steps each version runs
in between; the ones whose size the source gives are terms of the waterfall: ``expert_map_segment_bytes``
(0.4.7.post1, 0.4.9 at world size 1) and ``rope_reserve_bytes`` (0.5.8+).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

READ_VERSIONS = ("0.1.14", "0.1.17", "0.2.0", "0.2.9", "0.2.15", "0.3.0", "0.3.6", "0.4.0", "0.4.2.post3",
                 "0.4.3.post3", "0.4.5", "0.4.7.post1", "0.4.9", "0.5.0rc0", "0.5.1", "0.5.4", "0.5.10.post1",
                 "0.5.16", "0.5.23")

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.?(post|rc|dev|a|b)(\d+))?$")


def parse_version(text: str) -> tuple:
    """``"0.4.2.post3"`` -> (0, 4, 2, 1, 3); rc/dev sort before the release, post after."""
    m = _VERSION.match(str(text).strip())
    if not m:
        raise ValueError(f"not an SGLang version: {str(text)!r:.60} (expected e.g. 0.4.7 or 0.4.2.post3)")
    major, minor, patch, tag, n = m.groups()
    rank = {"dev": -3, "a": -2, "b": -2, "rc": -1, None: 0, "post": 1}[tag]
    return int(major), int(minor), int(patch), rank, int(n or 0)


#: the first release whose start-up log prints the memory readings explain-log needs (0.1.14 printed none): with the
#: newest read release, the range of versions kvlab knows
EXPLAINED_SINCE = "0.1.17"
KNOWN_RANGE = f"{EXPLAINED_SINCE} to {READ_VERSIONS[-1]}"


def is_known(version: str) -> bool:
    """Whether ``version`` lies in the range kvlab read (:data:`KNOWN_RANGE`; the newest one's post releases too)."""
    key = parse_version(version)
    return parse_version(EXPLAINED_SINCE) <= key and key[:3] <= parse_version(READ_VERSIONS[-1])[:3]


def is_newer_than_read(version: str) -> bool:
    """Whether ``version`` is a release after the newest one kvlab read (its rules are then the newest's)."""
    return parse_version(version)[:3] > parse_version(READ_VERSIONS[-1])[:3]


def nearest_read(version: str) -> str:
    """The read version whose rules apply to ``version`` (the nearest read one at or below it)."""
    key = parse_version(version)
    below = [v for v in READ_VERSIONS if parse_version(v) <= key]
    return below[-1] if below else READ_VERSIONS[0]


def at_least(version: str | None, floor: str) -> bool:
    return version is not None and parse_version(version) >= parse_version(floor)


# ---- default mem_fraction_static ---------------------------------------------------------------------

# (first version read with this table, thresholds on tp_size (descending), fraction below the last one)
_TP_TABLES = (
    ("0.1.14", ((8, 0.80), (4, 0.82), (2, 0.85)), 0.90),  # server_args.py __post_init__, same in 0.1.17
    ("0.2.0", ((16, 0.80), (8, 0.84), (4, 0.86), (2, 0.88)), 0.89),
    ("0.2.9", ((16, 0.79), (8, 0.83), (4, 0.85), (2, 0.87)), 0.88),  # same in 0.2.15, 0.3.0
    ("0.3.6", ((16, 0.79), (8, 0.82), (4, 0.85), (2, 0.87)), 0.88),
    ("0.4.0", ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87)), 0.88),  # same in 0.4.2.post3, 0.4.3.post3, 0.4.5
)


@dataclass(frozen=True)
class DefaultFraction:
    value: float
    rule: str  # in words, with the version it was read from
    approximate: bool = False


def _tp_table(read: str, tp: int) -> DefaultFraction:
    table = max((t for t in _TP_TABLES if parse_version(t[0]) <= parse_version(read)),
                key=lambda t: parse_version(t[0]))
    first, steps, last = table
    for threshold, value in steps:
        if tp >= threshold:
            return DefaultFraction(value, f"sglang {first} default by TP size: tp_size {tp} >= {threshold} -> {value}")
    return DefaultFraction(last, f"sglang {first} default by TP size: tp_size {tp} -> {last}")


def _reserved_by_gpu_047(gpu_mib: int, parallel: int) -> float:
    """sglang 0.4.7.post1 server_args.py (same in 0.4.9, 0.5.0rc0, 0.5.1): MiB kept out of the static part."""
    if gpu_mib < 35 * 1024:  # T4, 4080 (< 20 GiB) and A10, L40, 4090 (< 35 GiB) share the formula
        return (2.8 + parallel / 10) * 1024
    if gpu_mib < 90 * 1024:  # H100, A100
        return (9.5 + parallel / 2) * 1024
    if gpu_mib < 160 * 1024:  # H20, H200
        return (12 + parallel / 2) * 1024
    return 32 * 1024  # B200, MI300


def _bands_054(gpu_mib: int, tp: int) -> tuple[int, int]:
    """sglang 0.5.4 / 0.5.10.post1 _handle_gpu_memory_settings: (chunked_prefill_size, cuda_graph_max_bs)."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 2048, (16 if tp < 4 else 80)  # 0.5.10.post1 raised 16 to 24 (small effect: 16 MiB)
    if gpu_mib < 60 * 1024:
        return 4096, (32 if tp < 4 else 160)
    if gpu_mib < 160 * 1024:
        return 8192, (256 if tp < 4 else 512)
    return 16384, 512


def default_mem_fraction(version: str, tp_size: int, gpu_smi_mib: int | None, *, pp_size: int = 1,
                         chunked_prefill_size: int | None = None, speculative: bool = False,
                         dp_attention: bool = False) -> DefaultFraction:
    """The ``mem_fraction_static`` SGLang ``version`` picks when none is given."""
    read = nearest_read(version)
    if parse_version(read) < parse_version("0.4.7.post1"):
        return _tp_table(read, tp_size)
    if gpu_smi_mib is None:
        return DefaultFraction(0.88, f"sglang {read}: GPU memory unknown -> 0.88 (its fallback); the real default "
                                     f"depends on the card's nvidia-smi total: pass --gpu")
    parallel = tp_size * pp_size
    if parse_version(read) < parse_version("0.5.4"):
        reserved = _reserved_by_gpu_047(gpu_smi_mib, parallel)
        reserved += (2 * 1024 if speculative else 0) + (4 * 1024 if dp_attention else 0)
        value = round((gpu_smi_mib - reserved) / gpu_smi_mib, 3)
        return DefaultFraction(value, f"sglang 0.4.7.post1 default by GPU memory: ({gpu_smi_mib} − {reserved:.0f}) / "
                                      f"{gpu_smi_mib} MiB, rounded to 3 decimals -> {value}")
    chunk, max_bs = _bands_054(gpu_smi_mib, tp_size)
    chunk = chunked_prefill_size or chunk
    reserved = 512 + max(chunk, 2048) * 1.5 + max_bs * 2 + parallel / 8 * 1024
    if gpu_smi_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    reserved += 4 * 1024 if speculative else 0
    value = round((gpu_smi_mib - reserved) / gpu_smi_mib, 3)
    return DefaultFraction(
        value, f"sglang 0.5.4/0.5.10.post1 default: reserved = 512 + {max(chunk, 2048)}×1.5 + {max_bs}×2 + "
               f"{parallel}/8×1024 MiB (at least 10 GiB above 60 GiB cards) = {reserved:.0f} MiB; "
               f"({gpu_smi_mib} − {reserved:.0f}) / {gpu_smi_mib} -> {value} (plain path: piecewise CUDA graphs, "
               f"DP attention and 0.5.16+ post-capture sizing add terms kvlab leaves out)", approximate=True)


# ---- cell size rules -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellRule:
    read: str
    mla: str  # "no": MLA models sized as MHA; "flag": only with --enable-mla; "default": unless --disable-mla
    kv_dtype: str  # "fp16": 2 bytes hard-coded; "model": the model dtype; "option": --kv-cache-dtype
    kv_heads: str  # "floor": heads // tp (0.1.x); "max1": max(1, heads // attn_tp)
    attn_tp: bool  # DP attention divides the KV heads by tp / dp (0.4.2.post3+: get_attention_tp_size)


def cell_rule(version: str | None) -> CellRule:
    read = nearest_read(version) if version else READ_VERSIONS[-1]
    v = parse_version(read)
    if v < parse_version("0.2.0"):  # 0.1.17 model_runner: head_num = kv_heads // tp; × 2 × 2 (fp16)
        return CellRule(read, "no", "fp16", "floor", False)
    if v < parse_version("0.2.15"):  # 0.2.0/0.2.9: get_num_kv_heads(tp) × head_dim × layers × 2 × dtype
        return CellRule(read, "no", "model", "max1", False)
    if v < parse_version("0.3.6"):  # 0.2.15/0.3.0: MLA cell only when --enable-mla
        return CellRule(read, "flag", "option", "max1", False)
    return CellRule(read, "default", "option", "max1", v >= parse_version("0.4.2.post3"))


# ---- what the printed readings miss ---------------------------------------------------------------------
#
# The pool formula uses two readings SGLang does not print: ``total`` at the end of init_torch_distributed and
# ``post`` inside profile_max_num_token. kvlab only has "Load weight begin/end". What runs between them was read
# from each wheel; a step is a waterfall term only where its size follows from the version's source and the
# inputs (log + config).

@dataclass(frozen=True)
class ReadingGaps:
    read: str
    total_reading: str  # where the "before" SGLang uses is taken
    post_reading: str  # where the "after" SGLang uses is taken
    before_steps: tuple[str, ...]  # between total_reading and "Load weight begin"
    after_steps: tuple[str, ...]  # between "Load weight end" and post_reading


def reading_gaps(version: str | None) -> ReadingGaps:
    """The unprinted readings of ``version`` and the steps between them and the printed ones.

    Read here: 0.4.5, 0.4.6, 0.4.7.post1, 0.4.9, 0.5.0rc0, 0.5.1, 0.5.4, 0.5.8, 0.5.10.post1, 0.5.23
    (model_executor/model_runner.py, model_runner_kv_cache_mixin.py, eplb/ or managers/expert_location.py,
    utils). Older versions are given 0.4.5's steps (init_torch_distributed, then load_model) unread."""
    read = nearest_read(version) if version else READ_VERSIONS[-1]
    v = parse_version(read)
    total = "init_torch_distributed()'s min_per_gpu_memory (model_executor/model_runner.py)"
    post = "profile_max_num_token()'s available_gpu_memory (model_executor/model_runner.py)"
    no_alloc_after = "dist.monitored_barrier on the CPU group, torchao (off by default), LoRA (off): no GPU allocation"
    cublas = ("the cuBLAS handle and workspace come later (init_cublas runs after init_memory_pool)")
    if v < parse_version("0.4.7.post1"):  # 0.4.5 / 0.4.6: memory-saver adapter, Sampler(), then load_model()
        return ReadingGaps(read, total, post, ("TorchMemorySaverAdapter.create and Sampler(): no GPU allocation",),
                           (no_alloc_after, cublas))
    if v < parse_version("0.5.0rc0"):  # 0.4.7.post1, 0.4.9: ModelConfigForExpertLocation.init_dummy()
        return ReadingGaps(
            read, "init_torch_distributed()'s min_per_gpu_memory (0.4.7.post1 model_executor/model_runner.py:483)",
            "profile_max_num_token()'s available_gpu_memory (0.4.7.post1 model_executor/model_runner.py:802)",
            ("deep_gemm_wrapper.update_deep_gemm_config (CPU only)",
             "TorchMemorySaverAdapter.create (nothing without --enable-memory-saver)",
             "compute_initial_expert_location_metadata (0.4.7.post1 managers/expert_location.py:82-109, 186-220; "
             "0.4.9 eplb/expert_location.py): a model without experts gets init_dummy()'s 1×1 map, moved to the "
             "GPU with pad/count_nonzero on it — in a TP1 run the first CUDA tensors and kernels of the process: a "
             "2 MiB allocator segment plus lazily loaded kernel modules, whose size the source does not give "
             "(0.5.0rc0 and later return None here)",
             "Sampler() (no GPU memory)"),
            (no_alloc_after, cublas))
    before = ("a CUDA stream (0.5.10), the offloader, deep_gemm config, memory-saver adapter, the sampler: no GPU "
              "allocation", "compute_initial_expert_location_metadata (eplb/expert_location.py): None for a "
              "model without experts")
    if not at_least(version or read, "0.5.8"):  # the RoPE step is dated by the version itself, as in rope_reserve_bytes
        return ReadingGaps(read, total, post, before, (no_alloc_after, cublas))
    rope = ("reserve_rope_cache_for_long_sequences (0.5.10.post1 utils/common.py:3700, called at "
            "model_runner.py:1269): the FP32 RoPE cos/sin cache grows to align128(context_len + 256) rows — "
            "counted as a term; its einsum is an outer product (torch's sumproduct_pair → at::mul, no cuBLAS); "
            "the new tensor's allocator segment (torch's caching allocator: a 1–10 MiB tensor takes a 20 MiB "
            "segment, a larger one its size rounded up to 2 MiB, unless a cached free block fits) depends on the "
            "allocator's state and is not counted")
    return ReadingGaps(
        read, "init_torch_distributed()'s reading (0.5.10.post1: pre_model_load_memory, "
              "model_executor/model_runner.py:999; 0.5.8: min_per_gpu_memory)",
        "profile_max_num_token()'s reading (model_executor/model_runner_kv_cache_mixin.py; 0.5.10.post1: "
        "post_model_load_memory, line 144)",
        before, (rope, no_alloc_after + ", configure_kv_cache_dtype", cublas))


ROPE_RESERVE_SINCE = "0.5.8"  # the first read version that grows the RoPE cache after "Load weight end"
ROPE_SAFETY_MARGIN = 256  # environ.py SGLANG_ROPE_CACHE_SAFETY_MARGIN (0.5.10.post1:438, 0.5.23)
ROPE_CACHE_ALIGN = 128  # environ.py SGLANG_ROPE_CACHE_ALIGN (0.5.10.post1:439)
ROPE_SPEC_SAFETY_FACTOR = 2  # environ.py SGLANG_SPEC_EXPANSION_SAFETY_FACTOR (0.5.10.post1:437)


def rope_reserve_bytes(version: str | None, cache_rows: int, context_len: int, rotary_dim: int,
                       spec_steps: int = 0, spec_draft_tokens: int = 0) -> int:
    """GPU bytes reserve_rope_cache_for_long_sequences adds after "Load weight end" (0 before 0.5.8).

    sglang 0.5.10.post1 utils/common.py:3700: reserve = align(context_len + steps × draft × 2 + 256, 128);
    layers/rotary_embedding/base.py:142 _ensure_cos_sin_cache_length(reserve − 1) grows a cache of
    ``cache_rows`` (max_position_embeddings) rows to ((reserve − 1 + 128) // 128) × 128 rows of
    ``rotary_dim`` FP32 values (base.py:71: kept in FP32 on CUDA). get_rope's _ROPE_DICT shares one cache
    across layers, so it grows once. Read in 0.5.10.post1 and 0.5.23 (same margins, FP32 on CUDA); 0.5.8 calls
    it after "Load weight end" too; 0.5.4 has no such step.
    """
    if not at_least(version, ROPE_RESERVE_SINCE):
        return 0
    reserve = context_len + spec_steps * spec_draft_tokens * ROPE_SPEC_SAFETY_FACTOR + ROPE_SAFETY_MARGIN
    reserve = (reserve + ROPE_CACHE_ALIGN - 1) // ROPE_CACHE_ALIGN * ROPE_CACHE_ALIGN
    needed = reserve - 1
    if needed < cache_rows:
        return 0
    new_rows = (needed + ROPE_CACHE_ALIGN) // ROPE_CACHE_ALIGN * ROPE_CACHE_ALIGN
    return (new_rows - cache_rows) * rotary_dim * 4


def rope_reserve_for_config(version: str | None, config, context_len: int | None = None, spec_steps: int = 0,
                            spec_draft_tokens: int = 0, cache_rows: int | None = None) -> int:
    """``rope_reserve_bytes`` for a kvlab ModelConfig: an MHA model's cache starts at its
    max_position_embeddings (``context_len``; ``cache_rows`` where the config lacks it) rows of ``head_dim``
    (full rotary; a partial rotary factor or RoPE scaling is not in the config); MLA models' RoPE classes are
    not counted (0)."""
    if config is None or config.attention != "mha":
        return 0
    rows = config.context_len if config.context_len is not None else cache_rows
    if rows is None:
        raise ValueError(f"{config.source or config.name}: the RoPE cache's rows need max_position_embeddings")
    return rope_reserve_bytes(version, rows, context_len or rows, config.head_dim, spec_steps, spec_draft_tokens)


SMALL_SEGMENT = 2 * 1024 * 1024  # torch c10/cuda/CUDACachingAllocator.cpp kSmallBuffer: allocations ≤ 1 MiB share 2 MiB


def expert_map_segment_bytes(version: str | None, world_size: int) -> int:
    """GPU bytes allocated between SGLang's own "before" reading and the printed 'Load weight begin' that the
    source determines: in 0.4.7.post1 and 0.4.9, compute_initial_expert_location_metadata gives every model (one
    without experts gets ModelConfigForExpertLocation.init_dummy(): 1 layer, 1 expert) a physical-to-logical map
    moved to the GPU plus three small derived tensors (0.4.7.post1 managers/expert_location.py:82-109 and
    186-220), kept for the process's life by set_global_expert_location_metadata. With world size 1,
    init_torch_distributed allocates nothing on the GPU (no pynccl or custom all-reduce buffers), so these are
    the process's first CUDA tensors: one new small-pool segment of 2 MiB. The kernels launched with them are
    loaded lazily and take memory the source does not give: not counted. 0.5.0rc0 and later return None for a
    model without experts (eplb/expert_location.py), 0.4.6 and earlier have no such step; with world size > 1 the
    small pool may already hold a segment with room, so nothing is counted."""
    if version is None or world_size != 1:
        return 0
    read = nearest_read(version)
    if parse_version("0.4.7.post1") <= parse_version(read) < parse_version("0.5.0rc0"):
        return SMALL_SEGMENT
    return 0
