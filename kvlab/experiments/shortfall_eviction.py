"""Finding 2 as a function: run one workload through the scheduler with each eviction mode.

``mode="shortfall"`` is SGLang ≥ 0.5.17 (evict ``num_tokens − available``); ``mode="full"`` is
≤ 0.5.16 (evict ``num_tokens`` whenever short). Everything else is identical between the arms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from kvlab.sched import SchedulerConfig, SimResult, simulate
from kvlab.units import align_up

DEFAULT_KV_TOKENS = 32_768


def load_requests(*, workload: str | None = None, trace: str | Path | None = None, seed: int = 0,
                  overrides: dict | None = None) -> list:
    """Requests from a named seeded workload or a Mooncake-format trace (exactly one of them)."""
    if (workload is None) == (trace is None):
        raise ValueError("give exactly one of workload= or trace=")
    if trace is not None:
        from kvlab.workloads.mooncake import load_trace

        return load_trace(trace)
    from kvlab.workloads.generators import make_workload

    return make_workload(workload, seed=seed, **(overrides or {}))


def default_kv_tokens(requests: Sequence[Any], page_size: int) -> int:
    """A pool under pressure but able to run every request: 32k tokens, or 4 of the longest request."""
    if not requests:
        raise ValueError("no requests to size a KV pool for")
    longest = max(len(r.prompt_token_ids) + r.output_len for r in requests)
    return align_up(max(DEFAULT_KV_TOKENS, 4 * (longest + page_size)), page_size)


@dataclass(frozen=True)
class ShortfallComparison:
    shortfall: SimResult
    full: SimResult

    def totals_frame(self):
        import pandas as pd

        return pd.DataFrame({"shortfall (fix)": self.shortfall.totals(), "full (bug)": self.full.totals()})


def run(requests: Sequence[Any], *, eviction: str = "shortfall", page_size: int = 1, kv_tokens: int | None = None,
        max_running: int = 256, policy: str = "lru", progress: bool | None = None, **config: Any) -> SimResult:
    kv = kv_tokens if kv_tokens is not None else default_kv_tokens(requests, page_size)
    cfg = SchedulerConfig(kv_tokens=kv, page_size=page_size, eviction=eviction, max_running=max_running,
                          policy=policy, **config)
    return simulate(requests, cfg, progress=progress)


def compare(requests: Sequence[Any], **options: Any) -> ShortfallComparison:
    options.pop("eviction", None)
    return ShortfallComparison(run(requests, eviction="shortfall", **options), run(requests, eviction="full", **options))


MODES = ("shortfall", "full")


def _timed_totals(requests: Sequence[Any], mode: str, options: dict) -> dict:
    import time

    wall, cpu = time.perf_counter(), time.process_time()
    totals = run(requests, eviction=mode, progress=False, **options).totals()
    return {**totals, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def compare_totals(requests: Sequence[Any], *, processes: int = 2, progress: bool | None = None,
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
    out: dict[str, dict] = {}
    with progress_bar(total=len(MODES), desc="eviction modes", enabled=progress, unit="mode") as bar:
        if processes == 1:
            for mode in MODES:
                out[mode] = _timed_totals(requests, mode, options)
                bar.update(1)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=min(processes, len(MODES)),
                                     mp_context=multiprocessing.get_context("spawn")) as pool:
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
    evict: Any  # mem_cache EvictResult
    tree_before: str
    tree_after: str
    destroyed: tuple[str, ...]  # the cached prefixes (by name) whose leaf was evicted
    frame_before: Any = None  # tree_frame() tables, for the icicle plots
    frame_after: Any = None


SYSTEM_TOKENS = 1024  # the system prompt every conversation of the hand-sized tree shares
CONVERSATION_TAILS = (200, 250, 300, 400, 500, 700)  # tokens after it, oldest (first LRU victim) first


def conversation_tree(capacity: int = 4096):
    """The hand-sized tree of :func:`pressure_event` and the notebook 02 exercise: six conversations
    behind a 1,024-token system prompt, inserted oldest first (LRU order), on a page-1 allocator of
    ``capacity`` slots. Returns (cache, allocator, names): ``names`` maps a conversation's first
    token after the system prompt to (long name, icicle label); ``1`` is the system prompt."""
    import torch

    from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
    from kvlab.mem_cache.radix_cache import RadixCache

    alloc = TokenToKVPoolAllocator(capacity)
    tree = RadixCache(None, alloc, page_size=1, eviction_policy="lru")
    system = list(range(1, SYSTEM_TOKENS + 1))
    names = {1: ("system prompt", f"system prompt: {SYSTEM_TOKENS:,}")}
    for i, tail_len in enumerate(CONVERSATION_TAILS):
        first = 10_000 * (i + 1)
        key = system + [first + t for t in range(tail_len)]
        m = tree.match_prefix(key)
        tree.insert(key, torch.cat([m.device_indices, alloc.alloc(len(key) - m.device_prefix_len)]))
        names[first] = (f"conversation {i + 1} ({tail_len} tokens after the system prompt)", f"conv {i + 1}: {tail_len}")
    return tree, alloc, names


def pressure_event(mode: str, *, num_tokens: int = 600, capacity: int = 4096) -> PressureEvent:
    """A hand-sized tree of named cached prefixes, then one allocation of ``num_tokens`` when the
    pool has some, but not enough, free slots; report what the eviction destroyed."""
    from kvlab.mem_cache.common import evict_from_tree_cache
    from kvlab.mem_cache.tree_view import tree_frame

    tree, alloc, labels = conversation_tree(capacity)
    names = {k: long for k, (long, _) in labels.items() if k != 1}
    short = {k: label for k, (_, label) in labels.items()}
    filler = alloc.alloc(alloc.available_size() - num_tokens // 2)  # running requests hold the rest
    before = tree.pretty_print()
    frame_before = tree_frame(tree, names=short)
    leaves_before = {n.key[0] for n in tree._nodes() if not n.children and n is not tree.root_node}
    available = alloc.available_size()
    result = evict_from_tree_cache(tree, num_tokens, mode)
    leaves_after = {n.key[0] for n in tree._nodes() if not n.children and n is not tree.root_node}
    destroyed = tuple(names.get(k, str(k)) for k in sorted(leaves_before - leaves_after))
    tree.check_invariants()
    del filler
    return PressureEvent(mode, num_tokens, available, result, before, tree.pretty_print(), destroyed,
                         frame_before, tree_frame(tree, names=short))
