"""Where full eviction (the bug) costs hit rate, and where it does not: small sweeps of both modes over
workload × pool size (notebook 02, section 3).

Pools are given as a share of the workload's *distinct prompt tokens* (what an infinite prefix cache of
1-token pages would hold after the whole workload), so workloads of different sizes line up in one table:
at a share of 1 the pool could cache every prompt once, were no request running. Each cell is one :func:`shortfall_eviction.compare` (the scheduler model, both modes,
seeded), computed once per process and remembered (:data:`_MEMO`); the hybrid rows replay notebook 03's
chat workload straight against a plain and a Mamba radix tree (:func:`hybrid_caches.run_workload`).

The grid is deliberately small (about 18 s on one core, about 10 s with ``processes=2``): a notebook runs
it headless in CI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.experiments import shortfall_eviction
from kvlab.paths import data_path
from kvlab.procs import worker_count, worker_pool
from kvlab.units import align_up

TRACE_DIR = data_path("traces")
# pool ÷ the workload's distinct prompt tokens; 2/3 is the live panel's pool (32,768 of 49,152)
POOL_SHARES = (0.25, 0.5, 2 / 3, 1.0, 1.5)
SCHEDULER = "scheduler model (kvlab.sched)"
HYBRID = "notebook 03's chat replay on plain and Mamba trees"


@dataclass(frozen=True)
class Regime:
    """One row of the regime view: a seeded workload (or a trace under ``data/traces``) and the server
    settings it runs with. ``overrides``: ``make_workload`` keyword arguments as (name, value) pairs."""

    name: str
    workload: str | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    trace: str | None = None
    page_size: int = 1
    policy: str = "lru"
    max_running: int = 256
    seed: int = 0

    def requests(self) -> list:
        if (self.workload is None) == (self.trace is None):
            raise ValueError(f"regime {self.name!r}: give exactly one of workload= or trace=")
        if self.trace is not None:
            return shortfall_eviction.load_requests(trace=TRACE_DIR / self.trace)
        return shortfall_eviction.load_requests(workload=self.workload, seed=self.seed,
                                                overrides=dict(self.overrides))

    def run_options(self, kv_tokens: int) -> dict:
        return dict(kv_tokens=kv_tokens, page_size=self.page_size, policy=self.policy, max_running=self.max_running)


_PANEL = shortfall_eviction.PANEL_DEFAULTS
_GROUPS = f"{dict(_PANEL.overrides)['num_groups']} system prompts × {dict(_PANEL.overrides)['prompts_per_group']} questions"
REGIMES = (
    Regime(f"{_GROUPS}, 128-token pages (the live panel)", _PANEL.workload, _PANEL.overrides,
           page_size=_PANEL.page_size, policy=_PANEL.policy, seed=_PANEL.seed),
    Regime(f"{_GROUPS}, 16-token pages", _PANEL.workload, _PANEL.overrides, page_size=16, seed=_PANEL.seed),
    Regime("16 system prompts × 8 questions, 1-token pages", "generated-shared-prefix",
           (("num_groups", 16), ("prompts_per_group", 8), ("output_len", 128))),
    Regime("multi-turn chat, 16 sessions × 4 turns, 16-token pages", "multi-turn-chat",
           (("num_sessions", 16), ("turns", 4)), page_size=16),
    Regime("Mooncake-shaped trace, 512-token pages, 16 running", trace="mooncake_small.jsonl", page_size=512,
           max_running=16),
)

_REQUESTS: dict[Regime, list] = {}
_MEMO: dict[tuple, dict] = {}  # (regime, kv_tokens) -> {mode: totals}


def regime_requests(regime: Regime) -> list:
    if regime not in _REQUESTS:
        _REQUESTS[regime] = regime.requests()
    return _REQUESTS[regime]


def distinct_prompt_tokens(regime: Regime) -> int:
    """Distinct prompt tokens of the workload: what an infinite prefix cache of 1-token pages would hold
    after it (a trace of block hashes: distinct blocks × block size)."""
    from kvlab.experiments.pool_sweep import unique_prompt_pages

    requests = regime_requests(regime)
    block = getattr(requests[0], "block_size", None)
    if block and all(getattr(r, "block_hashes", None) and r.block_size == block for r in requests):
        return unique_prompt_pages(requests, block) * block
    return distinct_tokens([r.prompt_token_ids for r in requests])


def pool_tokens(regime: Regime, share: float) -> int:
    """The pool for ``share`` of the distinct prompt tokens: page-aligned, and never below the smallest pool
    that runs the workload's longest request (``pool_sweep.min_pool_pages``)."""
    from kvlab.experiments.pool_sweep import min_pool_pages

    if not share > 0:
        raise ValueError(f"pool share must be > 0, got {share!r}")
    floor = min_pool_pages(regime_requests(regime), regime.page_size) * regime.page_size
    return max(floor, align_up(round(share * distinct_prompt_tokens(regime)), regime.page_size))


def _cell(regime: Regime, kv_tokens: int) -> dict:
    requests = regime_requests(regime)
    return {mode: shortfall_eviction.run(requests, eviction=mode, progress=False, **regime.run_options(kv_tokens)).totals()
            for mode in shortfall_eviction.MODES}


def _row(regime: Regime, share: float, kv_tokens: int, arms: dict) -> dict:
    fix, bug = arms["shortfall"], arms["full"]
    return dict(group=SCHEDULER, regime=regime.name, share=share, kv_tokens=kv_tokens, page_size=regime.page_size,
                policy=regime.policy, hit_rate_shortfall=fix["hit_rate"], hit_rate_full=bug["hit_rate"],
                gap_points=100.0 * (fix["hit_rate"] - bug["hit_rate"]),
                evicted_shortfall=fix["evicted_tokens"], evicted_full=bug["evicted_tokens"],
                over_evicted_full=bug["over_evicted_tokens"], pressure_events_shortfall=fix["pressure_events"],
                pressure_events_full=bug["pressure_events"])


def regime_sweep(regimes: Sequence[Regime] = REGIMES, shares: Sequence[float] = POOL_SHARES, *,
                 processes: int = 1, progress: bool | None = None):
    """One row per (regime, pool share): ``group``, ``regime``, ``share``, ``kv_tokens``, ``page_size``,
    ``policy``, both modes' hit rates, ``gap_points`` (shortfall − full, percentage points), tokens evicted
    in each mode, the bug's over-eviction and both modes' pressure events. Cells already computed in this
    process are reused; ``processes > 1`` runs the others in that many worker processes."""
    import pandas as pd

    from kvlab.progress import progress_bar

    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    processes = worker_count(processes)  # 1 in a kvlab app kernel
    cells = [(r, s, pool_tokens(r, s)) for r in regimes for s in shares]
    todo = list(dict.fromkeys((r, kv) for r, _, kv in cells if (r, kv) not in _MEMO))
    with progress_bar(total=len(todo), desc="eviction regimes", enabled=progress, unit="cell") as bar:
        if processes == 1 or len(todo) < 2:
            for regime, kv in todo:
                _MEMO[(regime, kv)] = _cell(regime, kv)
                bar.update(1)
        else:
            from concurrent.futures import as_completed


            with worker_pool(min(processes, len(todo))) as pool:
                futures = {pool.submit(_cell, regime, kv): (regime, kv) for regime, kv in todo}
                for future in as_completed(futures):
                    _MEMO[futures[future]] = future.result()
                    bar.update(1)
    return pd.DataFrame([_row(r, s, kv, _MEMO[(r, kv)]) for r, s, kv in cells])


def gap_table(frame):
    """A sweep's hit-rate loss as a table to read: one row per regime, one column per pool share
    ("25%"), each cell the points lost to full eviction with two decimals."""
    table = frame.pivot(index="regime", columns="share", values="gap_points")
    table = table.reindex(list(dict.fromkeys(frame["regime"])))
    table.columns = [f"{share:.0%}" for share in table.columns]
    table.columns.name = "KV pool, share of the distinct prompt tokens"
    table.index.name = "hit rate lost to full eviction (points)"
    return table.map(lambda v: f"{v:.2f}")


HYBRID_WORKLOAD = dict(num_sessions=12, turns=6, turn_tokens=24)  # hybrid_caches.multi_turn_workload's defaults
HYBRID_MAMBA_STATES = 16  # as hybrid_caches.eviction_mode_comparison
HYBRID_SHARES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)  # notebook 03's 1,200-token pool is 0.6 of its 2,016 tokens
HYBRID_SEEDS = (0, 1, 2, 3, 4)  # 72 requests a seed: one lost prefix moves a single seed's hit rate by ~1 point


def hybrid_sweep(shares: Sequence[float] = HYBRID_SHARES, *, seeds: Sequence[int] = HYBRID_SEEDS,
                 mamba_states: int = HYBRID_MAMBA_STATES):
    """Notebook 03's comparison over pool shares: its seeded chat workload replayed on a plain radix tree
    and on a Mamba tree (``mamba_states`` state slots), both modes, averaged over ``seeds`` (hit rates
    and the gap are means; ``kv_tokens`` is seed 0's pool). Same columns as :func:`regime_sweep`
    (``evicted_*`` are KV tokens, summed over the seeds; no scheduler, so no pressure-event counts)."""
    import pandas as pd

    from kvlab.experiments import hybrid_caches

    if not seeds:
        raise ValueError("hybrid_sweep: give at least one seed")
    workloads = [hybrid_caches.multi_turn_workload(seed=seed, **HYBRID_WORKLOAD) for seed in seeds]
    rows = []
    for kind, name in (("radix", "chat replay, plain radix tree"), ("mamba", "chat replay, Mamba tree")):
        for share in shares:
            hit = {m: 0.0 for m in shortfall_eviction.MODES}
            evicted = {m: 0 for m in shortfall_eviction.MODES}
            pools = []
            for seqs in workloads:
                pool = max(max(len(s) for s in seqs) + 1, round(share * distinct_tokens(seqs)))
                pools.append(pool)
                for mode in shortfall_eviction.MODES:
                    run = hybrid_caches.run_workload(kind, mode, seqs, pool_tokens=pool, mamba_states=mamba_states)
                    hit[mode] += run.hit_rate / len(workloads)
                    evicted[mode] += run.evicted_tokens
            rows.append(dict(group=f"{HYBRID} (mean of {len(workloads)} seeds)", regime=name, share=share, kv_tokens=pools[0], page_size=1, policy="lru",
                             hit_rate_shortfall=hit["shortfall"], hit_rate_full=hit["full"],
                             gap_points=100.0 * (hit["shortfall"] - hit["full"]),
                             evicted_shortfall=evicted["shortfall"], evicted_full=evicted["full"],
                             over_evicted_full=None, pressure_events_shortfall=None, pressure_events_full=None,
                             seeds=len(workloads)))
    return pd.DataFrame(rows)


def distinct_tokens(seqs: Sequence[Sequence[int]]) -> int:
    """Nodes of a token trie over ``seqs`` (the tokens an infinite cache of 1-token pages holds after them
    all): the sequences sorted, each one's length less what it shares with the one before."""
    from array import array

    from kvlab.mem_cache.radix_tree import common_prefix_len

    arrays = sorted((s.to_array() if hasattr(s, "to_array") else array("q", s) for s in seqs), key=lambda a: a.tolist())
    total, previous = 0, array("q")
    for a in arrays:
        total += len(a) - common_prefix_len(previous, a, 0, len(a))
        previous = a
    return total
