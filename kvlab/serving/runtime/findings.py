"""What a runtime timeline shows, each finding with the log lines it rests on and what the log alone cannot say.

Thresholds are named constants; each finding is a plain dict (``kvlab explain-log --json``'s
``runtime.findings``): ``name``, ``text``, ``lines`` (the first and last line it rests on, and a few between),
``cannot_know``.
"""

from __future__ import annotations

import pandas as pd

from kvlab.serving.runtime.timeline import RuntimeTimeline, counted_retractions

FULL = 0.95  # token usage at or above this: the pool is "near full"
LOW = 0.5  # token usage below this: memory is not what holds the queue back
SMALL = 0.25  # the peak usage under this over the whole log: the pool is far larger than the load
MIN_PREFILLS = 5  # prefill lines on each side before the hit rates are compared
HIT_DROP = 0.10  # the hit rate near full lower than elsewhere by at least this
MIN_STEPS = 10  # step lines a "pool far larger" finding needs


def find(tl: RuntimeTimeline) -> list[dict]:
    main = tl.frame[tl.frame["rank"].isin(tl.primary)]
    out = []
    for rule in (_retracted, _hit_fell_when_full, _queue_at_low_usage, _pool_oversized):
        finding = rule(tl, main)
        if finding:
            out.append(finding)
    return out


def _lines(rows) -> list[int]:
    lines = [int(x) for x in rows]
    return lines if len(lines) <= 6 else lines[:3] + lines[-3:]


def _retracted(tl: RuntimeTimeline, main: pd.DataFrame) -> dict | None:
    events = counted_retractions(tl.log) or [e for e in tl.log.events if e.kind == "preempt"]
    if not events:
        return None
    n = sum(e.count for e in events)
    ratios = [(e.ratio_before, e.ratio_after) for e in events if e.ratio_before is not None]
    when = (f" between t={events[0].t:.0f} s and t={events[-1].t:.0f} s" if events[0].t == events[0].t else "")
    text = (f"The KV pool ran full: {len(events)} {'retraction' if events[0].kind == 'retract' else 'preemption'} "
            f"line(s){when}, {n} request(s) sent back to the queue to be prefilled again")
    if ratios:
        last = f" at the first and {ratios[-1][0]:.4f} -> {ratios[-1][1]:.4f} at the last" if len(ratios) > 1 else ""
        text += (f"; new_token_ratio went {ratios[0][0]:.4f} -> {ratios[0][1]:.4f}{last} (SGLang reserves that "
                 f"share of each running request's remaining output before it admits more)")
    return {"name": "pool_full_retracted", "text": text, "lines": _lines(e.line for e in events),
            "count": n, "cannot_know": "which requests were retracted and how long they waited again; vLLM V0 prints "
            "the preemption warning at the 1st, 51st, 101st... preemption only (scheduler.py; its "
            "total_num_cumulative_preemption is the count so far), V1 a count per stats line"}


def _hit_fell_when_full(tl: RuntimeTimeline, main: pd.DataFrame) -> dict | None:
    # a prefill line is read against the last usage its rank printed before it
    before = main.groupby("rank", observed=True)["usage"].shift(1).groupby(main["rank"], observed=True).ffill().fillna(0.0)
    prefill = main[(main["kind"] == "prefill")]
    if prefill.empty:
        return None
    full = prefill[before.loc[prefill.index] >= FULL]
    rest = prefill.drop(full.index)
    if len(full) < MIN_PREFILLS or len(rest) < MIN_PREFILLS:
        return None

    def rate(rows):
        c, n = rows["cached_token"].sum(), rows["new_token"].sum()
        return c / (c + n) if c + n else 0.0

    high, low = rate(full), rate(rest)
    if low - high < HIT_DROP:
        return None
    return {"name": "hit_rate_fell_when_full",
            "text": f"The hit rate fell while the pool sat near full: {high:.1%} over {len(full)} prefill lines "
                    f"after a usage of {FULL} or more, {low:.1%} over the {len(rest)} others (eviction pressure: "
                    f"cached prefixes were evicted to make room)",
            "lines": _lines(full["line"]), "hit_rate_full": high, "hit_rate_rest": low,
            "cannot_know": "whether the prompts still shared prefixes then (the workload may have changed); "
                           "SGLang's token usage leaves out evictable cached tokens, so how much cache was "
                           "evicted is not in the log"}


def _queue_at_low_usage(tl: RuntimeTimeline, main: pd.DataFrame) -> dict | None:
    best = None
    for _, rows in main[["line", "rank", "usage", "queue", "running"]].dropna(subset=["usage", "queue"]).groupby(
            "rank", sort=False, observed=True):
        low = (rows["usage"] < LOW) & (rows["queue"] > 0)
        run_id = (low != low.shift()).cumsum()
        for _, run in rows[low].groupby(run_id[low]):
            growth = run["queue"].iloc[-1] - run["queue"].iloc[0]
            if len(run) >= 3 and growth > 0 and (best is None or growth > best[0]):
                best = (growth, run)
    if best is None:
        return None
    growth, run = best
    return {"name": "queue_grew_at_low_usage",
            "text": f"The queue grew from {run['queue'].iloc[0]:.0f} to {run['queue'].iloc[-1]:.0f} while token "
                    f"usage stayed under {LOW} (at most {run['usage'].max():.2f}, {run['running'].max():.0f} "
                    f"running): memory did not hold these requests back",
            "lines": _lines(run["line"]),
            "cannot_know": "which limit did (max_running_requests, the prefill token budget "
                           "max_prefill_tokens / chunked_prefill_size, the new_token_ratio reservation or the "
                           "arrival burst itself); the server's settings are in its start-up lines, not here"}


def _pool_oversized(tl: RuntimeTimeline, main: pd.DataFrame) -> dict | None:
    usage = main["usage"].dropna()
    if len(usage) < MIN_STEPS or usage.max() >= SMALL:
        return None
    peak = main.loc[usage.idxmax()]
    tokens = f" ({peak['usage'] * tl.pool_tokens:,.0f} of {tl.pool_tokens:,} tokens)" if tl.pool_tokens else ""
    return {"name": "pool_larger_than_load",
            "text": f"The pool was far larger than this load used: the peak token usage was {usage.max():.2f}"
                    f"{tokens} over {len(usage)} step lines",
            "lines": [int(peak["line"])],
            "cannot_know": "a peak between printed steps (SGLang prints a Decode line every decode_log_interval "
                           "steps, 40 by default) or a heavier load later; the radix cache's evictable tokens "
                           "are not in token usage, so a larger pool may still have raised the hit rate"}
