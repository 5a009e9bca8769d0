"""Published per-round tables of SGLang's multi-turn benchmark, side by side with kvlab's run of the same settings.

A table is one JSON record in the schema of ``../shared/real-data/hicache_tables_examples.jsonl`` (``server``: the
launch flags; ``bench``: ``bench_multiturn.py``'s arguments; ``rows``: round, ``avg_ttft_s``, ``cache_hit_rate``). A
field may be given as ``<name>_inferred`` (a value the table's author or curator inferred): kvlab uses it and says
so. What neither gives takes the script's default, said so too. The device pool comes from ``max_total_tokens``
where given, else from model + GPU + ``mem_fraction_static`` with finding 1's arithmetic
(:func:`kvlab.device.budget.kv_budget`), else it is an assumption stated in the output: a pool that holds the whole
benchmark (no eviction). ``kvlab simulate --compare-table FILE[#ID]`` prints :func:`compare`'s result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.units import GB, GiB, align_up
from kvlab.workloads.multiturn import prompt_length

#: the table's storage fields and the ``kvlab simulate`` flags they map to (the storage tier, L3, behind the host tier)
STORAGE_FLAGS = {"hicache_storage_backend": "--hicache-storage-backend",
                 "hicache_storage_prefetch_policy": "--hicache-storage-prefetch-policy"}
#: SGLang's default where a table names a backend but no prefetch policy (0.5.23's
#: ``srt/arg_groups/fields/memory.py``: ``hicache_storage_prefetch_policy = "timeout"``)
SGLANG_PREFETCH_POLICY = "timeout"
#: the bench arguments a table may give, with bench_multiturn.py's defaults
BENCH_DEFAULTS = {"num_clients": 256, "num_rounds": 5, "request_length": 512, "sub_question_input_length": 0,
                  "output_length": 64, "max_parallel": 128, "request_rate": 1.0, "ready_queue_policy": "random",
                  "enable_round_barrier": False, "disable_random_sample": False}
MAX_TABLE_BYTES = 16 << 20


class TableError(KvlabError, ValueError):
    """A table file or record kvlab cannot read: the message names the file, line and field."""


@dataclass
class TablePlan:
    """What a table asks kvlab to run, and every value that is not the table's own, said in ``notes``."""

    table_id: str
    label: str
    source: str
    workload: dict
    seed: int
    page_size: int
    kv_tokens: int
    config: dict  # the other SchedulerConfig fields the server's flags give (host tier, chunk size, cost model)
    storage: dict  # kvlab flag -> value: the storage tier's flags as run (SGLang's default policy where not given)
    measured: list  # the table's rows
    notes: list = field(default_factory=list)
    pool_note: str = ""

    @property
    def host_tier(self) -> str:
        """The host tier as SGLang's flag ("" without one)."""
        c = self.config
        if c.get("hicache_size_gib") is not None:
            return f"--hicache-size {c['hicache_size_gib'] * GiB / GB:g} (GB)"
        return f"--hicache-ratio {c['hicache_ratio']:g}" if c.get("hicache_ratio") else ""

    @property
    def title(self) -> str:
        return f"{self.table_id} ({self.label})" if self.label else self.table_id


def read_table(spec: str) -> tuple[dict, str]:
    """``FILE[#ID]``: the record with that ``id`` (or the file's only record); returns it and ``FILE:LINE``."""
    path, _, wanted = spec.partition("#")
    try:
        if Path(path).stat().st_size > MAX_TABLE_BYTES:
            raise TableError(f"--compare-table {path}: larger than {MAX_TABLE_BYTES >> 20} MiB, not a table file")
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TableError(f"--compare-table {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise TableError(f"{path}:{lineno}: not JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
        if not isinstance(record, dict):
            raise TableError(f"{path}:{lineno}: expected a JSON object (one table), got {type(record).__name__}")
        records.append((record, f"{path}:{lineno}"))
    chosen = [r for r in records if not wanted or r[0].get("id") == wanted]
    if not chosen:
        ids = ", ".join(str(r[0].get("id")) for r in records)[:300]
        raise TableError(f"--compare-table {spec}: no table {'with id ' + repr(wanted) if wanted else ''} in "
                         f"{path} (ids: {ids or 'none'})")
    if len(chosen) > 1:
        raise TableError(f"--compare-table {path}: {len(chosen)} tables; name one as {path}#ID")
    return chosen[0]


def _given(section: dict, name: str, where: str, notes: list, default):
    """A field as given, else its ``_inferred`` value (noted), else ``default`` (noted)."""
    if section.get(name) is not None:
        return section[name]
    if section.get(f"{name}_inferred") is not None:
        value = section[f"{name}_inferred"]
        notes.append(f"{where}.{name} = {value!r} is inferred (the table's {name}_inferred), not published")
        return value
    if default is not None:
        notes.append(f"{where}.{name} not given: bench_multiturn.py's default {default!r}")
    return default


def plan(record: dict, where: str) -> TablePlan:
    """The run a table asks for (:class:`TablePlan`), or a :class:`TableError` naming the field."""
    server, bench, rows = record.get("server"), record.get("bench"), record.get("rows")
    for name, value, kind in (("server", server, dict), ("bench", bench, dict), ("rows", rows, list)):
        if not isinstance(value, kind) or not value:
            raise TableError(f"{where}: field {name!r} must be a non-empty {kind.__name__}, got {value!r:.60}")
    notes: list[str] = []
    workload = {name: _given(bench, name, "bench", notes, default) for name, default in BENCH_DEFAULTS.items()}
    seed = bench.get("seed")
    if seed is None:
        notes.append("bench.seed not given: kvlab's seed 0 (the sender's pops and gaps)")
    page_size = _number(where, "server.page_size", _given(server, "page_size", "server", notes, None) or 1, int)
    if not server.get("page_size") and not server.get("page_size_inferred"):
        notes.append("server.page_size not given: SGLang's default 1")
    for key, kind in (("max_total_tokens", int), ("hicache_ratio", float), ("hicache_size_gb", float),
                      ("mem_fraction_static", float), ("tp", int), ("chunked_prefill_size", int)):
        if server.get(key) is not None:
            _number(where, f"server.{key}", server[key], kind)
    measured = _rows(rows, where)
    out = TablePlan(str(record.get("id", "")), str(record.get("table_label") or ""), str(record.get("url") or where),
                    workload, 0 if seed is None else seed, page_size, 0, _server_config(server, notes),
                    {}, measured, notes)
    out.storage = _storage_config(server, out.config, notes, where)
    out.kv_tokens, out.pool_note = _device_pool(record, out)
    return out


def _storage_config(server: dict, config: dict, notes: list, where: str) -> dict:
    """The storage tier of the server's flags, added to ``config`` when kvlab models it (a backend it has a preset
    for, behind a host tier); its flags as run (the table's, SGLang's default prefetch policy where not given)."""
    from kvlab.mem_cache.hicache.storage import PREFETCH_POLICIES, STORAGE_PRESETS

    given = {flag: server[key] for key, flag in STORAGE_FLAGS.items() if server.get(key) is not None}
    backend, policy = server.get("hicache_storage_backend"), server.get("hicache_storage_prefetch_policy")
    if policy is not None and policy not in PREFETCH_POLICIES:
        raise TableError(f"{where}: field server.hicache_storage_prefetch_policy must be one of "
                         f"{', '.join(PREFETCH_POLICIES)}, got {policy!r:.40}")
    why = ("" if backend is None else "no host tier (enable_hierarchical_cache off): SGLang's storage sits behind it"
           if "hicache_ratio" not in config and "hicache_size_gib" not in config else
           f"backend {backend!r:.40} is none of kvlab's presets ({', '.join(STORAGE_PRESETS)})"
           if backend not in STORAGE_PRESETS else "")
    if backend is None or why:
        if given:
            notes.append(f"storage tier ({', '.join(f'{f} {v}' for f, v in given.items())}): not modelled, {why or 'no backend'}")
        return given
    if policy is None:
        policy = SGLANG_PREFETCH_POLICY
        notes.append(f"server.hicache_storage_prefetch_policy not given: SGLang's default {policy!r} (0.5.23)")
    config.update(hicache_storage_backend=backend, hicache_storage_prefetch_policy=policy)
    preset = STORAGE_PRESETS[backend]
    size = "unbounded" if preset.capacity_gb is None else f"{preset.capacity_gb:g} GB per rank"
    notes.append(f"storage tier {backend}: kvlab's preset ({size}, {preset.read_gbps:g} GB/s read; assumed: "
                 f"{preset.source}); prefetch threshold 256 tokens and timeouts at SGLang's defaults")
    return {**given, STORAGE_FLAGS["hicache_storage_prefetch_policy"]: policy}


def _server_config(server: dict, notes: list) -> dict:
    """The ``SchedulerConfig`` fields of the server's flags: the host tier (``--hicache-size`` in GB wins over
    ``--hicache-ratio``, as in SGLang's ``HostKVCache``), its write policy, the chunk size."""
    config: dict = {}
    if server.get("enable_hierarchical_cache"):
        if server.get("hicache_size_gb"):
            config["hicache_size_gib"] = server["hicache_size_gb"] * GB / GiB
        else:
            config["hicache_ratio"] = float(server.get("hicache_ratio") or 2.0)
            if not server.get("hicache_ratio"):
                notes.append("server.hicache_ratio not given: SGLang's default 2")
        if server.get("hicache_write_policy"):
            config["hicache_write_policy"] = server["hicache_write_policy"]
    elif server.get("hicache_ratio") or server.get("hicache_size_gb"):
        notes.append("a host pool size given without enable_hierarchical_cache: no host tier")
    if server.get("chunked_prefill_size"):
        config["chunked_prefill_size"] = server["chunked_prefill_size"]
    return config


def _number(where: str, name: str, value, kind: type):
    """``value`` when it is a positive number (an int where ``kind`` is int), else a :class:`TableError`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and value == value
    if not ok or (kind is int and not isinstance(value, int)):
        raise TableError(f"{where}: field {name} must be a positive {'integer' if kind is int else 'number'}, "
                         f"got {value!r:.40}")
    return value


def _rows(rows: list, where: str) -> list[dict]:
    out = []
    for i, row in enumerate(rows):
        ok = isinstance(row, dict) and all(isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
                                           for k in ("round", "cache_hit_rate"))
        if not ok:
            raise TableError(f"{where}: rows[{i}] needs a numeric 'round' and 'cache_hit_rate', got {row!r:.80}")
        out.append(row)
    return out


def _device_pool(record: dict, p: TablePlan) -> tuple[int, str]:
    """The device pool in tokens and how it was found."""
    server, hardware = record["server"], record.get("hardware") or {}
    ps, cap = p.page_size, server.get("max_total_tokens")
    model, gpu, fraction = server.get("model"), hardware.get("gpu"), server.get("mem_fraction_static")
    unknown = _unknown_presets(model, gpu) if model and gpu and fraction else ""
    if model and gpu and fraction and not unknown:
        tokens, how = _finding_one_pool(_preset_name(model), gpu, fraction, server.get("tp") or 1, ps, p)
        if cap and cap < tokens:
            return cap // ps * ps, f"server.max_total_tokens (given; below what {how})"
        return tokens, how
    if cap:
        return cap // ps * ps, "server.max_total_tokens (given)"
    w = p.workload
    last = prompt_length(w["num_rounds"] - 1, w["request_length"], w["output_length"],
                         w["sub_question_input_length"]) + w["output_length"]
    tokens = w["num_clients"] * (align_up(last, ps) + ps)
    missing = unknown or ", ".join(k for k, v in (("model", model), ("GPU", gpu), ("mem_fraction_static", fraction))
                                   if not v) + " missing"
    return tokens, (f"ASSUMED: the table gives no device pool ({missing}), so kvlab assumes one that holds "
                    f"the whole benchmark, {tokens:,} tokens (no eviction: num_clients × (last prompt + output + a "
                    f"page))")


def _preset_name(model: str) -> str:
    """kvlab's preset for a model as a table names it: ``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b``
    (the repository's last part, lower case, an ``-instruct`` / ``-chat`` suffix dropped)."""
    name = str(model).rsplit("/", 1)[-1].lower()
    for suffix in ("-instruct", "-chat"):
        name = name.removesuffix(suffix)
    return name


def _unknown_presets(model: str, gpu: str) -> str:
    """Why finding 1 cannot size the pool ("" when it can): a model or GPU kvlab has no preset for."""
    from kvlab.device.spec import DEVICE_PRESETS, find_device_spec
    from kvlab.model import MODEL_PRESETS

    if _preset_name(model) not in MODEL_PRESETS:
        return f"model {model!r} is none of kvlab's presets ({', '.join(sorted(MODEL_PRESETS))})"
    if find_device_spec(str(gpu)) is None and str(gpu).lower() not in DEVICE_PRESETS:
        return f"GPU {gpu!r} is none of kvlab's presets"
    return ""


def _finding_one_pool(model: str, gpu: str, fraction: float, tp: int, page_size: int,
                      p: TablePlan) -> tuple[int, str]:
    """Finding 1's arithmetic: free memory before load (the GPU preset less its CUDA context) less the weights per
    rank, SGLang's ``rest = after − before × (1 − f)`` and ``tokens = rest // cell``. The run's cost model takes the
    model's KV bytes per token (host copies, ``--hicache-size``) and the GPU's host link."""
    from kvlab.device.budget import kv_budget
    from kvlab.device.spec import find_device_spec, get_device_spec
    from kvlab.model import get_model_config

    try:
        spec = find_device_spec(gpu) or get_device_spec(str(gpu).lower())
        config = get_model_config(model)
        before = spec.total_bytes - spec.non_pytorch_bytes
        budget = kv_budget(pre_model_load_bytes=before, available_bytes=before - config.weight_bytes_per_rank(tp),
                           mem_fraction_static=float(fraction), cell_size_bytes=config.cell_size_bytes(tp),
                           context_len=config.context_len or 8192, page_size=page_size)
    except ValueError as exc:
        raise TableError(f"the device pool from model {model!r}, GPU {gpu!r}, mem_fraction_static {fraction!r}: "
                         f"{exc}") from None
    tokens = budget.max_total_num_tokens
    p.config["cost"] = _cost_model(spec, config.cell_size_bytes(tp))
    return tokens, (f"derived with kvlab's finding-1 arithmetic: {model} on {spec.name} at TP {tp}, "
                    f"mem_fraction_static {fraction} -> {tokens:,} tokens (CUDA context assumed per the GPU preset)")


def _cost_model(spec, kv_bytes_per_token: int):
    from kvlab.sched.cost import CostModel

    if spec.host_link_bytes_per_s is None:
        return CostModel(kv_bytes_per_token=kv_bytes_per_token)
    return CostModel.for_gpu(spec.name, kv_bytes_per_token)


@dataclass
class TableComparison:
    """A table's rows beside kvlab's (``rows``: round, requests, measured and simulated hit rate and TTFT)."""

    plan: TablePlan
    rows: list
    totals: dict

    def as_dict(self) -> dict:
        p = self.plan
        return {"table": p.table_id, "label": p.label, "source": p.source, "eviction": self.totals["eviction"],
                "policy": self.totals["policy"], "workload": p.workload, "seed": p.seed,
                "page_size": p.page_size, "kv_tokens": p.kv_tokens, "device_pool": p.pool_note,
                "host_tier": p.host_tier, "storage_flags": p.storage, "notes": p.notes, "rounds": self.rows,
                "totals": self.totals}


def compare(spec: str, *, eviction: str = "shortfall", policy: str = "lru") -> TableComparison:
    """Read ``FILE[#ID]``, run its settings through ``kvlab simulate --workload multiturn`` (in ``eviction`` mode,
    with ``policy``) and pair the rounds."""
    from kvlab.experiments.shortfall_eviction import run
    from kvlab.sched.arrivals import round_metrics
    from kvlab.sweep.point import closed_loop_options
    from kvlab.workloads.generators import make_workload

    record, where = read_table(spec)
    p = plan(record, where)
    try:
        requests = make_workload("multiturn", seed=p.seed, **p.workload)
        result = run(requests, eviction=eviction, policy=policy, page_size=p.page_size, kv_tokens=p.kv_tokens,
                     **p.config, **closed_loop_options(requests, p.seed))
    except ValueError as exc:
        raise TableError(f"{where}: {exc}") from None
    simulated = {m.round: m for m in round_metrics(result.records)}
    rows = []
    for row in p.measured:
        sim = simulated.get(int(row["round"]))
        rows.append({"round": int(row["round"]), "requests": sim.requests if sim else 0,
                     "measured_cache_hit_rate": row["cache_hit_rate"],
                     "simulated_cache_hit_rate": round(sim.cache_hit_rate, 6) if sim else None,
                     "measured_avg_ttft_s": row.get("avg_ttft_s"),
                     "simulated_avg_ttft_s": round(sim.avg_ttft_s, 6) if sim else None})
    return TableComparison(p, rows, result.totals())
