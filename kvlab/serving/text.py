"""``kvlab explain-log`` as text: the readings, the waterfall, logged vs computed, findings, what-ifs."""

from __future__ import annotations


def _tokens(n) -> str:
    return "—" if n is None else f"{n:,}"


def format_explanation(exp) -> str:
    j = exp.to_json()
    engine = "SGLang" if exp.engine == "sglang" else "vLLM"
    version = exp.version or (f"? (rules of {exp.rules_version})" if exp.rules_version else "?")
    out = [f"explain-log · {exp.log_path}",
           f"  {engine} {version} ({exp.version_source}) · TP {exp.tp_size} ({exp.tp_size_source})"
           + (f" · GPU {exp.gpu}" if exp.gpu else "") + (f" · model {exp.model}" if exp.model else "")]
    if exp.engine == "sglang":
        n = sum(1 for r in exp.ranks if r["avail_before_load_gib"] is not None)
        out += [f"  mem_fraction_static {exp.mem_fraction_static} — {exp.mem_fraction_static_source}",
                f"  readings (GiB, minimum over {n} rank{'s' if n != 1 else ''}): free before load "
                f"{exp.avail_before_load_gib:.2f}, free after load {exp.avail_after_load_gib:.2f}"]
    else:
        out.append(f"  gpu_memory_utilization {j.get('gpu_memory_utilization')} · block size {j.get('block_size')} "
                   f"({j.get('block_size_source')})")
    out.append(f"  cell size {exp.cell_size_bytes:,} B/token — {exp.cell_size_source}")
    out.append("  waterfall:" + (" (* = rests on an assumed value)" if any(t.assumed for t in exp.terms()) else ""))
    for term in exp.terms():
        gib = "—" if term.gib is None else f"{term.gib:+10.2f} GiB"
        out.append(f"    {term.name:<40} {gib:>14}{'*' if term.assumed else ' '}  {term.how}")
    lo, hi = exp.computed_range
    verdict = {True: "consistent", False: "NOT consistent", None: "nothing logged to compare"}[exp.consistent]
    if exp.consistency_rests_on and exp.consistent is not None:
        verdict += " (assumed: rests on rebuilt readings, chosen to give the logged pool)"
    out.append(f"  max_total_num_tokens: logged {_tokens(exp.max_total_num_tokens_logged)} · computed "
               f"{_tokens(exp.max_total_num_tokens_computed)} · print-rounding range {lo:,}–{hi:,} · {verdict}")
    if exp.findings:
        out.append("  findings:")
        out += [f"    [{f.severity}{' · assumed' if f.assumed else ''}] {f.id}: {f.message}"
                + (f" (assumed: rests on {'; '.join(f.assumed)})" if f.assumed else "") for f in exp.findings]
    if exp.assumed:
        whys = dict.fromkeys((exp.extra.get("reconstructed") or {}).values())
        out.append("  assumed inputs: " + "; ".join(exp.assumed.values()) + (f" — {'; '.join(whys)}" if whys else ""))
    if exp.what_if:
        out.append("  what if:")
        for w in exp.what_if:
            out.append(f"    {w['what_if']:<28} → {w['max_total_num_tokens']:>12,} tokens ({w['change']:+,})"
                       + (f"  {w['note']}" if w['note'] else ""))
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
