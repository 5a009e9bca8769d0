"""What an explained SGLang start-up shows, in words: each finding is a ``result.Finding`` (id, severity, message).

- ``resident_after_load``: memory still held after loading beyond the weights (the finding-1 signature);
- ``no_room_for_pool``: the fraction leaves nothing for the pool (SGLang's own error);
- ``pool_below_context``: prompts near the context length will be refused (SGLang's message);
- ``ranks_disagree``: ranks printed different readings or pool sizes (SGLang uses the minimum);
- ``incomplete_ranks``: some ranks began loading but never printed the end of it;
- ``outside_interval``: the logged pool is outside what the printed readings allow;
- ``cell_mismatch`` (an error): the config's cell size disagrees with the log's own K/V sizes: the config
  contradicts the log, so the pool computed with it says nothing about the server;
- ``restarted``: the file holds several server starts (the last is explained); ``repeated_reading``: one rank
  printed a message again with another value (the first is used);
- ``shared_gpu``: much of the card was in use before loading (another process);
- ``weights_unchecked``, ``context_unchecked``, ``term_not_counted``: the config lacks a field a check needs
  (the KV cell size needs none of them): which field, and what the check would have shown;
- notes on the version, the rank-zero log filter, speculative decoding and the config.
"""

from __future__ import annotations

from kvlab.device.budget import KVBudget
from kvlab.serving.engine_compare import torch_total
from kvlab.serving.pool import cell_from_logged_sizes
from kvlab.serving.result import Finding
from kvlab.serving.sglang_log import SGLangStartup
from kvlab.serving.sglang_versions import KNOWN_RANGE, at_least, is_known, parse_version, reading_gaps
from kvlab.units import GiB

CONTEXT_GIB = 0.5  # a CUDA context and library workspaces, before anything is loaded (order of magnitude)


def _f(fid: str, severity: str, message: str, **values) -> Finding:
    return Finding(fid, severity, message, values)


def sglang_findings(exp, log: SGLangStartup) -> list[Finding]:
    out: list[dict] = []
    pool, _cell = exp.pool, exp.cell_size_bytes
    version = exp.version or exp.rules_version
    if exp.version is None:
        out.append(_f("version_assumed", "info", f"SGLang version {exp.version_source}: the rules of sglang "
                      f"{exp.rules_version or 'today'} were applied; pass --sglang-version to choose"))
    elif not is_known(exp.version):  # printed by the log (--sglang-version is refused outside the range)
        out.append(_f("version_unknown", "warning", f"SGLang {exp.version} ({exp.version_source}) is outside the "
                      f"versions kvlab knows, {KNOWN_RANGE}: the rules of sglang {exp.rules_version} were applied; "
                      f"pass --sglang-version to choose", version=exp.version, rules_version=exp.rules_version))
    if exp.fraction_from_default:
        out.append(_f("default_fraction", "info", f"mem_fraction_static is this version's default, not printed in "
                      f"the log: {exp.mem_fraction_static_source}"))
    _starts(log, out)
    _weights(exp, out)
    if pool.rest_gib <= 0:
        text = ("Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
                f"{pool.mem_fraction_static}." if at_least(version, "0.5.16")
                else "Not enough memory. Please try to increase --mem-fraction-static.")
        out.append(_f("no_room_for_pool", "error", f"the fraction leaves no room for the pool: before × (1 − f) = "
                      f"{pool.slack_gib:.2f} GiB is more than the {pool.after_gib:.2f} GiB free after loading; SGLang "
                      f"stops with: {text!r}. Minimum viable fraction = 1 − after/before = "
                      f"{pool.min_viable_fraction:.4f}", min_viable_fraction=round(pool.min_viable_fraction, 4)))
    _context(exp, out)
    _ranks(log, out)
    _cell_check(exp, log, out)
    _interval(exp, out)
    _shared(exp, out)
    for term in exp.extra.get("uncounted_terms") or ():
        out.append(_f("term_not_counted", "info", term["message"], term=term["name"],
                      missing_fields=term["missing_fields"]))
    if version and parse_version("0.4.7.post1") <= parse_version(version) < parse_version("0.5.4"):
        out.append(_f("rank_zero_log", "info", "this version logs the model runner's lines (readings, memory pool) "
                      "from TP rank 0 only; SGLang used the minimum over all ranks, which may be lower"))
    if exp.extra.get("speculative"):
        out.append(_f("speculative", "warning", "speculative decoding is on: 0.4.x adds draft headroom to the pool "
                      "(max_num_reqs × (steps × topk + draft tokens) + 100) and newer versions size a draft pool; "
                      "kvlab does not model either, so expect a difference"))
    if log.setting("nnodes")[0] not in (None, "1"):
        out.append(_f("multi_node", "info", "several nodes: only the ranks printed in this log are seen"))
    for note in exp.model_config.notes if exp.model_config else ():
        out.append(_f("config_note", "info", note))
    if exp.max_total_num_tokens_logged is None:
        out.append(_f("no_logged_pool", "info", "the log ends before SGLang printed the pool size: only the "
                      "computed value is shown"))
    for finding in out:
        finding.assumed = exp.rests_on(*READINGS_USED.get(finding.id, ()))
    return out


def _starts(log: SGLangStartup, out: list) -> None:
    """Several server starts in one file, or a message one rank printed twice with different values."""
    out.extend(start_findings(log, marker="a server_args line", between="no new server_args line between",
                              why="a second model loaded in the same process (a speculative draft model) or lines "
                                  "pasted twice; kvlab uses the first, line {kept} (the target model loads first and "
                                  "sizes the pool)"))


def start_findings(log, *, marker: str, between: str, why: str) -> list[Finding]:
    """The ``restarted`` and ``repeated_reading`` findings of a parsed log (SGLang's or vLLM's) with ``start_line``,
    ``earlier_starts`` and ``repeats``: ``marker`` names the line a start begins with, ``why`` (formatted with
    ``kept``) what a repeat may be."""
    out = []
    if log.earlier_starts:
        spans = ", ".join(f"lines {a}–{b}" for a, b in log.earlier_starts)
        out.append(_f("restarted", "warning", f"the log holds {len(log.earlier_starts) + 1} server starts (each "
                      f"begins with {marker}): kvlab explains the last one, from line "
                      f"{log.start_line}; {spans} are set aside", start_line=log.start_line,
                      earlier_starts=[list(span) for span in log.earlier_starts]))
    for label, anchor, kept, later in log.repeats:
        out.append(_f("repeated_reading", "warning", f"{label} printed '{anchor}' again at line {later} with "
                      f"another value (first at line {kept}) and {between}: {why.format(kept=kept)}", rank=label,
                      log_message=anchor, line_used=kept, line_set_aside=later))
    return out


# the readings each finding's numbers come from: a finding on a rebuilt reading is marked assumed
_BOTH = ("free_before_load", "free_after_load")
READINGS_USED = {"shared_gpu": ("free_before_load",), "gpu_mismatch": ("free_before_load",),
                 "resident_after_load": _BOTH, "weights_smaller": _BOTH, "weights_unchecked": _BOTH,
                 "no_room_for_pool": _BOTH, "outside_interval": _BOTH}


def _weights(exp, out: list) -> None:
    config = exp.model_config
    if config is None or exp.weights_gib is None:
        return
    absent = config.lacks()
    if absent:
        out.append(_f("weights_unchecked", "info", f"the config has no {_names(absent)}: kvlab cannot estimate the "
                      f"weights per rank, so it cannot tell whether the {exp.weights_gib:.2f} GiB loading took is "
                      f"the weights or holds more (memory still in use when SGLang read free memory after loading: "
                      f"the finding-1 signature, resident_after_load, with the tokens it cost); a TP what-if and the "
                      "engine comparison need them too",
                      missing_fields=list(absent)))
        return
    expected = config.weight_bytes_per_rank(exp.tp_size) / GiB
    extra = exp.weights_gib - expected
    if extra > max(0.5, 0.05 * expected):
        lost = int(extra * GiB) // exp.cell_size_bytes
        fix = ("0.5.23 calls gc.collect() before this reading" if not at_least(exp.version, "0.5.23")
               else "this version already collects garbage first: look for other allocations")
        out.append(_f("resident_after_load", "warning",
                      f"{exp.weights_gib:.2f} GiB went in loading, {extra:.2f} GiB more than the weights "
                      f"({expected:.2f} GiB per rank from the config): memory still held when SGLang read free memory "
                      f"after loading — the finding-1 signature (loader temporaries not yet garbage-collected). It "
                      f"cost about {lost:,} tokens. See notebooks/01_kv_pool_sizing.ipynb and `kvlab repro "
                      f"kv-pool-sizing --compare`; {fix}", extra_gib=round(extra, 3), tokens_lost=lost))
    elif extra < -max(0.5, 0.1 * expected):
        out.append(_f("weights_smaller", "info", f"loading took {exp.weights_gib:.2f} GiB, less than the "
                      f"{expected:.2f} GiB the config's {config.weight_dtype} weights need per rank: a quantized "
                      f"checkpoint, or a config that does not match the served model"))


def _names(fields) -> str:
    return ", ".join(f"'{f}'" for f in fields)


def _context(exp, out: list) -> None:
    pool = exp.max_total_num_tokens_logged or exp.max_total_num_tokens_computed
    if exp.context_len is None and exp.model_config is not None and exp.model_config.lacks(
            ("max_position_embeddings",)):
        out.append(_f("context_unchecked", "info", f"no context length: the log prints no context_len and the config "
                      f"has no 'max_position_embeddings': kvlab cannot say whether the {pool:,}-token pool is "
                      f"smaller than the context (then prompts that long are refused: pool_below_context)",
                      missing_fields=["max_position_embeddings"]))
        return
    if not exp.context_len or not pool or pool >= exp.context_len:
        return
    p = exp.pool
    budget = KVBudget(int(p.before_gib * GiB), int(p.after_gib * GiB), p.mem_fraction_static, int(p.slack_gib * GiB),
                      int(max(p.rest_gib, 0) * GiB), p.cell_size_bytes, p.page_size, exp.context_len, pool)
    limit = budget.max_req_input_len
    out.append(_f("pool_below_context", "warning",
                  f"the pool holds {pool:,} tokens, fewer than the context length {exp.context_len:,}: prompts of "
                  f"{limit:,} tokens or more are refused with SGLang's message "
                  f"{budget.validate_input_length(max(1, min(exp.context_len - 1, pool)))!r}",
                  max_req_input_len=limit))


def _ranks(log: SGLangStartup, out: list) -> None:
    ranks = [r for r in log.ranks.values() if r.before_gib is not None and r.after_gib is not None]
    cut = [r.label for r in log.ranks.values() if r.before_gib is not None and r.after_gib is None]
    if cut:
        out.append(_f("incomplete_ranks", "warning", f"{', '.join(cut)} printed 'Load weight begin' but no 'Load weight "
                      f"end': the log is cut or those ranks failed; the minimum is taken over the "
                      f"{len(ranks)} rank(s) with both readings", ranks=cut))
    if len(ranks) > 1:
        for attr, what in (("before_gib", "free before load"), ("after_gib", "free after load")):
            values = {r.label: getattr(r, attr) for r in ranks}
            if max(values.values()) - min(values.values()) > 0.011:
                low = min(values, key=values.get)
                out.append(_f("ranks_disagree", "warning", f"ranks differ in {what}: {min(values.values()):.2f}–"
                              f"{max(values.values()):.2f} GiB; SGLang uses the minimum ({low}), so every rank's pool "
                              f"is sized by the fullest GPU", values=values))
    pools = {r.label: r.max_total_num_tokens for r in log.ranks.values() if r.max_total_num_tokens is not None}
    if len(set(pools.values())) > 1:
        out.append(_f("ranks_disagree", "warning", f"ranks logged different pool sizes {sorted(set(pools.values()))}: "
                      f"separate data-parallel groups, or a log mixing runs", values=pools))


def _interval(exp, out: list) -> None:
    logged, (lo, hi) = exp.max_total_num_tokens_logged, exp.computed_range
    if logged is None or lo <= logged <= hi:
        return
    near = lo if logged < lo else hi
    gap_gib = (near - logged) * exp.cell_size_bytes / GiB
    gaps = reading_gaps(exp.version or exp.rules_version)
    counted = [t["name"] for k in ("pre_load_terms", "post_load_terms") for t in exp.extra.get(k) or []]
    before_steps = "; ".join(gaps.before_steps) or "none"
    after_steps = "; ".join(gaps.after_steps) or "none"
    need_after = abs(gap_gib) * 1024
    need_before = need_after / max(1e-9, 1 - exp.mem_fraction_static)
    if any(f.id == "cell_mismatch" for f in out):  # the config, not the readings, is what disagrees
        out.append(_f("outside_interval", "warning",
                      f"logged {logged:,} tokens is outside the {lo:,}–{hi:,} the printed readings allow with this "
                      f"config's cell: the config contradicts the log (cell_mismatch), so choose the served model's "
                      f"config before reading anything into the gap", gap_gib=round(gap_gib, 4)))
        return
    causes = [f"free memory changed between the readings SGLang printed and the unprinted ones it used (sglang "
              f"{gaps.read} source): the pool uses {gaps.total_reading}, taken before 'Load weight begin' — steps "
              f"between: {before_steps} — and {gaps.post_reading}, taken after 'Load weight end' — steps between: "
              f"{after_steps}" + (f" (counted: {', '.join(counted)})" if counted else "") + ". "
              f"The logged pool needs about {need_after:.1f} MiB {'allocated' if logged < lo else 'freed'} between "
              f"'Load weight end' and the second unprinted reading, or {need_before:.0f} MiB between the first and "
              f"'Load weight begin' (or a mix), beyond the print rounding and the counted terms; where the steps above do "
              f"not account for that, another process on the card is the remaining cause"]
    if exp.fraction_from_default:
        causes.append("the version default for mem_fraction_static may not be the one the server used")
    if exp.model_config is not None:
        causes.append("the config or KV dtype may not match the served model")
    out.append(_f("outside_interval", "warning",
                  f"logged {logged:,} tokens is outside the {lo:,}–{hi:,} the printed readings allow: "
                  f"{abs(near - logged):,} tokens = {abs(gap_gib):.3f} GiB {'less' if logged < lo else 'more'} than "
                  f"the readings give. Possible causes: " + "; ".join(causes), gap_gib=round(gap_gib, 4)))


def _cell_check(exp, log: SGLangStartup, out: list) -> None:
    if exp.model_config is None:
        return
    for r in log.ranks.values():
        total = (r.k_gib + r.v_gib) if r.k_gib is not None else r.kv_gib
        tokens = r.kv_tokens or r.max_total_num_tokens
        if total and tokens:
            _, lo, hi = cell_from_logged_sizes(total, tokens + exp.page_size, 2 if r.k_gib is not None else 1)
            if not lo <= exp.cell_size_bytes <= hi:
                out.append(_f("cell_mismatch", "error", f"the config gives {exp.cell_size_bytes:,} B per token but "
                              f"the log's K/V sizes (line {r.lines.get('kv')}) allow {lo:,}–{hi:,} B: the config "
                              f"contradicts the log (a different model, KV dtype or TP)", logged_cell_range=[lo, hi]))
            return


def _shared(exp, out: list) -> None:
    device = exp.device
    if device is None or exp.avail_before_load_gib is None:
        return
    # the card's total as CUDA reports it (the free reading's own scale, and the comparison waterfall's), not
    # nvidia-smi's larger figure, which would count 0.46 GiB on an H100 as "in use"
    total = torch_total(device).gib
    held = total - exp.avail_before_load_gib
    if held < -0.5:
        out.append(_f("gpu_mismatch", "warning", f"{exp.avail_before_load_gib:.2f} GiB free before load is more than "
                      f"the {device.name}'s {total:.2f} GiB: the GPU is not a {device.description}"))
    elif held > 4 * CONTEXT_GIB:
        claim = ("another process shares this GPU, and its memory can change between SGLang's readings"
                 if not exp.rests_on("free_before_load") else "if the server had printed that reading, another "
                 "process would share this GPU; the reading was rebuilt, so this says nothing about the server")
        out.append(_f("shared_gpu", "info", f"{held:.2f} GiB of the {total:.2f} GiB {device.description} was in use "
                      f"before loading (a CUDA context takes about {CONTEXT_GIB} GiB): {claim}",
                      held_gib=round(held, 2)))
