"""What-ifs on a real server's load (issue 36): a request trace derived from its runtime log, replayed through
kvlab's scheduler with the server's pool, compared with what the log says, then replayed again with one thing
changed (a larger pool, a host tier, full eviction).

The log does not hold the requests, so the trace assumes (each assumption is in ``Replay.assumptions``):

- a Prefill line's ``#new-seq`` requests arrive at that line's time (the log has no arrival times; the queueing
  before it is lost) and share its ``#new-token + #cached-token`` evenly; a chunked prompt's later chunks count as
  new requests (SGLang counts the chunked request in ``#new-seq`` again);
- each request's cached tokens are a prefix it shares with the latest earlier request long enough to hold it
  (which requests shared what is not in the log), the rest unique tokens;
- every request generates the mean output the Decode lines imply: each Decode line stands for
  ``decode_log_interval`` (40) steps of ``#running-req`` tokens each, spread over all requests;
- the first primary rank's lines only (one scheduler).

The comparison uses the log's own definitions: the hit rate Σ cached / Σ (new + cached) over prefill steps, the
token usage ``(pool − available − evictable) / pool`` at each step, the retraction count.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from kvlab.units import POW2_30

DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default
WHAT_IFS = {"pool x2": {"pool_factor": 2.0}, "host tier ratio 2": {"hicache_ratio": 2.0},
            "full eviction (the bug)": {"eviction": "full"}}


@dataclass
class Replay:
    requests: int
    pool_tokens: int
    page_size: int
    logged: dict
    simulated: dict
    distance: dict
    what_ifs: dict = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"requests": self.requests, "pool_tokens": self.pool_tokens, "page_size": self.page_size,
                "logged": self.logged, "simulated": self.simulated, "distance": self.distance,
                "what_ifs": self.what_ifs, "assumptions": self.assumptions}


def derive_requests(tl, seed: int = 0) -> list:
    """The trace the log implies (module docstring); deterministic for a ``seed``."""
    import random

    from kvlab.workloads.request import Request

    rows = tl.frame[tl.frame["rank"] == tl.primary[0]]
    prefill = rows[rows["kind"] == "prefill"]
    decode_tokens = float((rows.loc[rows["kind"] == "decode", "running"].fillna(0) * DECODE_LOG_INTERVAL).sum())
    n_requests = int(prefill["new_seq"].sum())
    output = max(1, round(decode_tokens / n_requests)) if n_requests else 1
    rng = random.Random(seed)
    requests, prompts = [], []
    for row in prefill.itertuples():
        n = max(1, int(row.new_seq))
        for k in range(n):
            new = int(row.new_token) // n + (1 if k < int(row.new_token) % n else 0)
            cached = int(row.cached_token) // n + (1 if k < int(row.cached_token) % n else 0)
            donor = next((p for p in reversed(prompts) if len(p) >= cached), None) if cached else None
            prefix = donor[:cached] if donor is not None else [rng.randrange(1, POW2_30) for _ in range(cached)]
            prompt = prefix + [rng.randrange(1, POW2_30) for _ in range(max(new, 1))]
            prompts.append(prompt)
            t = 0.0 if row.t_s != row.t_s else float(row.t_s)  # nan: no timestamps, all at 0
            requests.append(Request(rid=f"log-{row.line}-{k}", arrival_time_s=max(t, 0.0), prompt_token_ids=prompt,
                                    output_len=output))
    return requests


def _printed(rows: list[dict]) -> list[dict]:
    """The steps SGLang would print a line for: every prefill step, every ``decode_log_interval``-th decode step."""
    out, decodes = [], 0
    for r in rows:
        if r["kind"] == "prefill":
            out.append(r)
        else:
            decodes += 1
            if decodes % DECODE_LOG_INTERVAL == 0:
                out.append(r)
    return out


def _measure(result, pool_tokens: int) -> dict:
    rows = result.rows
    hit = sum(r["hit_tokens"] for r in rows if r["kind"] == "prefill")
    seen = hit + sum(r["prefill_tokens"] for r in rows if r["kind"] == "prefill")
    usage = [r["protected_tokens"] / pool_tokens for r in _printed(rows)]  # sampled as the log samples it
    return {"hit_rate": hit / seen if seen else None, "mean_usage": sum(usage) / len(usage) if usage else None,
            "peak_usage": max(usage, default=None), "retractions": result.totals()["retractions"]}


def _logged(tl) -> dict:
    rows = tl.frame[tl.frame["rank"] == tl.primary[0]]
    usage = rows["usage"].dropna()
    retracted = sum(e.count for e in tl.log.events if e.rank == tl.primary[0] and e.kind == "retract")
    cached, new = rows["cached_token"].sum(), rows["new_token"].sum()
    return {"hit_rate": float(cached / (cached + new)) if cached + new else None,
            "mean_usage": float(usage.mean()) if len(usage) else None,
            "peak_usage": float(usage.max()) if len(usage) else None, "retractions": int(retracted)}


def replay_runtime(tl, *, pool_tokens: int | None = None, page_size: int = 1, seed: int = 0,
                   what_ifs: dict | None = None) -> Replay:
    """Replay ``tl``'s derived trace with the server's pool (``pool_tokens``, else the log's), compare, and run
    each what-if (:data:`WHAT_IFS` by default) on the same trace."""
    from kvlab.errors import KvlabError
    from kvlab.sched import simulate
    from kvlab.sweep.point import scheduler_config
    from kvlab.units import align_up

    pool = pool_tokens or tl.pool_tokens
    if tl.log.engine != "sglang" or not tl.primary or not (tl.frame["kind"] == "prefill").any():
        raise KvlabError(f"{tl.log.path}: a replay needs SGLang Prefill lines (this log has none)")
    if not pool:
        raise KvlabError(f"{tl.log.path}: a replay needs the pool size: the log prints no max_total_num_tokens; "
                         f"give it (kvlab explain-log --pool-tokens N)")
    requests = derive_requests(tl, seed)
    pool = align_up(pool, page_size)

    def run(pool_factor: float = 1.0, **config) -> dict:
        kv = align_up(int(pool * pool_factor), page_size)
        return _measure(simulate(requests, scheduler_config(kv_tokens=kv, page_size=page_size, **config),
                                 progress=False), kv)

    simulated, logged = run(), _logged(tl)
    distance = {k: None if logged[k] is None or simulated[k] is None else simulated[k] - logged[k]
                for k in ("hit_rate", "mean_usage", "peak_usage", "retractions")}
    outcomes = {name: run(**change) for name, change in (WHAT_IFS if what_ifs is None else what_ifs).items()}
    assumptions = [" ".join(line.strip("- ").split()) for line in __doc__.split(
        "assumption is in ``Replay.assumptions``):")[1].split("The comparison")[0].strip().split("\n- ")]
    return Replay(len(requests), pool, page_size, logged, simulated, distance, outcomes, assumptions)


def format_replay(replay: Replay) -> str:
    def pct(x):
        return "n/a" if x is None else f"{x:.1%}"

    lines = [f"Replay of the log's load: {replay.requests:,} derived requests, pool {replay.pool_tokens:,} tokens, "
             f"page size {replay.page_size}",
             f"  {'':26} {'hit rate':>9} {'mean usage':>11} {'peak usage':>11} {'retractions':>12}"]
    for name, m in (("logged", replay.logged), ("replayed", replay.simulated), *replay.what_ifs.items()):
        lines.append(f"  {name:26} {pct(m['hit_rate']):>9} {pct(m['mean_usage']):>11} {pct(m['peak_usage']):>11} "
                     f"{m['retractions']:>12,}")
    d = replay.distance
    lines.append(f"  distance (replayed − logged): hit rate {d['hit_rate']:+.1%}, mean usage {d['mean_usage']:+.1%}, "
                 f"peak usage {d['peak_usage']:+.1%}, retractions {d['retractions']:+d}"
                 if None not in d.values() else "  distance: n/a (the log lacks a quantity)")
    lines.append("  assumed (the log does not say):")
    lines += [textwrap.fill(a, 116, initial_indent="  - ", subsequent_indent="    ") for a in replay.assumptions]
    return "\n".join(lines)
