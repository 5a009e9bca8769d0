"""vLLM's KV budget, term by term, as each read version computes it (pure arithmetic on GiB floats).

Read from vLLM's wheels (``pip download --no-deps vllm==X``), kvlab's own words and code:

- **0.6.3 (V0)** ``worker/worker.py::Worker.determine_num_available_blocks``: after ``profile_run()``,
  ``peak = init_free − free_now`` (weights + the profile's activations still cached by torch + non-torch
  growth); ``num_gpu_blocks = (total × util − peak) // block_bytes``. CUDA graphs are captured later
  (``_warm_up_model``), out of the ``total × (1 − util)`` left outside.
- **0.10.1.1 (V1)** ``v1/worker/gpu_worker.py::Worker.determine_available_memory``: ``requested = total ×
  util``; ``available = requested − (weights + torch peak increase + non-torch increase)``
  (``utils::memory_profiling``); the profile run is ``_dummy_run(max_num_batched_tokens)`` then
  ``_dummy_sampler_run`` over ``min(max_num_seqs, tokens)`` requests. CUDA graphs again come later, from the
  headroom. Default util 0.9.
- **0.21.0** (not read: vLLM 0.34.0's own log line says "CUDA graph memory profiling is enabled (default since
  v0.21.0)"): the same, less ``profile_cudagraph_memory()``'s estimate.
- **0.34.0** (today's release): by default the *extensible* KV cache (``v1/worker/extensible_kv_cache.py::
  measure_kv_cache_bytes``), sized after warmup and CUDA graph capture: ``used = init_free − free − committed``;
  ``available = min(requested − used, init_free − used − margin) − transient peak`` with ``margin = max(1 GiB,
  0.75 × transient peak)``; util defaults to 1.0 (0.92 when the extensible cache is off, e.g. an LMCache
  connector sharing the cache through CUDA IPC, and then the 0.21 estimate path applies).

Everywhere: ``tokens = floor(available / (block_size × cell)) × block_size`` (``get_num_blocks``; every layer's
page is ``block_size`` tokens), the minimum over workers, and the cell counts ``max(1, kv_heads // tp)`` heads
per rank (``ModelConfig.get_num_kv_heads``), as SGLang does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvlab.errors import KvlabError
from kvlab.units import GiB


class BudgetError(KvlabError, ValueError):
    """An engine-budget input kvlab cannot use; the message names it."""


@dataclass(frozen=True)
class VllmRule:
    read: str  # the release whose source the rule comes from
    label: str  # in words
    function: str  # file::function the rule mirrors
    default_utilization: float
    cuda_graphs: str  # "headroom": captured after sizing, out of total × (1 − util); "estimated": subtracted; "measured"
    measured_after_warmup: bool = False  # 0.34.0's extensible KV cache
    read_from_wheel: bool = True
    since: str = ""  # the first version the rule is taken to apply to (default: ``read``)


VLLM_RULES = (
    VllmRule("0.6.3", "V0 engine", "worker/worker.py::Worker.determine_num_available_blocks", 0.9, "headroom",
             since="0.0.0"),
    VllmRule("0.10.1.1", "V1 engine, profiled budget", "v1/worker/gpu_worker.py::Worker.determine_available_memory",
             0.9, "headroom", since="0.8.0"),  # V1 became the default engine in 0.8.0
    VllmRule("0.21.0", "V1, CUDA graph memory estimated before sizing",
             "v1/worker/gpu_worker.py::Worker.determine_available_memory (profile_cudagraph_memory)", 0.9,
             "estimated", read_from_wheel=False),
    VllmRule("0.34.0", "extensible KV cache, sized after warmup",
             "v1/worker/extensible_kv_cache.py::measure_kv_cache_bytes", 1.0, "measured", measured_after_warmup=True),
)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(?:post)?(\d+))?")
MARGIN_FLOOR_GIB = 1.0  # KV_CACHE_MARGIN_FLOOR_BYTES on CUDA (0.34.0)
MARGIN_FRACTION = 0.75  # KV_CACHE_MARGIN_FRACTION (0.34.0)


def _key(version: str) -> tuple[int, ...]:
    m = _VERSION.match(str(version).strip())
    if not m:
        # a log's version is read by a pattern that only matches versions: a bad one is the flag's
        raise BudgetError(f"--vllm-version {str(version)[:40]!r}: not a vLLM version (expected e.g. 0.10.1.1 or "
                          f"0.34.0)")
    return tuple(int(g or 0) for g in m.groups())


def vllm_rule(version: str | None, *, extensible: bool | None = None) -> VllmRule:
    """The rule for ``version`` (None: today's, 0.34.0): V0's before 0.8.0, V1's from 0.8.0, the CUDA graph
    estimate from 0.21.0, the extensible KV cache from 0.34.0 (the release read; it may have come earlier).
    ``extensible=False`` on 0.34.0 gives its estimate path (the 0.21.0 rule, util default 0.92)."""
    key = _key(version) if version else _key(VLLM_RULES[-1].read)
    below = [r for r in VLLM_RULES if _key(r.since or r.read) <= key] or [VLLM_RULES[0]]
    rule = below[-1]
    if rule.measured_after_warmup and extensible is False:
        return VllmRule("0.34.0", "estimate path (extensible KV cache off)",
                        "v1/worker/gpu_worker.py::Worker.determine_available_memory", 0.92, "estimated")
    return rule


@dataclass(frozen=True)
class Term:
    """One bar of a budget waterfall: a signed amount in GiB, where it comes from."""

    name: str
    gib: float
    how: str
    measure: str = "relative"  # plotly waterfall: "absolute" (a start), "relative", "total"
    kind: str = "base"  # what it is, across engines: base, weights, activation, non_torch, cuda_graph, budget
    assumed: tuple[str, ...] = ()  # the rebuilt or assumed inputs it rests on, in words

    @property
    def basis(self) -> str:
        return "assumed" if self.assumed else "read"


@dataclass(frozen=True)
class EngineBudget:
    engine: str  # "sglang" | "vllm"
    rule: str  # which version's rule, and the function it mirrors
    terms: tuple[Term, ...]  # starts with an absolute bar, ends with the KV budget (a total)
    cell_size_bytes: int
    granularity_tokens: int  # SGLang's page_size, vLLM's block_size
    tokens: int
    notes: tuple[str, ...] = ()

    @property
    def budget_gib(self) -> float:
        return self.terms[-1].gib

    @property
    def pool_gib(self) -> float:
        return self.tokens * self.cell_size_bytes / GiB

    def to_json(self) -> dict:
        return {"engine": self.engine, "rule": self.rule, "budget_gib": round(self.budget_gib, 4),
                "tokens": self.tokens, "cell_size_bytes": self.cell_size_bytes,
                "granularity_tokens": self.granularity_tokens, "pool_gib": round(self.pool_gib, 4),
                "terms": [{"name": t.name, "gib": round(t.gib, 4), "how": t.how, "basis": t.basis,
                           "assumed": list(t.assumed)} for t in self.terms],
                "notes": list(self.notes)}


def rests_on(terms) -> tuple[str, ...]:
    """The assumed inputs under any of ``terms``, each once, in order."""
    return tuple(dict.fromkeys(a for t in terms for a in t.assumed))


def tokens_in(budget_gib: float, cell_size_bytes: int, block_size: int) -> int:
    """``floor(budget / (block × cell)) × block``: whole blocks, as vLLM's get_num_blocks."""
    if cell_size_bytes <= 0 or block_size <= 0:
        raise BudgetError(f"cell size and block size must be positive, got {cell_size_bytes}, {block_size}")
    if budget_gib <= 0:
        return 0
    return int(budget_gib * GiB) // (block_size * cell_size_bytes) * block_size


@dataclass(frozen=True)
class ActivationEstimate:
    gib: float
    forward_gib: float
    sampler_gib: float
    how: str


def estimate_activation_peak(config, tp_size: int, max_num_batched_tokens: int, max_num_seqs: int) -> ActivationEstimate:
    """kvlab's order-of-magnitude estimate of vLLM's profile-run torch peak on one rank (not vLLM's code).

    Forward pass at ``max_num_batched_tokens`` tokens (T), 16-bit activations: hidden + residual (2·T·H), q/k/v
    and the attention output per rank, and the MLP's largest working set — a dense MLP's gate_up + down
    (3·T·I/tp), or the fused MoE's three caches (T·topk·(3·I_moe/tp + H)). Then the sampler over R = min(max_num_seqs,
    T) requests: bf16 logits, their fp32 copy, the top-k/top-p sort (fp32 values + int64 indices) and the
    probabilities — 22 bytes per vocabulary entry — beside the last hidden states.
    """
    for name, value in (("tp_size", tp_size), ("max_num_batched_tokens", max_num_batched_tokens),
                        ("max_num_seqs", max_num_seqs)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BudgetError(f"{name} must be a positive integer, got {value!r}")
    t, h, b = max_num_batched_tokens, config.hidden_size, 2
    q_heads = max(1, config.num_attention_heads // tp_size)
    kv_heads = 1 if config.attention == "mla" else max(1, config.num_kv_heads // tp_size)
    attention = t * (2 * q_heads + 2 * kv_heads) * config.head_dim * b
    if config.num_experts:
        mlp = t * max(1, config.num_experts_per_tok) * (3 * config.moe_intermediate_size // tp_size + h) * b
    else:
        mlp = t * 3 * (config.intermediate_size // tp_size) * b
    forward = 2 * t * h * b + attention + mlp
    reqs = min(max_num_seqs, t)
    sampler = reqs * config.vocab_size * 22 + reqs * h * b
    peak = max(forward, sampler)
    return ActivationEstimate(peak / GiB, forward / GiB, sampler / GiB,
                              f"kvlab estimate: forward at {t:,} tokens {forward / GiB:.2f} GiB, sampler over "
                              f"{reqs:,} requests × {config.vocab_size:,} vocab {sampler / GiB:.2f} GiB; the larger")


@dataclass(frozen=True)
class Amount:
    """A memory amount in GiB with where it comes from (a log line, the config, an assumption); ``assumed``
    names the assumed or rebuilt inputs it rests on, in words (empty: read or computed from what was read)."""

    gib: float
    source: str
    assumed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.gib, (int, float)) or math.isnan(self.gib) or self.gib < 0:
            raise BudgetError(f"{self.source}: a memory amount must be a non-negative number of GiB, got {self.gib!r}")


def vllm_budget(*, total: Amount, startup: Amount, weights: Amount, activation: Amount, non_torch: Amount,
                cuda_graph: Amount, cell_size_bytes: int, rule: VllmRule, gpu_memory_utilization: float | None = None,
                block_size: int = 16) -> EngineBudget:
    """vLLM's KV budget on one worker under ``rule`` (see the module docstring for each read version)."""
    util = rule.default_utilization if gpu_memory_utilization is None else gpu_memory_utilization
    if not 0 < util <= 1:
        raise BudgetError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    util_how = f"gpu_memory_utilization {util}" + (" (this version's default)" if gpu_memory_utilization is None else "")
    where = f"vllm {rule.read} ({rule.label}): {rule.function}"
    notes = [] if rule.read_from_wheel else [f"rule of vllm {rule.read} from 0.34.0's log message, not read from "
                                             f"its wheel"]
    if rule.read == "0.6.3":
        notes.append("V0 takes the peak as the free memory lost since the worker started, read after the profile run "
                     "without emptying torch's cache: the activation term is the profile's reserved (cached) peak")
    free_at_start = total.gib - startup.gib
    requested = total.gib * util
    terms = [Term("GPU memory", total.gib, f"torch total: {total.source}", "absolute", assumed=total.assumed)]
    used = weights.gib + non_torch.gib
    common = [Term("weights", -weights.gib, weights.source, kind="weights", assumed=weights.assumed),
              Term("non-torch growth", -non_torch.gib, f"NCCL, cuBLAS: {non_torch.source}", kind="non_torch",
                   assumed=non_torch.assumed)]
    if rule.measured_after_warmup:
        used += cuda_graph.gib
        margin = max(MARGIN_FLOOR_GIB, MARGIN_FRACTION * activation.gib)
        by_util, by_device = requested - used, free_at_start - used - margin
        if by_util <= by_device:
            terms.append(Term("left outside", requested - total.gib, f"total × (1 − util), {util_how}"))
        else:
            terms += [Term("in use at start", -startup.gib, f"CUDA context, other processes: {startup.source}",
                           assumed=startup.assumed),
                      Term("sizing margin", -margin, "max(1 GiB, 0.75 × peak activation): extensible_kv_cache.py "
                                                     "KV_CACHE_MARGIN_FLOOR_BYTES / KV_CACHE_MARGIN_FRACTION",
                           assumed=activation.assumed)]
        terms += common + [Term("CUDA graphs", -cuda_graph.gib, f"measured after capture: {cuda_graph.source}",
                                kind="cuda_graph", assumed=cuda_graph.assumed),
                           Term("peak activation", -activation.gib, f"kept free: {activation.source}",
                                kind="activation", assumed=activation.assumed)]
    else:
        if free_at_start < requested:
            notes.append(f"vLLM refuses to start: free memory at start {free_at_start:.2f} GiB is less than "
                         f"total × util = {requested:.2f} GiB ('Free memory on device ... is less than desired GPU "
                         f"memory utilization')")
        terms.append(Term("left outside", requested - total.gib, f"total × (1 − util), {util_how}"))
        terms += common + [Term("peak activation", -activation.gib, f"profile run: {activation.source}",
                                kind="activation", assumed=activation.assumed)]
        if rule.cuda_graphs == "estimated":
            terms.append(Term("CUDA graphs", -cuda_graph.gib, f"estimated before sizing: {cuda_graph.source}",
                              kind="cuda_graph", assumed=cuda_graph.assumed))
        else:
            notes.append(f"CUDA graphs are captured after sizing (vllm {rule.read}): their "
                         f"{cuda_graph.gib:.2f} GiB come out of the {total.gib - requested:.2f} GiB left outside")
    budget = sum(t.gib for t in terms)
    if budget <= 0:
        notes.append("vLLM refuses to start: 'No available memory for the cache blocks' (raise "
                     "gpu_memory_utilization, lower max_num_seqs / max_num_batched_tokens, or add GPUs)")
    terms.append(Term("KV budget", budget, f"'Available KV cache memory': {where}", "total", "budget",
                      rests_on(terms)))
    tokens = tokens_in(budget, cell_size_bytes, block_size)
    return EngineBudget("vllm", where, tuple(terms), cell_size_bytes, block_size, tokens, tuple(notes))
