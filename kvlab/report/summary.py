"""The report's numbers: both findings, both arms, from ``kvlab.experiments`` with the notebooks' settings
(``summary.json``), and the headline tables of the index page in words."""

from __future__ import annotations

import html
from dataclasses import dataclass

from kvlab.units import (
    DIFFERENCE,
    DIFFERENCE_HEADER,
    fmt_bytes,
    fmt_points,
    fmt_signed_bytes,
    fmt_signed_int,
)

# The headline numbers are those the notebooks show (tests/test_report.py reads the notebooks' own calls):
# finding 1 is notebook 01 §1, the PR's setup on its simulated devices, plus §4 on a CUDA device when the
# report runs on one; finding 2 is notebook 02 §2, shortfall_eviction.PANEL_DEFAULTS (the live panel's setting).
SUMMARY_PRESET = "sglang-pr-4xh200"
SUMMARY_GPU_PRESET = "llama-8b-l4"


# ---- the numbers ----------------------------------------------------------------------------------
def describe_device(name: str) -> str:
    """A device name in words: ``simulated NVIDIA H200 141 GB HBM3e (sim:h200)``, ``NVIDIA H200 (cuda:0)``."""
    if name.startswith("sim:"):
        from kvlab.device import get_device_spec

        spec = get_device_spec(name[4:])
        return f"simulated {spec.description or spec.name} ({name})"
    if name == "cuda" or name.startswith("cuda:"):
        import torch

        if not torch.cuda.is_available():
            return f"{name} (no CUDA device visible)"
        index = int(name.split(":", 1)[1]) if ":" in name else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} (cuda:{index})"
    return name


def _pool_arm(result) -> dict:
    data = result.to_json()
    keys = ("max_total_num_tokens", "max_req_input_len", "available_bytes", "rest_bytes", "kv_pool_bytes",
            "prompt_tokens", "accepted", "error")
    return {k: data[k] for k in keys}


def _pool_finding(arms, device: str, source: str) -> dict:
    no_gc, with_gc = arms
    scenario = no_gc.scenario
    ranks = f"{scenario.tp_size} × " if scenario.tp_size > 1 else ""
    return {"source": source, "preset": scenario.name, "model": scenario.model, "tp_size": scenario.tp_size,
            "device": device, "device_description": ranks + describe_device(device),
            "without_gc": _pool_arm(no_gc), "with_gc": _pool_arm(with_gc),
            "difference": _json_difference(_pool_arm(no_gc), _pool_arm(with_gc), "with_gc - without_gc")}


def _json_difference(bug: dict, fix: dict, of: str) -> dict:
    """summary.json's ``difference`` of one finding: fix − bug (kvlab.units' convention) of every numeric field."""
    out: dict = {"of": f"{of} ({DIFFERENCE})"}
    for key, b in bug.items():
        a = fix.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
                and not isinstance(b, bool):
            out[key] = round(a - b, 6) if isinstance(a, float) or isinstance(b, float) else a - b
    return out


def compute_summary(device: str | None = None, *, preset: str = SUMMARY_PRESET) -> tuple[dict, tuple, object]:
    """Both findings, both arms, from ``kvlab.experiments`` with the notebooks' settings (the same calls as
    notebook 01 §1 and notebook 02 §2).

    ``device``: the report's device (``--device``, resolved). Finding 1's headline runs ``preset`` on its own
    simulated devices, as the notebook does; when ``device`` is CUDA, ``finding1_on_this_gpu`` adds notebook
    01 §4, ``SUMMARY_GPU_PRESET`` measured on it. Returns (summary dict, finding 1's arms, finding 2's
    comparison) so the figures are drawn from the very results whose numbers are reported."""
    from kvlab.experiments import kv_pool_sizing, shortfall_eviction

    arms = kv_pool_sizing.compare(preset)
    settings = shortfall_eviction.PANEL_DEFAULTS
    comparison = shortfall_eviction.panel_comparison(settings, progress=False)

    def sim(result) -> dict:
        totals = result.totals()
        keys = ("hit_rate", "cached_prompt_tokens", "prompt_tokens", "over_evicted_tokens", "evicted_tokens",
                "prefill_tokens_computed", "reprefill_tokens", "pressure_events", "requests")
        return {k: totals[k] for k in keys if k in totals}

    summary = {"device": {"name": device, "description": describe_device(device)} if device else None,
               "finding1_kv_pool_sizing": _pool_finding(arms, arms[0].scenario.device, "notebook 01, section 1")}
    if device and device.startswith("cuda"):
        gpu_arms = kv_pool_sizing.compare(SUMMARY_GPU_PRESET, device=device)
        summary["finding1_on_this_gpu"] = _pool_finding(gpu_arms, device, "notebook 01, section 4")
    summary["finding2_shortfall_eviction"] = {
        "source": "notebook 02, section 2 (shortfall_eviction.PANEL_DEFAULTS)", "workload": settings.workload,
        "seed": settings.seed, "overrides": settings.workload_overrides(), "kv_tokens": settings.kv_tokens,
        "page_size": settings.page_size, "policy": settings.policy,
        "device_description": "no device: a scheduler simulation that counts KV-pool slots",
        "full": sim(comparison.full), "shortfall": sim(comparison.shortfall),
        "difference": _json_difference(sim(comparison.full), sim(comparison.shortfall), "shortfall - full")}
    summary["hicache_host_tier"] = _hicache_summary()
    return summary, arms, comparison


def _hicache_summary() -> dict:
    """The README's HiCache line (notebook 07 prints it): the shipped trace without and with a host tier."""
    from dataclasses import asdict

    from kvlab.experiments.host_tier_sweep import hicache_headline

    h = hicache_headline()
    return {"source": "notebook 07 (host_tier_sweep.hicache_headline)", **asdict(h), "points": round(h.points, 6),
            "sentence": h.text()}


# ---- the headline table -------------------------------------------------------------------------------
def _int(n: int) -> str:
    return f"{n:,}".replace("-", "−")


def _signed_int(n: int) -> str:
    return fmt_signed_int(n)


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _signed_points(points: float) -> str:
    return fmt_points(points, "percentage points")


def _gib(n: int) -> str:  # bytes, the unit chosen by magnitude (kvlab.units.fmt_bytes, as every surface)
    return fmt_bytes(n).replace("-", "−")


def _signed_gib(n: int) -> str:
    return fmt_signed_bytes(n)


@dataclass(frozen=True)
class Headline:
    """One finding's table: a sentence, the two arms' column names (bug first, then fix) and rows of
    (what, bug, fix, fix − bug), every cell already in words and formatted numbers."""

    title: str
    setting: str
    sentence: str
    arms: tuple[str, str]
    rows: list[tuple[str, str, str, str]]
    note: str = ""
    difference: str = DIFFERENCE_HEADER  # the last column's header


def _pool_headline(f1: dict, title: str) -> Headline:
    bug, fix = f1["without_gc"], f1["with_gc"]
    tokens_bug, tokens_fix = bug["max_total_num_tokens"], fix["max_total_num_tokens"]
    ratio = f" ({tokens_fix / tokens_bug:,.1f}×)" if tokens_bug else ""
    prompt = f"{_int(fix['prompt_tokens'])}-token prompt"

    def verdict(arm: dict) -> str:
        return "accepted" if arm["accepted"] else "refused"

    rows = [
        ("KV pool size (max_total_num_tokens)", f"{_int(tokens_bug)} tokens", f"{_int(tokens_fix)} tokens",
         f"{_signed_int(tokens_fix - tokens_bug)} tokens{ratio}"),
        ("longest prompt allowed (max_req_input_len)", _int(bug["max_req_input_len"] or 0) + " tokens",
         _int(fix["max_req_input_len"] or 0) + " tokens",
         _signed_int((fix["max_req_input_len"] or 0) - (bug["max_req_input_len"] or 0)) + " tokens"),
        ("free memory measured after loading (min over ranks)", _gib(bug["available_bytes"]), _gib(fix["available_bytes"]),
         _signed_gib(fix["available_bytes"] - bug["available_bytes"])),
        (f"the {prompt}", verdict(bug), verdict(fix), "" if bug["accepted"] == fix["accepted"] else
         f"{verdict(bug)} → {verdict(fix)}"),
    ]
    sentence = (f"With gc.collect() before the memory reading SGLang sizes a KV pool of {_int(tokens_fix)} tokens "
                f"instead of {_int(tokens_bug)}{ratio.replace('×', '× as many')}; the {prompt} is {verdict(bug)} without it and "
                f"{verdict(fix)} with it.")
    errors = [f"{arm}: {f1[key]['error']}" for arm, key in (("without gc.collect()", "without_gc"),
                                                             ("with gc.collect()", "with_gc")) if f1[key]["error"]]
    setting = (f"preset {f1['preset']}: {f1['model']}, TP{f1['tp_size']}, on {f1['device_description']} "
               f"— {f1['source']}")
    return Headline(title, setting, sentence, ("without gc.collect() (the bug)", "with gc.collect() (the fix)"),
                    rows, note="SGLang's message — " + " · ".join(errors) if errors else "")


def _eviction_headline(f2: dict) -> Headline:
    bug, fix = f2["full"], f2["shortfall"]
    points = 100 * (fix["hit_rate"] - bug["hit_rate"])
    verb = "raises" if points > 0 else "lowers" if points < 0 else "leaves"
    rows = [("prefix-cache hit rate", _pct(bug["hit_rate"]), _pct(fix["hit_rate"]),
             _signed_points(points))]
    for key, label in (("over_evicted_tokens", "tokens evicted beyond the shortfall (over-evicted)"),
                       ("evicted_tokens", "tokens evicted"),
                       ("prefill_tokens_computed", "prefill tokens computed"),
                       ("reprefill_tokens", "… of them prefilled again after a retraction"),
                       ("pressure_events", "memory-pressure events"),
                       ("requests", "requests")):
        if key in bug and key in fix:
            rows.append((label, _int(bug[key]), _int(fix[key]), _signed_int(fix[key] - bug[key])))
    overrides = ", ".join(f"{k}={_int(v) if isinstance(v, int) else v}" for k, v in f2["overrides"].items())
    pages = f", {_int(f2['page_size'])}-token pages" if f2.get("page_size", 1) != 1 else ""
    policy = f", {f2['policy']} eviction policy" if f2.get("policy") else ""
    setting = (f"workload {f2['workload']} (seed {f2['seed']}, {overrides}) through a {_int(f2['kv_tokens'])}-token "
               f"KV pool{pages}{policy} — {f2['device_description']} — {f2['source']}")
    extra = bug["prefill_tokens_computed"] - fix["prefill_tokens_computed"]
    recomputed = (f"{_int(extra)} more prefill tokens" if extra > 0 else f"{_int(-extra)} fewer prefill tokens"
                  if extra < 0 else "as many prefill tokens")
    if extra and all(k in arm for arm in (bug, fix) for k in ("cached_prompt_tokens", "reprefill_tokens")):
        lost, again = fix["cached_prompt_tokens"] - bug["cached_prompt_tokens"], bug["reprefill_tokens"] - fix["reprefill_tokens"]
        show = _int if lost >= 0 and again >= 0 else _signed_int  # parts of "more": plain counts when both add
        recomputed += (f" ({show(lost)} prompt tokens it did not find in the cache, {show(again)} "
                       f"prefilled again after retractions)")
    sentence = (f"Evicting only the shortfall {verb} the prefix-cache hit rate from {_pct(bug['hit_rate'])} to "
                f"{_pct(fix['hit_rate'])} ({_signed_points(points)}); full eviction over-evicted "
                f"{_int(bug['over_evicted_tokens'])} tokens and computed {recomputed}.")
    return Headline("Finding 2 · evict only the shortfall", setting, sentence,
                    ("full eviction, SGLang ≤ 0.5.16 (the bug)", "shortfall eviction, SGLang ≥ 0.5.17 (the fix)"),
                    rows)


def headlines(summary: dict) -> list[Headline]:
    """The findings of ``summary`` (as ``compute_summary`` makes it) as readable tables."""
    out = [_pool_headline(summary["finding1_kv_pool_sizing"], "Finding 1 · measure the KV budget after collecting")]
    if "finding1_on_this_gpu" in summary:
        out.append(_pool_headline(summary["finding1_on_this_gpu"], "Finding 1 on this GPU"))
    out.append(_eviction_headline(summary["finding2_shortfall_eviction"]))
    if "hicache_host_tier" in summary:
        out.append(_hicache_headline(summary["hicache_host_tier"]))
    return out


def _hicache_headline(h: dict) -> Headline:
    points = 100 * (h["hit_rate_with_host"] - h["hit_rate_device_only"])
    rows = [("prefix-cache hit rate (device + loaded back)", _pct(h["hit_rate_device_only"]),
             _pct(h["hit_rate_with_host"]), _signed_points(points))]
    setting = (f"the shipped trace (data/traces/mooncake_small.jsonl), a device pool of {h['kv_pages']} pages of 512 "
               f"tokens, write_through, shortfall eviction — {h['source']} — {h['command']}")
    return Headline("HiCache · a host tier behind the device pool", setting, h["sentence"].split(" From a shell")[0],
                    ("no host tier", f"host pool {h['host_ratio']:g}× the device pool ({h['host_gib']:.2f} GiB)"),
                    rows, difference="difference (with − without)")


def headline_html(h: Headline) -> str:
    e = html.escape
    rows = "".join(f"<tr><th scope='row'>{e(what)}</th><td>{e(bug)}</td><td>{e(fix)}</td><td>{e(diff)}</td></tr>"
                   for what, bug, fix, diff in h.rows)
    note = f"<p class='note'>{e(h.note)}</p>" if h.note else ""
    return (f"<section class='headline'><h3>{e(h.title)}</h3><p>{e(h.sentence)}</p>"
            f"<p class='setting'>{e(h.setting)}</p>"
            f"<table class='kvlab-headline'><thead><tr><th></th><th>{e(h.arms[0])}</th><th>{e(h.arms[1])}</th>"
            f"<th>{e(h.difference)}</th></tr></thead><tbody>{rows}</tbody></table>{note}</section>")
