"""The result of explaining a start-up log: every number with where it came from, as JSON or text."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.device.spec import DeviceSpec
from kvlab.model.config import ModelConfig
from kvlab.serving.pool import Pool
from kvlab.units import GiB


@dataclass
class Finding:
    """One finding: ``id`` is the stable key code and tests find it by; ``values`` are its figures (in the JSON
    beside id, severity and message)."""
    id: str
    severity: str  # info | warning | error
    message: str
    values: dict = field(default_factory=dict)
    assumed: tuple[str, ...] = ()  # the rebuilt or assumed inputs it rests on, in words (kvlab.serving.provenance)

    @property
    def basis(self) -> str:
        """``assumed`` where the finding rests on a value nobody read from the server, else ``read``."""
        return "assumed" if self.assumed else "read"

    def as_dict(self) -> dict:
        return {"id": self.id, "severity": self.severity, "message": self.message, **self.values,
                "basis": self.basis, "assumed": list(self.assumed)}


@dataclass
class WaterfallTerm:
    """One waterfall term: ``key`` is stable (code finds a term by it), ``name`` the label shown, ``gib`` signed
    (None where the log does not print it), ``how`` where the number comes from."""
    key: str
    name: str
    gib: float | None
    how: str
    assumed: tuple[str, ...] = ()  # the rebuilt or assumed inputs it rests on, in words

    @property
    def basis(self) -> str:
        return "assumed" if self.assumed else "read"

    def as_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "gib": self.gib, "how": self.how, "basis": self.basis,
                "assumed": list(self.assumed)}


@dataclass(frozen=True)
class WhatIfResult:
    """One what-if (``--what-if KEY=VALUE``): the SGLang pool recomputed with one setting changed, the readings kept.
    ``key`` is stable (the setting changed: mem_fraction_static, kv_cache_dtype, tp or gpu, whatever alias was typed;
    code finds a what-if by it), ``label`` the item as typed (shown), ``value`` the new setting; the pool that results
    is ``max_total_num_tokens`` (``change`` against the explained pool), from its fraction, readings and cell;
    ``note`` says what else moved ("" when nothing did). ``as_dict`` is the JSON (``what_if`` holds the label)."""
    label: str
    key: str
    value: str
    max_total_num_tokens: int
    change: int  # tokens: max_total_num_tokens − the explained pool's
    mem_fraction_static: float
    avail_before_load_gib: float
    avail_after_load_gib: float
    cell_size_bytes: int
    note: str

    def as_dict(self) -> dict:
        return {"what_if": self.label, "key": self.key, "value": self.value,
                "max_total_num_tokens": self.max_total_num_tokens, "change": self.change,
                "mem_fraction_static": self.mem_fraction_static, "avail_before_load_gib": self.avail_before_load_gib,
                "avail_after_load_gib": self.avail_after_load_gib, "cell_size_bytes": self.cell_size_bytes,
                "note": self.note}


@dataclass
class Explanation:
    log_path: str
    engine: str
    version: str | None
    version_source: str
    rules_version: str | None  # the read release whose rules were applied
    tp_size: int
    tp_size_source: str
    mem_fraction_static: float | None
    mem_fraction_static_source: str
    avail_before_load_gib: float | None
    avail_after_load_gib: float | None
    cell_size_bytes: int
    cell_size_source: str
    cell_range: tuple[int, int]
    max_total_num_tokens_logged: int | None
    max_total_num_tokens_computed: int
    computed_range: tuple[int, int]
    pool: Pool | None = None
    ranks: list[dict] = field(default_factory=list)
    gpu: str | None = None
    gpu_source: str | None = None
    model: str | None = None
    context_len: int | None = None
    page_size: int = 1
    extra: dict = field(default_factory=dict)  # engine-specific fields (vLLM: gpu_memory_utilization, ...)
    findings: list[Finding] = field(default_factory=list)
    what_if: list[WhatIfResult] = field(default_factory=list)
    model_config: ModelConfig | None = None
    device: DeviceSpec | None = None
    fraction_from_default: bool = False
    kv_dtype_bytes: int | None = None
    weights_gib: float | None = None  # before − after on the rank that kept the least free memory
    # readings the log marks as rebuilt (kvlab.serving.provenance): reading name -> the reading in words
    assumed: dict[str, str] = field(default_factory=dict)

    def rests_on(self, *readings: str) -> tuple[str, ...]:
        """The words for those of ``readings`` that were rebuilt, not read (``()`` where all were read)."""
        return tuple(self.assumed[r] for r in readings if r in self.assumed)

    @property
    def consistent(self) -> bool | None:
        if self.max_total_num_tokens_logged is None:
            return None
        lo, hi = self.computed_range
        return lo <= self.max_total_num_tokens_logged <= hi

    @property
    def consistency_rests_on(self) -> tuple[str, ...]:
        """The rebuilt readings the logged-vs-computed verdict rests on (rebuilt to match: consistent by design)."""
        if self.engine == "sglang":
            return self.rests_on("free_before_load", "free_after_load")
        return self.rests_on("available")

    def terms(self) -> list[WaterfallTerm]:
        """The waterfall, one ``WaterfallTerm`` per term, by key: SGLang: free_before_load, [expert_location_map], loaded, [rope_cache],
        kept_out, pool_budget, kv_pool, rounding; vLLM: weights, available, kv_pool."""
        if self.pool is None:
            return self.extra.get("terms", [])
        p = self.pool
        pool_gib = self.max_total_num_tokens_computed * p.cell_size_bytes / GiB
        pre = self.extra.get("pre_load_terms") or []
        post = self.extra.get("post_load_terms") or []
        printed_before = p.before_gib - sum(t["bytes"] for t in pre) / GiB
        printed_after = p.after_gib + sum(t["bytes"] for t in post) / GiB
        both = self.rests_on("free_before_load", "free_after_load")
        rests = {"free_before_load": self.rests_on("free_before_load"), "kept_out": self.rests_on("free_before_load"),
                 "loaded": both, "pool_budget": both, "kv_pool": both, "rounding": both}
        rows = [
            ("free_before_load", "free before load", p.before_gib,
             "avail mem at 'Load weight begin' (min over ranks)" if not pre else
             "SGLang's own reading: 'Load weight begin' avail mem + what the next rows allocated after it"),
            *((t["key"], t["name"], -t["bytes"] / GiB, t["how"]) for t in pre),
            ("loaded", "weights and other memory loaded", printed_after - printed_before,
             "'Load weight end' − 'Load weight begin'"),
            *((t["key"], t["name"], -t["bytes"] / GiB, t["how"]) for t in post),
            ("kept_out", "kept for activations and CUDA graphs", -p.slack_gib,
             f"before × (1 − {p.mem_fraction_static})"),
            ("pool_budget", "KV pool budget (rest)", p.rest_gib, "what is left for the pool"),
            ("kv_pool", "KV pool", pool_gib,
             f"{self.max_total_num_tokens_computed:,} tokens × {p.cell_size_bytes:,} B"),
            ("rounding", "left by page and cell rounding", max(p.rest_gib, 0) - pool_gib, "rest − pool"),
        ]
        return [WaterfallTerm(k, n, round(v, 4), how, rests.get(k, ())) for k, n, v, how in rows]

    def to_json(self) -> dict:
        return {
            "log": self.log_path, "engine": self.engine, "version": self.version,
            "version_source": self.version_source, "rules_version": self.rules_version, "tp_size": self.tp_size,
            "tp_size_source": self.tp_size_source, "gpu": self.gpu, "gpu_source": self.gpu_source, "model": self.model,
            "mem_fraction_static": self.mem_fraction_static,
            "mem_fraction_static_source": self.mem_fraction_static_source,
            "avail_before_load_gib": self.avail_before_load_gib, "avail_after_load_gib": self.avail_after_load_gib,
            "cell_size_bytes": self.cell_size_bytes, "cell_size_source": self.cell_size_source,
            "cell_size_range": list(self.cell_range), "page_size": self.page_size, "context_len": self.context_len,
            "max_total_num_tokens_logged": self.max_total_num_tokens_logged,
            "max_total_num_tokens_computed": self.max_total_num_tokens_computed,
            "computed_range": list(self.computed_range), "consistent": self.consistent,
            "consistent_basis": "assumed" if self.consistency_rests_on else "read", "ranks": self.ranks,
            "model_config_missing_fields": list(self.model_config.missing) if self.model_config else None,
            **self.extra_json(), "terms": [t.as_dict() for t in self.terms()],
            "findings": [f.as_dict() for f in self.findings], "what_if": [w.as_dict() for w in self.what_if],
            "assumed_inputs": self.assumed,
        }

    def extra_json(self) -> dict:
        return {k: v for k, v in self.extra.items() if k != "terms"}
