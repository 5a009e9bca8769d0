"""Finding 1 as a function: size the KV pool after loading weights, with or without ``gc.collect()``.

The run follows SGLang's start-up order (``ModelRunner``): measure free memory before loading
(``distributed/bootstrap.py::measure_pre_model_load_memory``), load the target (and draft)
weights on every tensor-parallel rank, read free memory again
(``kv_cache_configurator.py::_profile_available_bytes``), turn the difference into a token count,
allocate the KV pool, and check a prompt against the serving limit (``tp_worker.py``). A last
"serving" phase lets the garbage collector run, as it eventually does in a live server, and reads
how much memory then sits idle — the PR's "46.9 GB left idle".
"""

from __future__ import annotations

import contextlib
import gc
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvlab.device import get_devices
from kvlab.device.base import Device
from kvlab.device.budget import KVBudget, NoKVMemoryError, check_fraction, kv_budget
from kvlab.device.measure import MemoryReading, automatic_gc_paused, get_available_gpu_memory
from kvlab.model.config import ModelConfig
from kvlab.model.hf_config import get_model_config
from kvlab.model.loader import LoadedWeights, load_weights
from kvlab.paths import data_dir
from kvlab.units import GiB, MiB

DATA_DIR = data_dir()  # kvlab.paths: the checkout's data/, a wheel's copy or KVLAB_DATA_DIR


@dataclass(frozen=True)
class KVPoolScenario:
    """One serving start-up to reproduce. Build variants with ``dataclasses.replace``."""

    name: str
    device: str  # kvlab device name for every rank, e.g. "sim:h200-80gb-cap"
    tp_size: int
    model: str  # kvlab.model preset
    mem_fraction_static: float
    context_len: int
    draft_layers: int = 0  # EAGLE draft decoder layers (0: no speculative decoding)
    checkpoint_dir: str | None = None  # a safetensors checkpoint (None: shapes only, meta tensors)
    verify_budget_bytes: int | None = None  # staging kept by the loader for its verification
    page_size: int = 1
    prompt_tokens: int = 3034
    description: str = ""

    @property
    def model_config(self) -> ModelConfig:
        return get_model_config(self.model).replace(context_len=self.context_len)


SGLANG_PR_4XH200 = KVPoolScenario(
    name="sglang-pr-4xh200",
    device="sim:h200-80gb-cap",
    tp_size=4,
    model="llama-3.1-70b",
    draft_layers=1,
    mem_fraction_static=0.8,
    context_len=65536,
    verify_budget_bytes=25_840 * MiB,
    prompt_tokens=3034,
    description="""The KV-budget PR's setup: 4×H200 capped to 80 GB each, TP4 + EAGLE draft, --mem-fraction-static 0.8,
context length 65536, and a 3034-token prompt.

The PR names neither the model nor the loader temporaries, so two choices are ours:
- the model is Llama-3.1-70B (bf16, 32.9 GiB of weights per rank under TP4) with a 1-layer EAGLE draft
  (0.46 GiB per rank). Its KV cell is 82,944 B/token per rank (2 KV heads × 256 × 80 layers × 2 B, + 1/80 for
  the draft layer). With gc that leaves a pool of ~330k tokens, within 6% of the PR's 349,377;
- the loader keeps its staging shards for a post-load verification until a budget of 25,840 MiB per rank is
  used — the value that leaves a pool of the PR's order (~1.7k tokens) without gc. The PR's own figures imply
  such a size: 46.9 − 17.0 GB of memory left idle means ~28 GB per GPU was held when it measured.
Everything else follows from the mechanism: real tensors, a real reference cycle, the allocator model's
rounding and segments, and SGLang's arithmetic.""",
)

PR_TOKENS = (1_741, 349_377)  # the PR's max_total_num_tokens without / with gc.collect() (4×H200)


def pr_numbers_note(without_gc_tokens: int, with_gc_tokens: int) -> str:
    """The PR's pool sizes vs this preset's, and why they differ: one text for the CLI, notebook 01 and README."""
    pr_no, pr_gc = PR_TOKENS
    return (
        f"The PR measured {pr_no:,} → {pr_gc:,} tokens; kvlab's {SGLANG_PR_4XH200.name} preset gives "
        f"{without_gc_tokens:,} → {with_gc_tokens:,}. The PR names neither its model nor its loader's temporaries, "
        f"so kvlab assumes Llama-3.1-70B with a 1-layer EAGLE draft (with gc, {abs(1 - with_gc_tokens / pr_gc):.1%} "
        f"{'fewer' if with_gc_tokens < pr_gc else 'more'} tokens than the PR's model) and a "
        f"{SGLANG_PR_4XH200.verify_budget_bytes // MiB:,} MiB loader staging buffer chosen to put the pool "
        f"without gc at the PR's order. The mechanism is the PR's; these two sizes are kvlab's assumptions."
    )


TINY_H100 = KVPoolScenario(
    name="tiny-h100",
    device="sim:h100-80g",
    tp_size=1,
    model="tiny",
    mem_fraction_static=0.88,
    context_len=2048,
    checkpoint_dir=str(DATA_DIR / "tiny-llama"),
    prompt_tokens=1000,
    description="The tiny model from data/tiny-llama on one simulated H100: real bytes, a small-scale finding.",
)

LLAMA8B_L4 = KVPoolScenario(
    name="llama-8b-l4",
    device="sim:l4",
    tp_size=1,
    model="llama-3.1-8b",
    mem_fraction_static=0.9,
    context_len=8192,
    verify_budget_bytes=2 * GiB,
    prompt_tokens=4000,
    description="Llama-3.1-8B on a 24 GB L4 with 2 GiB of loader staging still referenced.",
)

SCENARIO_PRESETS: dict[str, KVPoolScenario] = {s.name: s for s in (SGLANG_PR_4XH200, TINY_H100, LLAMA8B_L4)}


def get_scenario(name: str) -> KVPoolScenario:
    try:
        return SCENARIO_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(sorted(SCENARIO_PRESETS))}") from None


@dataclass
class KVPoolResult:
    scenario: KVPoolScenario
    gc_before_measure: bool
    empty_cache: bool
    mem_fraction_static: float
    prompt_tokens: int
    pre_load: MemoryReading
    reading: MemoryReading  # the post-load reading the budget used
    budget: KVBudget | None  # None when SGLang would refuse to start
    error: str | None  # SGLang's text: the prompt refusal, or the start-up error
    accepted: bool
    weights: list[LoadedWeights]  # rank 0's target (and draft) load reports
    idle_bytes: int  # free memory on rank 0 once serving has run gc (the PR's "left idle")
    timeline: object = field(repr=False)  # pandas DataFrame, rank 0's events

    @property
    def max_total_num_tokens(self) -> int:
        return self.budget.max_total_num_tokens if self.budget else 0

    def to_json(self) -> dict:
        b = self.budget
        return {
            "preset": self.scenario.name,
            "gc_before_measure": self.gc_before_measure,
            "empty_cache": self.empty_cache,
            "mem_fraction_static": self.mem_fraction_static,
            "tp_size": self.scenario.tp_size,
            "device": self.scenario.device,
            "model": self.scenario.model,
            "max_total_num_tokens": b.max_total_num_tokens if b else 0,
            "max_req_input_len": b.max_req_input_len if b else None,
            "pre_model_load_bytes": self.pre_load.free_bytes,
            "available_bytes": self.reading.free_bytes,
            "slack_bytes": b.slack_bytes if b else None,
            "rest_bytes": b.rest_bytes if b else None,
            "cell_size_bytes": self.scenario.model_config.cell_size_bytes(self.scenario.tp_size, self.scenario.draft_layers),
            "kv_pool_bytes": b.kv_pool_bytes if b else 0,
            "idle_bytes": self.idle_bytes,
            "prompt_tokens": self.prompt_tokens,
            "accepted": self.accepted,
            "error": self.error,
        }

    @property
    def weights_bytes(self) -> int:
        """Parameter bytes on rank 0 (target + draft)."""
        return sum(w.weight_bytes for w in self.weights)

    def budget_terms(self) -> list[tuple[str, int]]:
        """The budget as signed byte terms for a waterfall (rank with the least free memory)."""
        weights = self.weights_bytes
        resident = self.pre_load.free_bytes - self.reading.free_bytes
        terms = [
            ("free before load", self.pre_load.free_bytes),
            ("weights", -weights),
            ("still referenced / cached", -(resident - weights)),
            ("slack (1 − f)", -int(self.pre_load.free_bytes * (1 - self.mem_fraction_static))),
        ]
        return terms


def _load_rank(device: Device, scenario: KVPoolScenario, rank: int) -> list[LoadedWeights]:
    config = scenario.model_config
    reports = []
    with device.phase("weights"):
        reports.append(
            load_weights(
                device, config, tp_rank=rank, tp_size=scenario.tp_size,
                checkpoint_dir=scenario.checkpoint_dir, verify_budget_bytes=scenario.verify_budget_bytes,
            )
        )
    if scenario.draft_layers:
        with device.phase("draft weights"):
            reports.append(
                load_weights(device, config.eagle_draft(scenario.draft_layers), tp_rank=rank, tp_size=scenario.tp_size)
            )
    return reports


def _allocate_kv_pool(device: Device, config: ModelConfig, tokens: int, scenario: KVPoolScenario):
    """K and V buffers per layer, ``tokens + page_size`` rows as SGLang's MHATokenToKVPool."""
    rows = tokens + scenario.page_size
    buffers = []
    with device.phase("kv pool"):
        if config.attention == "mla":
            for _ in range(config.num_layers):
                buffers.append(device.empty((rows, 1, config.kv_lora_rank + config.qk_rope_head_dim), label="kv"))
        else:
            heads = config.kv_heads_per_rank(scenario.tp_size)
            layers = config.num_layers + scenario.draft_layers
            for _ in range(layers):
                buffers.append(device.empty((rows, heads, config.head_dim), label="k_buffer"))
                buffers.append(device.empty((rows, heads, config.head_dim), label="v_buffer"))
    return buffers


def _as_reading(value: MemoryReading | int, ranks: list[Device]) -> MemoryReading:
    """A custom measurement's result as a ``MemoryReading`` (an int is the free bytes)."""
    if isinstance(value, MemoryReading):
        return value
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"measure(ranks) returned {value!r}: return the free bytes (an int) or a MemoryReading")
    infos = [d.mem_get_info() for d in ranks]
    return MemoryReading(
        free_bytes=int(value), total_bytes=min(t for _, t in infos), per_rank_free_bytes=tuple(f for f, _ in infos),
        allocated_bytes=tuple(d.memory_allocated() for d in ranks), reserved_bytes=tuple(d.memory_reserved() for d in ranks),
        gc_collected=False, empty_cache=False)


def _post_load_reading(ranks: list[Device], measure, gc_before_measure: bool, empty_cache: bool) -> MemoryReading:
    """The free memory after the load: ``measure``'s reading, else SGLang's (its collection in a phase of its own)."""
    if measure is not None:
        return _as_reading(measure(list(ranks)), ranks)
    with contextlib.ExitStack() as phases:  # the collection's frees land in a phase of their own
        for d in ranks if gc_before_measure else ():
            phases.enter_context(d.recorder.phase("gc.collect()"))
        return get_available_gpu_memory(ranks, empty_cache=empty_cache, gc_collect=gc_before_measure)


def _size_and_allocate(ranks: list[Device], scenario: KVPoolScenario, pre: MemoryReading, reading: MemoryReading,
                       fraction: float, cell: int) -> tuple[KVBudget | None, list, str | None]:
    """SGLang's KV budget from the two readings and the pool allocated on every rank: (budget, pools, error),
    the error being no KV memory left or a pool that does not fit."""
    budget = error = None
    try:
        budget = kv_budget(
            pre_model_load_bytes=pre.free_bytes, available_bytes=reading.free_bytes,
            mem_fraction_static=fraction, cell_size_bytes=cell, context_len=scenario.context_len,
            page_size=scenario.page_size,
        )
    except NoKVMemoryError as exc:
        error = str(exc)
    pools = []
    if budget:
        try:
            pools = [_allocate_kv_pool(d, scenario.model_config, budget.max_total_num_tokens, scenario) for d in ranks]
        except torch.OutOfMemoryError as exc:
            pools, error = [], f"KV pool of {budget.max_total_num_tokens:,} tokens does not fit: {exc}"
    return budget, pools, error


def run(
    scenario: KVPoolScenario | str = SGLANG_PR_4XH200,
    *,
    gc_before_measure: bool = True,
    empty_cache: bool = True,
    mem_fraction_static: float | None = None,
    prompt_tokens: int | None = None,
    device: str | None = None,
    measure: Callable[[list[Device]], MemoryReading | int] | None = None,
) -> KVPoolResult:
    """Run the start-up once. ``device`` overrides the scenario's (e.g. ``"cuda"`` on a GPU box).

    ``measure(ranks)`` replaces the post-load reading (default: SGLang's ``get_available_gpu_memory``
    with ``empty_cache`` and ``gc_collect=gc_before_measure``); it returns a ``MemoryReading`` or the
    free bytes as an int, and may call ``gc.collect()`` / ``empty_cache()`` itself: the automatic
    collector is paused, so only what it does decides what the loader's reference cycle still holds.
    A pool larger than the devices can hold (a reading above what is free) ends in ``error``, as the
    out-of-memory a real server would hit, not in an exception.
    """
    if isinstance(scenario, str):
        scenario = get_scenario(scenario)
    fraction = scenario.mem_fraction_static if mem_fraction_static is None else mem_fraction_static
    check_fraction(fraction)
    prompt = scenario.prompt_tokens if prompt_tokens is None else prompt_tokens
    if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt <= 0:
        raise ValueError(f"prompt length must be a positive number of tokens, got {prompt!r}")
    config = scenario.model_config
    cell = config.cell_size_bytes(scenario.tp_size, scenario.draft_layers)

    gc.collect()  # start from a clean heap so earlier runs' garbage is not measured
    with automatic_gc_paused():
        ranks = get_devices(device or scenario.device, scenario.tp_size)
        for d in ranks:
            d.mark("before load")
        pre = get_available_gpu_memory(ranks, empty_cache=True, gc_collect=False)
        reports = [_load_rank(d, scenario, r) for r, d in enumerate(ranks)]
        reading = _post_load_reading(ranks, measure, gc_before_measure, empty_cache)
        budget, pools, error = _size_and_allocate(ranks, scenario, pre, reading, fraction, cell)
        with ranks[0].phase("serving"):
            gc.collect()  # a live server's collector runs sooner or later
            ranks[0].empty_cache()
            idle = ranks[0].mem_get_info()[0]
        timeline = ranks[0].timeline()
        del pools
    if budget is not None and error is None:
        error = budget.validate_input_length(prompt)
    return KVPoolResult(
        scenario=scenario, gc_before_measure=gc_before_measure, empty_cache=empty_cache,
        mem_fraction_static=fraction, prompt_tokens=prompt, pre_load=pre, reading=reading, budget=budget,
        error=error, accepted=budget is not None and error is None, weights=reports[0], idle_bytes=idle,
        timeline=timeline,
    )


def compare(scenario: KVPoolScenario | str = SGLANG_PR_4XH200, **options) -> tuple[KVPoolResult, KVPoolResult]:
    """Both arms of the finding: (without gc, with gc)."""
    options.pop("gc_before_measure", None)
    return run(scenario, gc_before_measure=False, **options), run(scenario, gc_before_measure=True, **options)


def summary_frame(without_gc: KVPoolResult, with_gc: KVPoolResult):
    """Both arms as a table a person reads: the bug's column, the fix's, then the difference fix − bug
    (kvlab.units' convention); rows in words, bytes in the unit their size calls for (``fmt_bytes``), tokens
    with separators.

    The rows, top to bottom, follow SGLang's arithmetic: the reading after loading, the budget left after the
    (1 − mem_fraction_static) slack, the cell size, the pool it buys and the prompt it then allows. The last row,
    memory left idle, is the PR's "46.9 GB left idle": free memory on rank 0 once the server has run gc.
    """
    import pandas as pd

    from kvlab.units import DIFFERENCE_HEADER, fmt_bytes, fmt_signed_bytes, fmt_signed_int

    def size(n):
        return "—" if n is None else fmt_bytes(n)

    def tokens(n):
        return "—" if n is None else f"{n:,} tokens"

    def diff(a, b, signed) -> str:
        return "" if a is None or b is None or a == b else signed(b - a)

    bug, fix = without_gc.to_json(), with_gc.to_json()
    rows = (  # label, value of one arm, the difference fix − bug
        ("free memory read after loading", lambda d: size(d["available_bytes"]),
         diff(bug["available_bytes"], fix["available_bytes"], fmt_signed_bytes)),
        ("KV budget (rest = free − slack)", lambda d: size(d["rest_bytes"]),
         diff(bug["rest_bytes"], fix["rest_bytes"], fmt_signed_bytes)),
        ("KV cell, per token per rank", lambda d: size(d["cell_size_bytes"]),
         diff(bug["cell_size_bytes"], fix["cell_size_bytes"], fmt_signed_bytes)),
        ("KV pool (max_total_num_tokens)", lambda d: tokens(d["max_total_num_tokens"]),
         diff(bug["max_total_num_tokens"], fix["max_total_num_tokens"], lambda n: fmt_signed_int(n) + " tokens")),
        ("longest prompt (max_req_input_len)", lambda d: tokens(d["max_req_input_len"]),
         diff(bug["max_req_input_len"], fix["max_req_input_len"], lambda n: fmt_signed_int(n) + " tokens")),
        (f"prompt of {fix['prompt_tokens']:,} tokens", lambda d: "accepted" if d["accepted"] else "refused",
         "" if bug["accepted"] == fix["accepted"] else
         f"{'accepted' if bug['accepted'] else 'refused'} → {'accepted' if fix['accepted'] else 'refused'}"),
        ("memory left idle once gc has run", lambda d: size(d["idle_bytes"]),
         diff(bug["idle_bytes"], fix["idle_bytes"], fmt_signed_bytes)),
    )
    frame = pd.DataFrame({"without gc.collect() (the bug)": [value(bug) for _, value, _ in rows],
                          "with gc.collect() (the fix)": [value(fix) for _, value, _ in rows],
                          DIFFERENCE_HEADER: [d for *_, d in rows]},
                         index=[label for label, *_ in rows])
    frame.index.name = "rank 0"
    return frame

