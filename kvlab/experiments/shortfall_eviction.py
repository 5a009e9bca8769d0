"""Finding 2 as a function: run one workload through the scheduler with each eviction mode.

``mode="shortfall"`` is SGLang ≥ 0.5.17 (evict ``num_tokens − available``, the fix); ``mode="full"`` is
≤ 0.5.16 (evict ``num_tokens`` whenever ``available < num_tokens``, the bug). Everything else is identical
between the arms.

Words, as the notebook and the tables use them:

- **pressure event**: one ``evict_from_tree_cache(tree, num_tokens)`` call that finds fewer than
  ``num_tokens`` free slots, so it asks the radix tree to evict.
- **shortfall**: what that allocation truly lacks, ``num_tokens − available``.
- **over-eviction** (the bug only): tokens evicted beyond the shortfall *at one pressure event* because
  the tree was asked for all of ``num_tokens``: ``min(evicted, asked) − shortfall``. They are evicted
  *earlier than needed*, not necessarily *lost*: the pool is full of cache either way, so the fix
  evicts the same least-recently-used prefixes at its next pressure events. Over-eviction costs a hit
  only when one of those prefixes is asked for again in between — which is why the total evicted is
  almost the same in both modes while the hit rate may or may not differ.
- **overshoot** (both modes): the tree frees whole leaves, so the last leaf may free more than asked.
  The fix asks for less each time, is short again sooner, so it has *more* pressure events, and more
  overshoot, than the bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlab.mem_cache.base_prefix_cache import EvictResult
from kvlab.mem_cache.options import EVICTION_MODES
from kvlab.procs import worker_count, worker_pool
from kvlab.sched import SimResult, simulate
from kvlab.sweep.point import (  # noqa: F401  (DEFAULT_KV_TOKENS, default_kv_tokens, load_requests: kept here too)
    DEFAULT_KV_TOKENS,
    default_kv_tokens,
    load_requests,
    pool_tokens,
    scheduler_config,
)
from kvlab.units import DIFFERENCE, DIFFERENCE_HEADER, fmt_points, fmt_signed_int
from kvlab.workloads.request import Request

if TYPE_CHECKING:
    import pandas as pd

MODES = EVICTION_MODES  # ("shortfall", "full"): evict_from_tree_cache's modes
MODE_LABELS = {"shortfall": "shortfall (the fix)", "full": "full (the bug)"}
SHOWN = ("full", "shortfall")  # the order every table shows the modes in: the bug, then the fix (kvlab.units)
NEGLIGIBLE_GAP_POINTS = 0.5  # a hit-rate difference below this many points is called negligible


@dataclass(frozen=True)
class ShortfallComparison:
    shortfall: SimResult
    full: SimResult

    def arms(self) -> tuple[tuple[str, SimResult], ...]:
        return (("shortfall", self.shortfall), ("full", self.full))

    @property
    def gap_points(self) -> float:
        """Hit-rate loss of full eviction, in percentage points (fix − bug: shortfall − full)."""
        return 100.0 * (self.shortfall.hit_rate - self.full.hit_rate)

    def prefill_causes(self) -> dict[str, int]:
        """The bug's extra prefill (fix − bug of ``prefill_tokens_computed``, negated), split by cause; the
        parts add up to the whole. ``lost_hits``: prompt tokens the fix served from the cache at first
        admission and the bug computed (what early eviction cost); ``reprefill``: tokens computed again after
        retractions (prompt and outputs so far), bug minus fix."""
        fix, bug = self.shortfall.totals(), self.full.totals()
        return {"extra_prefill": bug["prefill_tokens_computed"] - fix["prefill_tokens_computed"],
                "lost_hits": fix["cached_prompt_tokens"] - bug["cached_prompt_tokens"],
                "reprefill": bug["reprefill_tokens"] - fix["reprefill_tokens"]}

    def summary_frame(self):
        """The comparison as a person reads it: the bug's column, the fix's, then the difference fix − bug
        (kvlab.units' convention); rows in words, percentages with two decimals, tokens with separators.

        The first rows are an account that closes, in each column: prompt tokens served from the cache +
        prompt tokens prefilled at first admission = the workload's prompt tokens; that prefill + the tokens
        prefilled again after a retraction = all tokens prefilled (``prefill_tokens_computed``)."""
        import pandas as pd

        fix, bug = self.shortfall.totals(), self.full.totals()
        for t in (fix, bug):
            t["first_prefill_tokens"] = t["prefill_tokens_computed"] - t["reprefill_tokens"]
        rows = (  # label, totals key, format, format of the difference
            ("hit rate (prompt tokens served from the cache)", "hit_rate", _pct, lambda d: fmt_points(100 * d)),
            ("prompt tokens served from the cache", "cached_prompt_tokens", _int, fmt_signed_int),
            ("+ prompt tokens prefilled at first admission", "first_prefill_tokens", _int, fmt_signed_int),
            ("= prompt tokens of the workload", "prompt_tokens", _int, fmt_signed_int),
            ("+ tokens prefilled again after a retraction", "reprefill_tokens", _int, fmt_signed_int),
            ("= tokens prefilled in all (computed)", "prefill_tokens_computed", _int, fmt_signed_int),
            ("requests retracted", "retractions", _int, fmt_signed_int),
            ("tokens evicted from the cache", "evicted_tokens", _int, fmt_signed_int),
            ("evicted earlier than needed (over-eviction)", "over_evicted_tokens", _int, fmt_signed_int),
            ("freed beyond what was asked (leaf overshoot)", "overshoot_tokens", _int, fmt_signed_int),
            ("pressure events (allocations that had to evict)", "pressure_events", _int, fmt_signed_int),
            ("output tokens per second (cost model)", "output_tokens_per_s", _rate, _signed_rate),
        )
        frame = pd.DataFrame(
            {MODE_LABELS["full"]: [fmt(bug[k]) for _, k, fmt, _ in rows],
             MODE_LABELS["shortfall"]: [fmt(fix[k]) for _, k, fmt, _ in rows],
             DIFFERENCE_HEADER: [dfmt(fix[k] - bug[k]) for _, k, _, dfmt in rows]},
            index=[label for label, *_ in rows])
        frame.index.name = f"{fix['requests']:,} requests, pool {fix['kv_tokens']:,} tokens"
        return frame

    def verdict(self) -> str:
        """Plain sentences: does full eviction cost hit rate here, how much was evicted early, and what the
        extra prefill is made of (lost cache hits, re-prefill after retractions)."""
        fix, bug = self.shortfall.totals(), self.full.totals()
        gap = self.gap_points
        if fix["pressure_events"] == 0 and bug["pressure_events"] == 0:
            return (f"No pressure event in either mode: the pool never ran short, nothing was evicted, and both "
                    f"modes behave the same (hit rate {_pct(fix['hit_rate'])}). Shrink the pool or pick a larger "
                    f"workload to see the difference.")
        if bug["over_evicted_tokens"] == 0:
            return (f"Full eviction (the bug) never evicted beyond the shortfall: its {bug['pressure_events']:,} "
                    f"pressure events found no free slot to spare, so both modes evicted alike and the hit "
                    f"rates differ by {fmt_points(gap)} ({_pct(bug['hit_rate'])} vs {_pct(fix['hit_rate'])}).")
        early = f"{bug['over_evicted_tokens']:,} tokens earlier than needed"
        if abs(gap) < NEGLIGIBLE_GAP_POINTS:
            same = ("the same hit rate" if round(gap, 2) == 0
                    else f"hit rates {_pct(bug['hit_rate'])} vs {_pct(fix['hit_rate'])}")
            return (f"Negligible here: {same} ({fmt_points(gap)}, {DIFFERENCE}). Full eviction (the bug) evicted "
                    f"{early}, but the fix evicted the same prefixes a little later, before anyone asked for them "
                    f"again (tokens evicted in all: {bug['evicted_tokens']:,} vs {fix['evicted_tokens']:,}). "
                    + self._prefill_sentence())
        if gap < 0:
            return (f"Here full eviction (the bug) happens to do better, by {-gap:.2f} points "
                    f"({_pct(bug['hit_rate'])} vs {_pct(fix['hit_rate'])}): it evicted {early}, and the prefixes "
                    f"the fix kept instead were not the ones asked for next. " + self._prefill_sentence())
        return (f"Full eviction (the bug) costs {gap:.2f} points of hit rate here ({_pct(bug['hit_rate'])} → "
                f"{_pct(fix['hit_rate'])} with the fix): it evicted {early}, some of them just before they were "
                f"asked for again. " + self._prefill_sentence())

    def _prefill_sentence(self) -> str:
        """What the bug's extra (or saved) prefill is made of, each part with its cause."""
        c = self.prefill_causes()
        extra, lost, again = c["extra_prefill"], c["lost_hits"], c["reprefill"]
        if extra == lost == again == 0:
            return "Both modes prefilled the same tokens."
        parts = []
        if lost:
            parts.append(f"{lost:,} prompt tokens the fix served from the cache (early eviction)" if lost > 0 else
                         f"{-lost:,} fewer prompt tokens than the fix, served from the cache instead")
        if again:
            parts.append(f"{again:,} more tokens prefilled again after retractions" if again > 0 else
                         f"{-again:,} fewer tokens prefilled again after retractions")
        what = "more" if extra >= 0 else "fewer"
        return f"The bug prefilled {abs(extra):,} {what} tokens: " + "; ".join(parts) + "."

    def cumulative_frame(self):
        """Tidy, one row per step and mode (plus a zero row at t = 0): ``mode``, ``label``, ``time_s``
        (simulated), and running totals ``evicted_tokens``, ``over_evicted_tokens``, ``pressure_events``,
        ``cached_prompt_tokens``, ``hit_rate``; and the state after the step: ``free_tokens`` (free
        slots) and ``cached_tokens`` (evictable: cached and not used by a running request)."""
        import pandas as pd

        parts = []
        for mode, result in self.arms():
            f = result.steps_frame()
            zero = pd.DataFrame([dict(time_s=0.0, evicted_tokens=0, over_evicted_tokens=0, pressure_events=0,
                                      cached_prompt_tokens=0, hit_rate=0.0, free_tokens=result.config.kv_tokens,
                                      cached_tokens=0)])
            part = pd.DataFrame(dict(
                time_s=f["time_s"], evicted_tokens=f["evicted_tokens"].cumsum(),
                over_evicted_tokens=f["over_evicted_tokens"].cumsum(), pressure_events=f["pressure_events"].cumsum(),
                cached_prompt_tokens=f["cached_prompt_tokens"], hit_rate=f["hit_rate"],
                free_tokens=f["available_tokens"], cached_tokens=f["evictable_tokens"]))
            part = pd.concat([zero, part], ignore_index=True)
            part.insert(0, "label", MODE_LABELS[mode])
            part.insert(0, "mode", mode)
            parts.append(part)
        return pd.concat(parts, ignore_index=True)

    def pressure_frame(self):
        """Per mode, what its pressure events did (numbers, not strings: ``pressure_summary`` formats
        them). ``free_tokens_avg`` / ``cached_tokens_avg``: free slots and evictable cached tokens,
        averaged over simulated time — the bug keeps more slots free and so caches less."""
        import pandas as pd

        rows = {}
        for mode, result in self.arms():
            t, f = result.totals(), result.steps_frame()
            rows[mode] = dict(
                pressure_events=t["pressure_events"],
                evicted_tokens=t["evicted_tokens"], over_evicted_tokens=t["over_evicted_tokens"],
                overshoot_tokens=t["overshoot_tokens"],
                evicted_per_event=t["evicted_tokens"] / t["pressure_events"] if t["pressure_events"] else 0.0,
                free_tokens_avg=_time_average(f, "available_tokens"),
                cached_tokens_avg=_time_average(f, "evictable_tokens"), hit_rate=t["hit_rate"])
        return pd.DataFrame(rows)

    def pressure_summary(self):
        """:meth:`pressure_frame` in words and human units, one column per mode."""
        import pandas as pd

        raw = self.pressure_frame()
        labels = (("pressure events", "pressure_events", _int),
                  ("tokens evicted", "evicted_tokens", _int),
                  ("… beyond the shortfall (over-eviction)", "over_evicted_tokens", _int),
                  ("… beyond what was asked (leaf overshoot)", "overshoot_tokens", _int),
                  ("tokens evicted per pressure event", "evicted_per_event", lambda v: f"{v:,.0f}"),
                  ("free slots, average over time", "free_tokens_avg", lambda v: f"{v:,.0f}"),
                  ("cached tokens not in use, average over time", "cached_tokens_avg", lambda v: f"{v:,.0f}"),
                  ("hit rate", "hit_rate", _pct))
        return pd.DataFrame({MODE_LABELS[m]: [fmt(raw.loc[k, m]) for _, k, fmt in labels] for m in SHOWN},
                            index=[label for label, *_ in labels])


def _time_average(frame, column: str) -> float:
    """``column`` (the state after each step) weighted by how long it lasted: until the next step."""
    if frame.empty:
        return 0.0
    lasted = (frame["time_s"].shift(-1) - frame["time_s"]).fillna(0.0)
    if float(lasted.sum()) <= 0:
        return float(frame[column].mean())
    return float((frame[column] * lasted).sum() / lasted.sum())


def _pct(v: float) -> str:
    return f"{v:.2%}"


def _int(v) -> str:
    return f"{int(v):,}"


def _rate(v: float) -> str:
    return f"{v:,.0f}"


def _signed_rate(v: float) -> str:
    return fmt_signed_int(round(v))


def run(requests: Sequence[Request], *, eviction: str = "shortfall", page_size: int = 1, kv_tokens: int | None = None,
        max_running: int = 256, policy: str = "lru", progress: bool | None = None, **config: Any) -> SimResult:
    """One ``kvlab simulate`` run (the config built by :func:`kvlab.sweep.point.scheduler_config`, as every
    sweep point's is); ``kv_tokens=None``: :func:`default_kv_tokens`."""
    cfg = scheduler_config(kv_tokens=pool_tokens(requests, page_size, kv_tokens=kv_tokens), eviction=eviction,
                           page_size=page_size, max_running=max_running, policy=policy, **config)
    return simulate(requests, cfg, progress=progress)


def compare(requests: Sequence[Request], **options: Any) -> ShortfallComparison:
    options.pop("eviction", None)
    return ShortfallComparison(run(requests, eviction="shortfall", **options), run(requests, eviction="full", **options))


@dataclass(frozen=True)
class PanelSettings:
    """One setting of notebook 02's live panel: a seeded workload and the server's pool, pages and policy."""

    workload: str
    overrides: tuple[tuple[str, Any], ...]  # make_workload keyword arguments, as (name, value) pairs
    kv_tokens: int
    page_size: int = 1
    policy: str = "lru"
    seed: int = 0

    def workload_overrides(self) -> dict:
        return dict(self.overrides)

    def requests(self) -> list:
        return load_requests(workload=self.workload, seed=self.seed, overrides=self.workload_overrides())

    def run_options(self) -> dict:
        """``run`` / ``compare`` keyword arguments."""
        return dict(kv_tokens=self.kv_tokens, page_size=self.page_size, policy=self.policy)

    def cli_args(self) -> list[str]:
        """The same setting as ``kvlab simulate`` arguments (the browser tests compare the panel with the CLI)."""
        args = ["--workload", self.workload, "--seed", str(self.seed)]
        for name, value in self.overrides:
            args += ["--workload-param", f"{name}={value}"]
        return args + ["--kv-tokens", str(self.kv_tokens), "--page-size", str(self.page_size), "--policy", self.policy]


# Notebook 02's live panel opens here: a regime where full eviction visibly costs hit rate (about 5 points,
# tests/experiments/test_eviction_regimes.py holds it to PANEL_MIN_GAP_POINTS). bench_serving's
# generated-shared-prefix workload with many small groups (64 system prompts of 512 tokens, 8 short
# questions each, all 512 requests at once) on 128-token pages: SGLang's paged allocator asks, every
# decode round, for a page per running request (about 50 × 128 tokens here), so each pressure event has
# thousands of free slots that the bug evicts on top; and the pool (32,768 tokens, 256 pages) holds
# about half of the system prompts, so the prefixes it destroys early are often asked for soon after.
# Under 1-token pages, a larger pool or another workload the difference shrinks (see eviction_regimes).
PANEL_DEFAULTS = PanelSettings(
    workload="generated-shared-prefix",
    overrides=(("num_groups", 64), ("prompts_per_group", 8), ("system_prompt_len", 512), ("question_len", 32),
               ("output_len", 128)),
    kv_tokens=32_768, page_size=128, policy="lru", seed=0)
PANEL_MIN_GAP_POINTS = 4.0  # full eviction's hit-rate loss at PANEL_DEFAULTS is at least this (measured 5.33)

_COMPARISONS: dict = {}


def panel_comparison(settings: PanelSettings = PANEL_DEFAULTS, *, progress: bool | None = None) -> ShortfallComparison:
    """Both modes at ``settings`` (seeded, so computed once per process and then reused)."""
    if settings not in _COMPARISONS:
        _COMPARISONS[settings] = compare(settings.requests(), progress=progress, **settings.run_options())
    return _COMPARISONS[settings]


def _timed_totals(requests: Sequence[Request], mode: str, options: dict) -> dict:
    import time

    wall, cpu = time.perf_counter(), time.process_time()
    totals = run(requests, eviction=mode, progress=False, **options).totals()
    return {**totals, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def compare_totals(requests: Sequence[Request], *, processes: int = 2, progress: bool | None = None,
                   **options: Any) -> dict[str, dict]:
    """Both arms' ``totals()`` (plus each arm's ``wall_s`` / ``cpu_s``), the arms in parallel.

    Each arm is single-threaded (``Scheduler.run``), so on a machine with two cores the two arms run
    side by side in ``processes`` worker processes (``spawn``: a fresh interpreter, no forked torch
    state); ``processes=1`` runs them one after the other here. Only the totals come back (the trees
    and per-step frames stay in the workers): use :func:`compare` for those.
    """
    from kvlab.progress import progress_bar

    options.pop("eviction", None)
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    processes = worker_count(processes)  # 1 in a kvlab app kernel
    out: dict[str, dict] = {}
    with progress_bar(total=len(MODES), desc="eviction modes", enabled=progress, unit="mode") as bar:
        if processes == 1:
            for mode in MODES:
                out[mode] = _timed_totals(requests, mode, options)
                bar.update(1)
        else:
            from concurrent.futures import as_completed


            with worker_pool(min(processes, len(MODES))) as pool:
                futures = {pool.submit(_timed_totals, requests, mode, options): mode for mode in MODES}
                for future in as_completed(futures):
                    out[futures[future]] = future.result()
                    bar.update(1)
    return {mode: out[mode] for mode in MODES}


@dataclass(frozen=True)
class PressureEvent:
    """One allocation under pressure, seen from the tree, in one eviction mode."""

    mode: str
    num_tokens: int  # what the allocation needs
    available_before: int
    evict: EvictResult
    destroyed: tuple[str, ...]  # the cached prefixes (by name) whose leaf was evicted
    frame_before: pd.DataFrame | None = None  # tree_frame() tables, for the icicle plots
    frame_after: pd.DataFrame | None = None


SYSTEM_TOKENS = 1024  # the system prompt every conversation of the hand-sized tree shares
CONVERSATION_TAILS = (200, 250, 300, 400, 500, 700)  # tokens after it, oldest (first LRU victim) first


def conversation_tree(capacity: int = 4096):
    """The hand-sized tree of :func:`pressure_event` and the notebook 02 exercise: six conversations
    behind a 1,024-token system prompt, inserted oldest first (LRU order), on a page-1 allocator of
    ``capacity`` slots. Returns (cache, allocator, names): ``names`` maps a conversation's first
    token after the system prompt to (long name, icicle label); ``1`` is the system prompt."""
    from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
    from kvlab.mem_cache.common import match_alloc_insert
    from kvlab.mem_cache.radix_cache import RadixCache

    alloc = TokenToKVPoolAllocator(capacity)
    tree = RadixCache(None, alloc, page_size=1, eviction_policy="lru")
    system = list(range(1, SYSTEM_TOKENS + 1))
    names = {1: ("system prompt", f"system prompt<br>{SYSTEM_TOKENS:,}")}
    for i, tail_len in enumerate(CONVERSATION_TAILS):
        first = 10_000 * (i + 1)
        match_alloc_insert(tree, system + [first + t for t in range(tail_len)])
        names[first] = (f"conversation {i + 1} ({tail_len} tokens after the system prompt)", f"conv {i + 1}: {tail_len}")
    return tree, alloc, names


def pressure_event(mode: str, *, num_tokens: int = 600, capacity: int = 4096) -> PressureEvent:
    """A hand-sized tree of named cached prefixes, then one allocation of ``num_tokens`` when the
    pool has some, but not enough, free slots; report what the eviction destroyed."""
    from kvlab.experiments.arguments import check_event_tokens, check_int
    from kvlab.mem_cache.common import evict_from_tree_cache
    from kvlab.mem_cache.tree_view import tree_frame

    check_int("pressure_event", "capacity", capacity, 1, 1_048_576, "a hand-sized tree")  # 2^20 tokens
    tree, alloc, labels = conversation_tree(capacity)
    check_event_tokens("pressure_event", num_tokens, capacity, alloc.available_size())
    names = {k: long for k, (long, _) in labels.items() if k != 1}
    short = {k: label for k, (_, label) in labels.items()}
    filler = alloc.alloc(alloc.available_size() - num_tokens // 2)  # running requests hold the rest
    frame_before = tree_frame(tree, names=short)
    leaves_before = {n.key[0] for n in tree.nodes() if not n.children and n is not tree.root_node}
    available = alloc.available_size()
    result = evict_from_tree_cache(tree, num_tokens, mode)
    leaves_after = {n.key[0] for n in tree.nodes() if not n.children and n is not tree.root_node}
    destroyed = tuple(names.get(k, str(k)) for k in sorted(leaves_before - leaves_after))
    tree.check_invariants()
    del filler
    return PressureEvent(mode, num_tokens, available, result, destroyed, frame_before, tree_frame(tree, names=short))


def events_frame(events: dict[str, PressureEvent]):
    """:func:`pressure_event` results side by side (``{mode: event}``), rows in words, tokens with separators."""
    import pandas as pd

    def rows(e: PressureEvent) -> dict[str, str]:
        ev = e.evict
        return {
            "slots the allocation needs": f"{e.num_tokens:,}",
            "free slots before it": f"{e.available_before:,}",
            "shortfall (what was missing)": f"{ev.shortfall_tokens:,}",
            "asked of the tree": f"{ev.requested_tokens:,}",
            "tokens evicted": f"{ev.evicted_tokens:,}",
            "… beyond the shortfall (over-eviction)": f"{ev.over_evicted_tokens:,}",
            "… beyond what was asked (leaf overshoot)": f"{ev.overshoot_tokens:,}",
            "cached conversations destroyed": f"{len(e.destroyed):,}",
        }

    order = sorted(events, key=lambda m: SHOWN.index(m) if m in SHOWN else len(SHOWN))  # the bug, then the fix
    return pd.DataFrame({MODE_LABELS.get(mode, mode): rows(events[mode]) for mode in order})
