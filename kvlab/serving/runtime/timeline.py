"""The timeline of a runtime log: KV pool occupancy, running and queued requests, the prefix-cache hit rate per
batch and cumulative, throughput, and the retraction / preemption events, per rank.

The hit rate is token-weighted as SGLang computes it (0.4.0 scheduler.py ``log_prefill_stats``'s
``tree_cache_metrics``; 0.5.x ``metrics_reporter.py``'s ``cache_hit_rate``): Σ #cached-token / Σ (#new-token +
#cached-token) over the Prefill lines. Where several TP ranks of one data-parallel group print the same
scheduler's lines, the lowest TP rank of each (DP, PP) group is counted (``primary_ranks``); the others stay in
the per-rank frame.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvlab.serving.runtime.reader import COLUMNS, KINDS, RuntimeLog

_PART = re.compile(r"\b(DP|PP|TP)(\d+)\b|gpu_id=(\d+)|gpu=(\d+)")


def primary_ranks(ranks: list[str]) -> list[str]:
    """The lowest TP rank of each (DP, PP) group: the one whose lines count once in the totals."""
    best: dict = {}
    for label in ranks:
        parts = {m.group(1) or "TP": int(next(g for g in m.groups()[1:] if g is not None))
                 for m in _PART.finditer(label)}
        group = (label if label.startswith("Engine") else None, parts.get("DP"), parts.get("PP"))
        tp = parts.get("TP", 0)
        if group not in best or tp < best[group][0]:
            best[group] = (tp, label)
    return [label for _, label in sorted(best.values(), key=lambda x: ranks.index(x[1]))]


@dataclass
class RuntimeTimeline:
    log: RuntimeLog
    frame: pd.DataFrame  # one row per step line; see :func:`build_timeline`
    pool_tokens: int | None
    pool_source: str | None
    primary: list[str] = field(default_factory=list)
    time_axis: str = "t_s"  # "t_s" when every step has a timestamp, else "line"

    @property
    def prefill(self) -> pd.DataFrame:
        return self.frame[(self.frame["kind"] == "prefill") & self.frame["rank"].isin(self.primary)]

    def hit_tokens(self) -> tuple[int, int]:
        """(Σ #cached-token, Σ #new-token) over the primary ranks' Prefill lines."""
        p = self.prefill
        return int(p["cached_token"].sum()), int(p["new_token"].sum())

    def overall_hit_rate(self) -> float | None:
        cached, new = self.hit_tokens()
        return cached / (cached + new) if cached + new else None


def build_timeline(log: RuntimeLog, pool_tokens: int | None = None, pool_source: str | None = None) -> RuntimeTimeline:
    """The per-step frame of ``log``. ``pool_tokens``: the KV pool's size in tokens (else the log's own
    ``max_total_num_tokens`` / ``GPU KV cache size`` line); with it, usage is also given in tokens."""
    if pool_tokens is None and log.pool_tokens is not None:
        pool_tokens, pool_source = log.pool_tokens, f"{log.path}:{log.pool_line}"
    data = {"line": np.frombuffer(log.line, dtype=np.int64) if log.n_steps else np.zeros(0, np.int64),
            "t_s": np.array(log.t, dtype=float) - log.t0,
            "rank": pd.Categorical.from_codes(np.array(log.rank, dtype=np.int16), categories=log.ranks or [""])
            if log.n_steps else pd.Categorical([]),
            "kind": pd.Categorical.from_codes(np.array(log.kind, dtype=np.int8), categories=list(KINDS))
            if log.n_steps else pd.Categorical([])}
    for column in COLUMNS:
        data[column] = np.array(log.cols[column], dtype=float)
    frame = pd.DataFrame(data)
    total = frame["new_token"] + frame["cached_token"]
    frame["batch_hit_rate"] = (frame["cached_token"] / total).where(total > 0)
    frame["used_tokens_est"] = frame["used_tokens"]
    if pool_tokens:
        frame["used_tokens_est"] = frame["used_tokens"].fillna(frame["usage"] * pool_tokens)
    frame["cum_hit_rate"] = np.nan
    for _, rows in frame[frame["kind"] == "prefill"].groupby("rank", sort=False, observed=True):
        cached = rows["cached_token"].cumsum()
        seen = cached + rows["new_token"].cumsum()
        frame.loc[rows.index, "cum_hit_rate"] = (cached / seen).where(seen > 0)
    axis = "t_s" if log.n_steps and not frame["t_s"].isna().any() else "line"
    return RuntimeTimeline(log, frame, pool_tokens, pool_source, primary_ranks(log.ranks), axis)


def counted_retractions(log: RuntimeLog) -> list:
    """The retraction lines counted once: each (DP, PP) group's lowest TP rank among those that printed one
    (every TP rank of a group prints the same retraction)."""
    ranks = list(dict.fromkeys(e.rank for e in log.events if e.kind == "retract"))
    keep = set(primary_ranks(ranks))
    return [e for e in log.events if e.kind == "retract" and e.rank in keep]


def _finite(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _at_max(frame: pd.DataFrame, column: str) -> dict | None:
    rows = frame[column].dropna()
    if rows.empty:
        return None
    i = rows.idxmax()
    return {"max": float(rows[i]), "line": int(frame.at[i, "line"]), "rank": frame.at[i, "rank"]}


def summary(tl: RuntimeTimeline) -> dict:
    """The timeline in numbers (``kvlab explain-log --json``'s ``runtime`` section)."""
    log, f = tl.log, tl.frame
    main = f[f["rank"].isin(tl.primary)]
    cached, new = tl.hit_tokens()
    per_rank = {}
    for rank, rows in f[f["kind"] == "prefill"].groupby("rank", sort=False, observed=True):
        c, n = int(rows["cached_token"].sum()), int(rows["new_token"].sum())
        per_rank[rank] = {"prefill_lines": len(rows), "cached_tokens": c, "new_tokens": n,
                          "hit_rate": c / (c + n) if c + n else None}
    retracts = counted_retractions(log)
    out = {
        "engine": log.engine, "lines": log.n_lines, "time_axis": tl.time_axis,
        "steps": {k: int((f["kind"] == k).sum()) for k in KINDS if (f["kind"] == k).any()},
        "ranks": log.ranks, "primary_ranks": tl.primary,
        "duration_s": _finite(main["t_s"].max() - main["t_s"].min()) if len(main) and tl.time_axis == "t_s" else None,
        "pool_tokens": tl.pool_tokens, "pool_source": tl.pool_source,
        "hit_rate": {"cached_tokens": cached, "new_tokens": new, "overall": tl.overall_hit_rate(),
                     "per_rank": per_rank},
        "usage": _at_max(main, "usage"), "used_tokens": _at_max(main, "used_tokens_est"),
        "running": _at_max(main, "running"), "queue": _at_max(main, "queue"),
        "throughput": {"prefill_mean_tok_s": _finite(main["prefill_tput"].mean()),
                       "decode_mean_tok_s": _finite(main["gen_tput"].mean())},
        "events": {"retraction_lines": len(retracts), "requests_retracted": sum(e.count for e in retracts),
                   "preemptions": sum(e.count for e in log.events if e.kind == "preempt"),
                   "preemptions_cumulative_printed": max((e.total for e in log.events if e.total), default=None),
                   "first": [e.to_json() for e in log.events[:20]]},
        "skipped": {"count": log.n_skipped, "first": [{"line": n, "why": w} for n, w in log.skipped]},
        "cut_lines": log.cut_lines,
        "unknown_fields": {k: {"count": v, "first_line": log.unknown_first[k]}
                           for k, v in log.unknown_fields.most_common()},
        "other_lines": log.other_lines,
    }
    if log.engine == "vllm":
        last = main["logged_hit_rate"].dropna()
        out["hit_rate"]["last_printed"] = float(last.iloc[-1]) if len(last) else None
    return out
