"""What-ifs on an explained SGLang start-up: change one input, recompute the pool.

``mem_fraction_static=0.9``  the fraction (keeps the readings);
``kv_cache_dtype=fp8_e4m3``  the KV dtype (needs the config, or a known logged KV dtype to scale from);
``tp=8``                     per-rank KV heads change, and what loading took scales with the config's weights per
                             rank (needs the config, with the fields the weights need; the same GPU model on every
                             rank);
``gpu=h200``                 another card: free-before-load moves by the difference in totals (needs the current
                             card from the log or --gpu); a default fraction is re-derived for the new card.
"""

from __future__ import annotations

from kvlab.errors import KvlabError
from kvlab.model.hf_config import KV_DTYPE_NAMES
from kvlab.serving.cell import config_cell
from kvlab.serving.gpu import resolve_gpu
from kvlab.serving.pool import Pool
from kvlab.serving.result import WhatIfResult
from kvlab.serving.sglang_log import MAX_PARALLEL
from kvlab.serving.sglang_versions import cell_rule, default_mem_fraction
from kvlab.units import GiB

KEYS = {"mem_fraction_static": "mem_fraction_static", "mem-fraction-static": "mem_fraction_static",
        "f": "mem_fraction_static", "kv_cache_dtype": "kv_cache_dtype", "kv-cache-dtype": "kv_cache_dtype",
        "kv_dtype": "kv_cache_dtype", "tp": "tp", "tp_size": "tp", "gpu": "gpu"}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "float32": 4}


class WhatIfError(KvlabError, ValueError):
    """A what-if kvlab cannot apply; the message names it."""


def _cut(item: str) -> str:
    """A what-if as its errors show it: a long one cut (a 100,000-character GPU name is no message)."""
    return item if len(item) <= 60 else item[:57] + "..."


def parse_what_if(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    item = _cut(item)
    if not sep or not value.strip():
        raise WhatIfError(f"--what-if {item!r}: expected KEY=VALUE, e.g. mem_fraction_static=0.9")
    if key.strip() not in KEYS:
        raise WhatIfError(f"--what-if {item!r}: unknown key {key.strip()[:40]!r}; keys: mem_fraction_static, "
                          f"kv_cache_dtype, tp, gpu")
    key, value = KEYS[key.strip()], value.strip()
    if key == "tp" and value.isdecimal() and (len(value.lstrip("0")) > 6 or int(value) > MAX_PARALLEL):
        raise WhatIfError(f"--what-if {item!r}: tp must be from 1 to {MAX_PARALLEL:,}")
    return key, value


def apply_what_ifs(exp, items) -> list[WhatIfResult]:
    return [_one(exp, *parse_what_if(item), _cut(item)) for item in items]


def _one(exp, key: str, value: str, item: str) -> WhatIfResult:
    pool: Pool = exp.pool
    note = ""
    if key == "mem_fraction_static":
        try:
            fraction = float(value)
        except ValueError:
            raise WhatIfError(f"--what-if {item!r}: not a number") from None
        if not 0 < fraction < 1:
            raise WhatIfError(f"--what-if {item!r}: mem_fraction_static must be in (0, 1)")
        new = pool.replace(mem_fraction_static=fraction)
    elif key == "kv_cache_dtype":
        name = KV_DTYPE_NAMES.get(value.lower())
        if name is None:
            raise WhatIfError(f"--what-if {item!r}: kv_cache_dtype must be one of {sorted(KV_DTYPE_NAMES)}")
        if exp.kv_dtype_bytes is None:
            raise WhatIfError(f"--what-if {item!r}: the current KV dtype is unknown: pass --model-config")
        new = pool.replace(cell_size_bytes=pool.cell_size_bytes * DTYPE_BYTES[name] // exp.kv_dtype_bytes)
        note = f"cell {pool.cell_size_bytes:,} → {new.cell_size_bytes:,} B"
        if cell_rule(exp.version or exp.rules_version).kv_dtype != "option":
            note += f" (sglang {exp.version or exp.rules_version} had no --kv-cache-dtype: a newer version is needed)"
    elif key == "tp":
        new, note = _tp(exp, item, value)
    else:
        new, note = _gpu(exp, item, value)
    tokens = new.tokens
    refused = "SGLang refuses to start: no room for the pool" if tokens == 0 else ""
    return WhatIfResult(label=item, key=key, value=value, max_total_num_tokens=tokens,
                        change=tokens - exp.max_total_num_tokens_computed,
                        mem_fraction_static=new.mem_fraction_static, avail_before_load_gib=round(new.before_gib, 4),
                        avail_after_load_gib=round(new.after_gib, 4), cell_size_bytes=new.cell_size_bytes,
                        note="; ".join(x for x in (note, refused) if x))


def _tp(exp, item: str, value: str) -> tuple[Pool, str]:
    config = exp.model_config
    if config is None:
        raise WhatIfError(f"--what-if {item!r}: needs --model-config (weights and KV heads per rank come from it)")
    try:
        tp = int(value)
    except ValueError:
        raise WhatIfError(f"--what-if {item!r}: tp must be a positive integer") from None
    if tp < 1:
        raise WhatIfError(f"--what-if {item!r}: tp must be a positive integer")
    absent = config.lacks()
    if absent:
        raise WhatIfError(f"--what-if {item!r}: the config ({config.source or config.name}) has no "
                          f"{', '.join(repr(f) for f in absent)}: what loading would take at TP {tp} scales with the "
                          f"weights per rank, which need them")
    pool = exp.pool
    w_now, w_new = (config.weight_bytes_per_rank(t) / GiB for t in (exp.tp_size, tp))
    loaded = (pool.before_gib - pool.after_gib) * w_new / w_now  # what loading took, scaled by the weights per rank
    after = pool.before_gib - loaded
    rule = cell_rule(exp.version or exp.rules_version)
    cell = config_cell(config, rule, tp, exp.kv_dtype_bytes or config.kv_dtype_bytes, config.attention == "mla",
                       exp.log_path)
    fraction = pool.mem_fraction_static
    if exp.fraction_from_default:
        device = exp.device
        fraction = default_mem_fraction(exp.version or exp.rules_version, tp, device.smi_mib if device else None).value
    note = (f"config weights {w_now:.2f} → {w_new:.2f} GiB per rank (loaded {pool.before_gib - pool.after_gib:.2f} → "
            f"{loaded:.2f} GiB), cell {pool.cell_size_bytes:,} → {cell:,} B"
            + (f", default fraction {fraction}" if exp.fraction_from_default else ""))
    return pool.replace(after_gib=after, cell_size_bytes=cell, mem_fraction_static=fraction), note


def _gpu(exp, item: str, value: str) -> tuple[Pool, str]:
    if exp.device is None:
        raise WhatIfError(f"--what-if {item!r}: the current GPU is unknown (the log names none): pass --gpu NAME")
    try:
        target, _ = resolve_gpu(value, None)
    except KvlabError as exc:
        raise WhatIfError(f"--what-if {item!r}: {exc}") from None
    pool = exp.pool
    shift = (target.smi_mib - exp.device.smi_mib) / 1024
    before, after = pool.before_gib + shift, pool.after_gib + shift
    fraction = pool.mem_fraction_static
    if exp.fraction_from_default:
        fraction = default_mem_fraction(exp.version or exp.rules_version, exp.tp_size, target.smi_mib).value
    note = (f"{exp.device.name} → {target.name}: free memory {shift:+.2f} GiB, same memory held before and during "
            f"loading" + (f", default fraction {fraction}" if exp.fraction_from_default else ""))
    if before <= 0 or after <= 0:
        raise WhatIfError(f"--what-if {item!r}: the {target.name} ({target.smi_mib:,} MiB) cannot hold what this "
                          f"server loaded")
    return pool.replace(before_gib=before, after_gib=after, mem_fraction_static=fraction), note
