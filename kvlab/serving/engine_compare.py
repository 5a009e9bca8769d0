"""SGLang and vLLM from the same inputs: both KV budgets term by term, and what the gap between them is made of.

``compare_engines(config, gpu, tp_size, ...)`` takes one model, one GPU and one TP size, and the memory terms
both engines see (:class:`MemoryInputs`: each amount with its source — a log line, the config, an assumption);
``compare_explanation(exp, vllm_log=...)`` takes them from an explained start-up log (an SGLang log gives
the readings before and after loading; a vLLM log gives what loading took and the available KV memory, from
which the profile's activation peak follows).

The two rules (kvlab.serving.pool, kvlab.serving.vllm_budget):

- SGLang: ``rest = f × free_before_load − loaded``: the fraction is of the memory *free before loading*, and
  activations and CUDA graphs live in the ``(1 − f)`` kept out of it — SGLang never measures them;
- vLLM: ``available = util × total − weights − peak activation − non-torch growth [− CUDA graphs]``: the
  utilization is of the card's *total*, and the profiled activation peak is reserved *inside* it, on top of
  the ``(1 − util)`` left outside.

The gap is split by kind of term (base: the fraction's share; weights; activation; non-torch; CUDA graphs)
plus the cell size (KV heads per rank, dtype) and block/page rounding, in tokens that add up to the gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.device.spec import DeviceSpec
from kvlab.model.config import ModelConfig
from kvlab.serving.pool import sglang_tokens
from kvlab.serving.provenance import assumed_words, rebuilt_why
from kvlab.serving.vllm_budget import (
    MARGIN_FLOOR_GIB,
    MARGIN_FRACTION,
    Amount,
    BudgetError,
    EngineBudget,
    Term,
    estimate_activation_peak,
    rests_on,
    vllm_budget,
    vllm_rule,
)
from kvlab.serving.vllm_log import parse_vllm_log
from kvlab.units import GiB

# torch's total where the preset's capacity is nvidia-smi's (torch reports less)
TORCH_TOTAL_MIB = {"h100-80g": (81_090, "torch 'total capacity of 79.19 GiB' on an H100 80GB HBM3 (OOM messages)")}
KINDS = {"base": "fraction / utilization and what they are of", "weights": "weights", "activation":
         "peak activation reserved in the budget", "non_torch": "non-torch growth (NCCL, cuBLAS)",
         "cuda_graph": "CUDA graphs subtracted from the budget"}


@dataclass(frozen=True)
class MemoryInputs:
    """The memory one rank sees, shared by both engines' rules."""

    total: Amount  # torch's total on the card
    startup: Amount  # in use before loading: CUDA context, NCCL communicators, other processes
    weights: Amount  # what loading took, per rank
    activation: Amount  # vLLM's profile-run peak (SGLang keeps its own activations in the 1 − f slack)
    non_torch: Amount  # non-torch growth during vLLM's profile (NCCL buffers, cuBLAS workspace)
    cuda_graph: Amount  # the CUDA graph pool
    sglang_loaded: Amount | None = None  # what SGLang's own log says loading took, where it differs from weights

    @property
    def loaded(self) -> Amount:
        return self.sglang_loaded or self.weights


def torch_total(device: DeviceSpec) -> Amount:
    if device.name in TORCH_TOTAL_MIB:
        mib, source = TORCH_TOTAL_MIB[device.name]
        return Amount(mib / 1024, source)
    return Amount(device.total_bytes / GiB, f"{device.name} preset capacity ({device.source or 'kvlab preset'})")


def vllm_default_batch(device: DeviceSpec) -> tuple[int, int]:
    """``vllm serve``'s defaults (max_num_batched_tokens, max_num_seqs): 8,192 / 1,024 on cards of 70 GiB or
    more other than A100s, else 2,048 / 256 (0.10.1.1 ``engine/arg_utils.py::_set_default_args_v1``)."""
    big = device.total_bytes >= 70 * GiB and "a100" not in device.name.lower()
    return (8192, 1024) if big else (2048, 256)


def estimate_inputs(config: ModelConfig, device: DeviceSpec, tp_size: int, *, max_num_batched_tokens: int | None = None,
                    max_num_seqs: int | None = None) -> MemoryInputs:
    """Every term from the config and the GPU preset (assumptions marked as such); vLLM's batch defaults for the
    card where not given."""
    config.require("the engine comparison (the weights per rank and vLLM's activation peak, from the model's shape)")
    tokens, seqs = vllm_default_batch(device)
    act = estimate_activation_peak(config, tp_size, max_num_batched_tokens or tokens, max_num_seqs or seqs)
    nccl = 0.5 if tp_size > 1 else 0.0
    return MemoryInputs(
        total=torch_total(device),
        startup=Amount(device.non_pytorch_bytes / GiB + nccl,
                       f"assumed: CUDA context {device.context_bytes / GiB:.2f} GiB"
                       + (f" + NCCL communicators {nccl} GiB" if nccl else ""), ("in use at start (kvlab's assumption)",)),
        weights=Amount(config.weight_bytes_per_rank(tp_size) / GiB,
                       f"config {config.name}: {config.weight_dtype} weights at TP {tp_size}"),
        activation=Amount(act.gib, act.how, ("activation peak (kvlab's estimate from the config)",)),
        non_torch=Amount(0.5 if tp_size > 1 else 0.25, "assumed: NCCL buffers and cuBLAS workspace",
                         ("non-torch growth (kvlab's assumption)",)),
        cuda_graph=Amount(0.5, "assumed: a typical CUDA graph pool (vLLM 0.21+ prints its estimate)",
                          ("CUDA graph pool (kvlab's assumption)",)),
    )


def kv_cell(config: ModelConfig, tp_size: int, kv_dtype_bytes: int) -> tuple[int, int]:
    """(cell bytes, KV heads per rank): ``max(1, kv_heads // tp)`` heads per rank in both engines (MLA: one latent)."""
    if config.attention == "mla":
        return (config.kv_lora_rank + config.qk_rope_head_dim) * config.num_layers * kv_dtype_bytes, 1
    heads = max(1, config.num_kv_heads // tp_size)
    v_dim = config.v_head_dim or config.head_dim
    return heads * (config.head_dim + v_dim) * config.num_layers * kv_dtype_bytes, heads


def sglang_budget(mem: MemoryInputs, *, mem_fraction_static: float, cell_size_bytes: int, page_size: int = 1,
                  rule: str = "sglang model_runner.py::profile_max_num_token (every version read)") -> EngineBudget:
    if not 0 < mem_fraction_static < 1:
        raise BudgetError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static!r}")
    before = mem.total.gib - mem.startup.gib
    after = before - mem.loaded.gib
    if before <= 0:
        raise BudgetError(f"{mem.startup.source}: {mem.startup.gib:.2f} GiB in use at start leaves nothing of "
                          f"the {mem.total.gib:.2f} GiB card")
    slack = before * (1 - mem_fraction_static)
    terms = (Term("GPU memory", mem.total.gib, f"torch total: {mem.total.source}", "absolute",
                  assumed=mem.total.assumed),
             Term("in use before loading", -mem.startup.gib, mem.startup.source, assumed=mem.startup.assumed),
             Term("kept out", -slack, f"free before load × (1 − f), mem_fraction_static {mem_fraction_static}: "
                                      f"activations and CUDA graphs live here", assumed=mem.startup.assumed),
             Term("weights", -mem.loaded.gib, f"what loading took: {mem.loaded.source}", kind="weights",
                  assumed=mem.loaded.assumed))
    terms += (Term("KV budget", after - slack, f"rest = after − before × (1 − f): {rule}", "total", "budget",
                   rests_on(terms)),)
    tokens = sglang_tokens(before, after, mem_fraction_static, cell_size_bytes, page_size)
    peak = "assumed" if mem.activation.assumed else "implied by its log"
    notes = (f"activations ({mem.activation.gib:.2f} GiB for vLLM's profile, {peak}) and CUDA graphs are not "
             f"subtracted: they must fit in the {slack:.2f} GiB kept out",)
    return EngineBudget("sglang", rule, terms, cell_size_bytes, page_size, tokens, notes)


@dataclass
class EngineComparison:
    sglang: EngineBudget
    vllm: EngineBudget
    inputs: MemoryInputs
    tp_size: int
    kv_heads: int
    heads_per_rank: int
    kv_dtype_bytes: tuple[int, int]  # (sglang, vllm)
    gap: list[dict] = field(default_factory=list)  # {kind, what, gib, tokens, basis, assumed}: adds up to the gap
    logged: dict = field(default_factory=dict)  # {"sglang": tokens, "vllm": tokens} where a log printed them

    @property
    def ratio(self) -> float | None:
        return self.sglang.tokens / self.vllm.tokens if self.vllm.tokens else None

    def to_json(self) -> dict:
        return {"sglang": self.sglang.to_json(), "vllm": self.vllm.to_json(), "tp_size": self.tp_size,
                "kv_heads": self.kv_heads, "kv_heads_per_rank": self.heads_per_rank,
                "kv_heads_replicated": self.kv_heads < self.tp_size,
                "kv_dtype_bytes": {"sglang": self.kv_dtype_bytes[0], "vllm": self.kv_dtype_bytes[1]},
                "ratio": None if self.ratio is None else round(self.ratio, 4), "gap": self.gap,
                "logged": self.logged,
                "inputs": {k: {"gib": round(getattr(self.inputs, k).gib, 4), "source": getattr(self.inputs, k).source}
                           for k in ("total", "startup", "weights", "activation", "non_torch", "cuda_graph")}}


def cell_words(config: ModelConfig, tp: int, dtypes: tuple[int, int]) -> str:
    """The cell size's terms in words: KV heads per rank (replicated or not) and the two engines' KV dtypes."""
    dtype = f"{dtypes[0]}-byte vs {dtypes[1]}-byte KV"
    if config.attention == "mla":
        return f"cell size: one MLA latent per token and layer, not split by TP; {dtype}"
    kv, heads = config.num_kv_heads, max(1, config.num_kv_heads // tp)
    replicated = f" (replicated {tp // kv}×: {kv} KV heads < {tp} ranks)" if kv < tp else ""
    return f"cell size: {kv} KV heads / TP {tp} = {heads} per rank{replicated}; {dtype}"


def _gap(s: EngineBudget, v: EngineBudget, cell_what: str) -> list[dict]:
    def by_kind(b: EngineBudget, kind: str) -> float:
        return sum(t.gib for t in b.terms if t.kind == kind and t.measure != "total")

    def basis(assumed: tuple[str, ...]) -> dict:
        return {"basis": "assumed" if assumed else "read", "assumed": list(assumed)}

    rows = []
    for kind, what in KINDS.items():
        gib = by_kind(s, kind) - by_kind(v, kind)
        under = rests_on(t for b in (s, v) for t in b.terms if t.kind == kind and t.measure != "total")
        rows.append({"kind": kind, "what": what, "gib": round(gib, 4),
                     "tokens": round(gib * GiB / s.cell_size_bytes), **basis(under if round(gib, 4) else ())})
    cell_tokens = round(v.budget_gib * GiB / s.cell_size_bytes - v.budget_gib * GiB / v.cell_size_bytes) \
        if v.budget_gib > 0 else 0
    rows.append({"kind": "cell", "what": cell_what, "gib": 0.0, "tokens": cell_tokens, **basis(())})
    explained = sum(r["tokens"] for r in rows)
    rows.append({"kind": "rounding", "what": f"page ({s.granularity_tokens}) / block ({v.granularity_tokens}) "
                 f"rounding", "gib": 0.0, "tokens": s.tokens - v.tokens - explained,
                 **basis(rests_on(t for b in (s, v) for t in b.terms if t.measure == "total"))})
    return rows


def compare_engines(config: ModelConfig, device: DeviceSpec, tp_size: int, *, mem_fraction_static: float,
                    gpu_memory_utilization: float | None = None, vllm_version: str | None = None,
                    extensible: bool | None = None, inputs: MemoryInputs | None = None,
                    kv_dtype_bytes: tuple[int, int] | None = None, page_size: int = 1, block_size: int = 16,
                    max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                    sglang_rule: str | None = None) -> EngineComparison:
    """Both engines' KV pools for one model, GPU and TP size; ``inputs`` defaults to :func:`estimate_inputs`."""
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise BudgetError(f"tp_size must be a positive integer, got {tp_size!r}")
    mem = inputs or estimate_inputs(config, device, tp_size, max_num_batched_tokens=max_num_batched_tokens,
                                    max_num_seqs=max_num_seqs)
    dtypes = kv_dtype_bytes or (config.kv_dtype_bytes, config.kv_dtype_bytes)
    s_cell, heads = kv_cell(config, tp_size, dtypes[0])
    v_cell, _ = kv_cell(config, tp_size, dtypes[1])
    s = sglang_budget(mem, mem_fraction_static=mem_fraction_static, cell_size_bytes=s_cell, page_size=page_size,
                      **({"rule": sglang_rule} if sglang_rule else {}))
    rule = vllm_rule(vllm_version, extensible=extensible)
    v = vllm_budget(total=mem.total, startup=mem.startup, weights=mem.weights, activation=mem.activation,
                    non_torch=mem.non_torch, cuda_graph=mem.cuda_graph, cell_size_bytes=v_cell, rule=rule,
                    gpu_memory_utilization=gpu_memory_utilization, block_size=block_size)
    kv_heads = tp_size if config.attention == "mla" else config.num_kv_heads  # MLA: one latent, never split
    return EngineComparison(s, v, mem, tp_size, kv_heads, heads, dtypes, _gap(s, v, cell_words(config, tp_size, dtypes)))


def compare_explanation(exp, *, vllm_log=None, gpu_memory_utilization: float | None = None,
                        vllm_version: str | None = None, max_num_batched_tokens: int | None = None,
                        max_num_seqs: int | None = None) -> EngineComparison:
    """The comparison for an explained SGLang log (its readings and fraction), or for an explained vLLM log (its
    utilization, weights and available memory; SGLang at ``mem_fraction_static`` 0.9 unless given). Takes
    what a ``vllm_log`` (a parsed :class:`~kvlab.serving.vllm_log.VLLMStartup`) printed, too."""
    config, device = exp.model_config, exp.device
    if config is None:
        raise BudgetError(f"{exp.log_path}: the engine comparison needs the model's config (--model-config)")
    if device is None:
        raise BudgetError(f"{exp.log_path}: the engine comparison needs the GPU (--gpu; the log names none)")
    tp = exp.tp_size
    mem = estimate_inputs(config, device, tp, max_num_batched_tokens=max_num_batched_tokens,
                          max_num_seqs=max_num_seqs)
    logged: dict = {}
    fraction, sglang_rule = 0.9, None
    if exp.engine == "sglang":
        where = f"{exp.log_path}: 'Load weight begin/end' readings"
        mem = _replace(mem, startup=Amount(max(mem.total.gib - exp.avail_before_load_gib, 0.0),
                                           f"total − free before load {exp.avail_before_load_gib:.2f} GiB ({where})",
                                           exp.rests_on("free_before_load")),
                       sglang_loaded=Amount(exp.avail_before_load_gib - exp.avail_after_load_gib,
                                            f"free before − after load ({where})",
                                            exp.rests_on("free_before_load", "free_after_load")))
        mem = _replace(mem, weights=mem.sglang_loaded)
        fraction = exp.mem_fraction_static
        sglang_rule = f"sglang {exp.version or exp.rules_version or 'today'}: model_runner.py::profile_max_num_token"
        logged["sglang"] = exp.max_total_num_tokens_logged
        if vllm_log is not None:
            gpu_memory_utilization = gpu_memory_utilization or vllm_log.gpu_memory_utilization
            vllm_version = vllm_version or vllm_log.version
    if exp.engine == "vllm" or vllm_log is not None:
        mem, logged_v = _from_vllm(mem, exp if exp.engine == "vllm" else None, vllm_log, gpu_memory_utilization,
                                   vllm_version)
        logged["vllm"] = logged_v
        if exp.engine == "vllm":
            gpu_memory_utilization = gpu_memory_utilization or exp.extra.get("gpu_memory_utilization")
            vllm_version = vllm_version or exp.version
    dtype = exp.kv_dtype_bytes or config.kv_dtype_bytes
    comparison = compare_engines(config, device, tp, mem_fraction_static=fraction,
                                 gpu_memory_utilization=gpu_memory_utilization, vllm_version=vllm_version,
                                 inputs=mem, kv_dtype_bytes=(dtype, dtype), page_size=exp.page_size if
                                 exp.engine == "sglang" else 1, sglang_rule=sglang_rule)
    comparison.logged = {k: v for k, v in logged.items() if v is not None}
    return comparison


def _replace(mem: MemoryInputs, **changes) -> MemoryInputs:
    import dataclasses

    return dataclasses.replace(mem, **changes)


def _from_vllm(mem: MemoryInputs, exp, log, util, version) -> tuple[MemoryInputs, int | None]:
    """Weights and the activation peak a vLLM log implies: the peak that makes the version's rule give the printed
    "Available KV cache memory" (``util × total − weights − non-torch [− CUDA graphs] − available`` before 0.34.0;
    0.34.0's ``min(...)`` with its margin solved for the peak). The profile's peak and non-torch growth cannot be
    told apart from the printed lines: kvlab keeps its non-torch assumption and gives the rest to the peak."""
    if log is None:
        from pathlib import Path

        log = parse_vllm_log(Path(exp.log_path).read_text(encoding="utf-8", errors="replace"), exp.log_path)
    if not log.available_gib:
        raise BudgetError(f"{log.path}: no 'Available KV cache memory' line: nothing to compare with")
    avail_rank = min(log.available_gib, key=log.available_gib.get)
    avail = log.available_gib[avail_rank]
    avail_assumed = (assumed_words("available", avail),) if rebuilt_why(log.reconstructed, "available",
                                                                        avail_rank) else ()
    rule = vllm_rule(version or log.version)
    util = util or log.gpu_memory_utilization or rule.default_utilization
    if log.weights_gib:
        low = min(log.weights_gib, key=log.weights_gib.get)
        mem = _replace(mem, weights=Amount(log.weights_gib[low], f"{log.path}: 'Model loading took'",
                                           (assumed_words("model_loading", log.weights_gib[low]),)
                                           if rebuilt_why(log.reconstructed, "model_loading", low) else ()))
    used = mem.weights.gib + mem.non_torch.gib
    if rule.cuda_graphs in ("estimated", "measured"):
        used += mem.cuda_graph.gib
    implied = util * mem.total.gib - used - avail
    if rule.measured_after_warmup:  # available = min(util × total − used, free − used − margin) − peak
        room = mem.total.gib - mem.startup.gib - used - avail  # = margin + peak, margin = max(1, 0.75 × peak)
        by_device = room - MARGIN_FLOOR_GIB if room - MARGIN_FLOOR_GIB <= MARGIN_FLOOR_GIB / MARGIN_FRACTION \
            else room / (1 + MARGIN_FRACTION)
        implied = min(implied, by_device)
    # the peak is what is left once the (read or rebuilt) readings and kvlab's non-torch assumption are taken out
    under = tuple(dict.fromkeys(avail_assumed + mem.weights.assumed + mem.non_torch.assumed
                                + (mem.cuda_graph.assumed if rule.cuda_graphs in ("estimated", "measured") else ())
                                + (mem.startup.assumed if rule.measured_after_warmup else ())))
    mem = _replace(mem, activation=Amount(max(implied, 0.0), f"implied by {log.path}: what vllm {rule.read}'s rule "
                                          f"leaves for it, given the available {avail:.2f} GiB", under))
    logged = log.tokens if log.tokens is not None else (log.blocks * (log.block_size or 16) if log.blocks else None)
    return mem, logged
