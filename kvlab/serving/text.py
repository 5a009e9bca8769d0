"""``kvlab explain-log`` as text: the readings, the waterfall, logged vs computed, findings, what-ifs."""

from __future__ import annotations

import textwrap

from kvlab.units import GiB, fmt_bytes, is_zero_text

WIDTH = 118  # findings wrap here: no 1,500-character line in a terminal


def signed_gib(gib: float) -> str:
    """A signed amount given in GiB, in the unit its size needs (``-2.00 MiB``, not ``-0.00 GiB``), never a
    signed zero."""
    text = f"{abs(gib):.2f} GiB"  # GiB for the big terms, so the column reads as one unit
    if abs(gib) < 1 and round(abs(gib) * GiB) >= 1:
        text = fmt_bytes(round(abs(gib) * GiB))
    return ("" if is_zero_text(text) else "+" if gib > 0 else "-") + text


def _why_verdict(exp) -> str:
    """Which check decided the verdict: the cell the range was computed with, and what the log's own K/V sizes
    allow where a config's cell decides it (without a config the check is the wider K/V-size one)."""
    lo, hi = exp.cell_range
    if exp.consistent is None or exp.engine != "sglang":
        return ""
    if lo != hi:
        return (f" (cell from the log's K/V sizes: {lo:,}–{hi:,} B, a wide check; a config's exact cell "
                f"checks tighter)")
    kv = exp.extra.get("kv_sizes_cell_range")
    kv_range = exp.extra.get("kv_sizes_computed_range")
    if not kv or not kv_range:
        return f" (with the config's cell, {lo:,} B)"
    logged = exp.max_total_num_tokens_logged
    inside = kv_range[0] <= logged <= kv_range[1]
    if exp.consistent or not inside:
        return f" (with the config's cell, {lo:,} B)"
    return (f" (with the config's cell, {lo:,} B; the log's own K/V sizes allow {kv[0]:,}–{kv[1]:,} B and "
            f"{kv_range[0]:,}–{kv_range[1]:,} tokens, which hold the logged pool: that wider check passes without "
            f"a config; see outside_interval)")


def _tokens(n) -> str:
    return "—" if n is None else f"{n:,}"


def format_explanation(exp) -> str:
    j = exp.to_json()
    engine = "SGLang" if exp.engine == "sglang" else "vLLM"
    version = exp.version or (f"? (rules of {exp.rules_version})" if exp.rules_version else "?")
    out = [f"explain-log · {exp.log_path}",
           *textwrap.wrap(f"{engine} {version} ({exp.version_source}) · TP {exp.tp_size} ({exp.tp_size_source})"
                          + (f" · GPU {exp.gpu}" if exp.gpu else "") + (f" · model {exp.model}" if exp.model else ""),
                          WIDTH, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False)]
    if exp.engine == "sglang":
        n = sum(1 for r in exp.ranks if r["avail_before_load_gib"] is not None)
        out += [f"  mem_fraction_static {exp.mem_fraction_static} — {exp.mem_fraction_static_source}",
                f"  readings (GiB, minimum over {n} rank{'s' if n != 1 else ''}): free before load "
                f"{exp.avail_before_load_gib:.2f}, free after load {exp.avail_after_load_gib:.2f}"]
    else:
        out.append(f"  gpu_memory_utilization {j.get('gpu_memory_utilization')} · block size {j.get('block_size')} "
                   f"({j.get('block_size_source')})")
    out += textwrap.wrap(f"cell size {exp.cell_size_bytes:,} B/token — {exp.cell_size_source}", WIDTH,
                         initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False)
    out.append("  waterfall:" + (" (* = rests on an assumed value)" if any(t.assumed for t in exp.terms()) else ""))
    for term in exp.terms():
        gib = "—" if term.gib is None else signed_gib(term.gib)
        out.append(f"    {term.name:<40} {gib:>14}{'*' if term.assumed else ' '}  {term.how}")
    lo, hi = exp.computed_range
    verdict = {True: "consistent", False: "NOT consistent", None: "nothing logged to compare"}[exp.consistent]
    if exp.consistency_rests_on and exp.consistent is not None:
        verdict += " (assumed: rests on rebuilt readings, chosen to give the logged pool)"
    verdict += _why_verdict(exp)
    out += textwrap.wrap(f"max_total_num_tokens: logged {_tokens(exp.max_total_num_tokens_logged)} · computed "
                         f"{_tokens(exp.max_total_num_tokens_computed)} · print-rounding range {lo:,}–{hi:,} · "
                         f"{verdict}", WIDTH, initial_indent="  ", subsequent_indent="      ",
                         break_on_hyphens=False)
    if exp.findings:
        out.append("  findings:")
        for f in exp.findings:  # wrapped: one finding can be a paragraph (outside_interval's causes)
            line = (f"[{f.severity}{' · assumed' if f.assumed else ''}] {f.id}: {f.message}"
                    + (f" (assumed: rests on {'; '.join(f.assumed)})" if f.assumed else ""))
            out += textwrap.wrap(line, WIDTH, initial_indent="    ", subsequent_indent="        ",
                                 break_on_hyphens=False)
    if exp.assumed:
        whys = dict.fromkeys((exp.extra.get("reconstructed") or {}).values())
        out.append("  assumed inputs: " + "; ".join(exp.assumed.values()) + (f" — {'; '.join(whys)}" if whys else ""))
    if exp.what_if:
        out.append("  what if:")
        for w in exp.what_if:
            out.append(f"    {w.label:<28} → {w.max_total_num_tokens:>12,} tokens ({w.change:+,})"
                       + (f"  {w.note}" if w.note else ""))
    return "\n".join(out)


def format_comparison(comp) -> str:
    """``kvlab explain-log --compare-engines``: both budgets term by term, then the gap by kind."""
    out = [f"  SGLang vs vLLM, same model, GPU and TP {comp.tp_size} "
           f"(cell {comp.sglang.cell_size_bytes:,} / {comp.vllm.cell_size_bytes:,} B/token):"]
    for budget in (comp.sglang, comp.vllm):
        logged = comp.logged.get(budget.engine)
        out.append(f"    {'SGLang' if budget.engine == 'sglang' else 'vLLM'} — {budget.rule}")
        for term in budget.terms:
            out.append(f"      {term.name:<44} {term.gib:+9.2f} GiB{'*' if term.assumed else ' '}  {term.how}")
        out.append(f"      → {budget.tokens:,} tokens" + (f" (log: {logged:,})" if logged is not None else ""))
        out += [f"      note: {n}" for n in budget.notes]
    ratio = f"{comp.ratio:.2f}×" if comp.ratio else "—"
    out.append(f"    gap {comp.sglang.tokens - comp.vllm.tokens:+,} tokens (SGLang / vLLM = {ratio}), by term:")
    for row in comp.gap:
        out.append(f"      {row['what']:<76} {row['gib']:+7.2f} GiB {row['tokens']:+10,} tokens"
                   + ("*" if row.get("assumed") else ""))
    under = dict.fromkeys(a for b in (comp.sglang, comp.vllm) for t in b.terms for a in t.assumed)
    if under:
        out.append(f"    * rests on an assumed value: {'; '.join(under)}")
    return "\n".join(out)
