"""A runtime log read, timed and explained in one call (``kvlab explain-log``'s ``runtime`` section, notebook 05),
and its text."""

from __future__ import annotations

import textwrap

from kvlab.serving.runtime.findings import find
from kvlab.serving.runtime.reader import read_runtime_log, read_runtime_text
from kvlab.serving.runtime.timeline import RuntimeTimeline, build_timeline, summary
from kvlab.serving.sglang_log import LogError

WIDTH = 118


def runtime_timeline(path=None, *, text: str | None = None, name: str = "<log>",
                     pool_tokens: int | None = None, pool_source: str | None = None) -> RuntimeTimeline:
    """The timeline of the log at ``path`` (or of ``text``); ``pool_tokens``: the pool's size from the start-up
    explanation, where there is one."""
    log = read_runtime_log(path) if text is None else read_runtime_text(text, name)
    return build_timeline(log, pool_tokens, pool_source)


def has_readings(tl: RuntimeTimeline) -> bool:
    """True when a runtime line was read; False when the log has none; a LogError naming the first line when it
    has runtime lines and none could be read."""
    if tl.log.n_steps or tl.log.events:
        return True
    if tl.log.n_skipped:
        line, why = tl.log.skipped[0]
        raise LogError(f"{tl.log.where(line)}: no runtime line could be read ({tl.log.n_skipped} skipped; the "
                       f"first: {why})")
    return False


def runtime_json(tl: RuntimeTimeline) -> dict:
    out = summary(tl)
    out["findings"] = find(tl)
    return out


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def format_runtime(data: dict) -> str:
    """``runtime_json``'s dict as the text ``kvlab explain-log`` prints."""
    steps = ", ".join(f"{n:,} {k}" for k, n in data["steps"].items()) or "none"
    lines = [f"Runtime ({data['engine']}): {steps} step lines of {data['lines']:,}; ranks "
             f"{', '.join(r or '(untagged)' for r in data['ranks']) or '-'}"
             + (f" (counted once per group: {', '.join(r or '(untagged)' for r in data['primary_ranks'])})"
                if len(data["primary_ranks"]) < len(data["ranks"]) else "")]
    if data["duration_s"] is not None:
        lines.append(f"  span: {data['duration_s']:,.0f} s")
    hit = data["hit_rate"]
    if hit["cached_tokens"] + hit["new_tokens"]:
        lines.append(f"  prefix-cache hit rate: {_pct(hit['overall'])} = Σ cached {hit['cached_tokens']:,} / "
                     f"Σ (new + cached) {hit['cached_tokens'] + hit['new_tokens']:,} tokens")
    ranks = {r: v for r, v in hit["per_rank"].items() if r in data["primary_ranks"]}
    if len(ranks) > 1:  # data-parallel ranks: each its own scheduler and cache
        lines.append("  per rank: " + ", ".join(f"{r} {_pct(v['hit_rate'])} ({v['prefill_lines']:,} prefill lines)"
                                               for r, v in ranks.items()))
    if hit.get("last_printed") is not None:
        lines.append(f"  prefix-cache hit rate, last printed by vLLM: {_pct(hit['last_printed'])}")
    pool = f" of a {data['pool_tokens']:,}-token pool ({data['pool_source']})" if data["pool_tokens"] else ""
    for key, what in (("usage", "token usage"), ("running", "running requests"), ("queue", "queued requests")):
        if data[key]:
            value = f"{data[key]['max']:.2f}" if key == "usage" else f"{data[key]['max']:,.0f}"
            lines.append(f"  peak {what}: {value} (line {data[key]['line']}){pool if key == 'usage' else ''}")
    tput = data["throughput"]
    if tput["prefill_mean_tok_s"] is not None or tput["decode_mean_tok_s"] is not None:
        lines.append("  mean throughput: " + ", ".join(
            f"{w} {v:,.1f} tok/s" for w, v in (("prefill", tput["prefill_mean_tok_s"]),
                                               ("decode", tput["decode_mean_tok_s"])) if v is not None))
    ev = data["events"]
    if ev["retraction_lines"] or ev["preemptions"]:
        lines.append(f"  retractions: {ev['retraction_lines']} line(s), {ev['requests_retracted']} request(s); "
                     f"preemption warnings: {ev['preemptions']}")
    lines += _unread(data)
    for f in data["findings"]:
        body = f"{f['text']} [lines {', '.join(map(str, f['lines']))}]. Cannot know: {f['cannot_know']}."
        lines.append(textwrap.fill(body, WIDTH, initial_indent="  - ", subsequent_indent="    "))
    if "replay_text" in data:  # kvlab explain-log --replay (kvlab.experiments.runtime_replay)
        lines += ["", data["replay_text"]]
    return "\n".join(lines)


def _unread(data: dict) -> list[str]:
    out = []
    if data["skipped"]["count"]:
        first = "; ".join(f"line {s['line']}: {s['why']}" for s in data["skipped"]["first"][:5])
        out.append(textwrap.fill(f"skipped {data['skipped']['count']} runtime line(s) kvlab could not read "
                                 f"({first})", WIDTH, initial_indent="  ", subsequent_indent="    "))
    if data["cut_lines"]:
        out.append(f"  read {len(data['cut_lines'])} line(s) cut short after their last full field "
                   f"(lines {', '.join(map(str, data['cut_lines'][:10]))})")
    if data["unknown_fields"]:
        names = ", ".join(f"{k!r} ×{v['count']} (first line {v['first_line']})"
                          for k, v in list(data["unknown_fields"].items())[:8])
        out.append(textwrap.fill(f"fields kvlab does not know, not read: {names}", WIDTH,
                                 initial_indent="  ", subsequent_indent="    "))
    return out
