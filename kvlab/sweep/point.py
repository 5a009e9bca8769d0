"""One grid point: one ``kvlab simulate`` run, and the one code path that builds it.

``kvlab simulate`` (kvlab/cli/simulate.py), :func:`kvlab.experiments.shortfall_eviction.run` and every sweep point build
their requests with :func:`load_requests`, their pool with :func:`pool_tokens` and their
:class:`~kvlab.sched.SchedulerConfig` with :func:`scheduler_config`, so a sweep row is exactly what
``kvlab simulate --json`` prints for the same settings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvlab.sched import RESULT_KEYS, RequestLike, SchedulerConfig, simulate
from kvlab.units import align_up

DEFAULT_KV_TOKENS = 32_768
TRACE_PAGE_SIZE = 512  # a Mooncake trace's hash ids are 512-token blocks: one page per block


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


def closed_loop_options(requests: Sequence[RequestLike], seed: int = 0) -> dict:
    """The ``SchedulerConfig`` field a closed-loop workload needs (``multiturn``: its sender's settings, seeded with
    the workload's seed), or nothing for requests that arrive at their own times. ``kvlab simulate`` and every sweep
    point pass it on (a sweep's workers get the requests as a plain list: the settings travel in the config)."""
    sender = getattr(requests, "closed_loop", None)
    if sender is None:
        return {}
    from kvlab.sched.arrivals import ClosedLoop

    return {"closed_loop": ClosedLoop(**sender, seed=seed)}


def default_page_size(*, trace: str | Path | None) -> int:
    """``kvlab simulate``'s page size when none is given: 512 for a trace (one page per hash block), else 1."""
    return TRACE_PAGE_SIZE if trace is not None else 1


def default_kv_tokens(requests: Sequence[RequestLike], page_size: int) -> int:
    """A pool under pressure but able to run every request: 32k tokens, or 4 of the longest request."""
    if not requests:
        raise ValueError("no requests to size a KV pool for")
    longest = max(len(r.prompt_token_ids) + r.output_len for r in requests)
    return align_up(max(DEFAULT_KV_TOKENS, 4 * (longest + page_size)), page_size)


def pool_tokens(requests: Sequence[RequestLike], page_size: int, *, kv_tokens: int | None = None,
                kv_pages: int | None = None) -> int:
    """The pool in tokens from ``--kv-tokens`` or ``--kv-pages`` (at most one), else :func:`default_kv_tokens`.
    Whether it can run is :func:`kvlab.sched.config.check_pool`'s to say (``kvlab simulate`` and every sweep point
    go through it; ``SchedulerConfig`` refuses a pool beyond ``MAX_POOL_TOKENS`` for any other caller)."""
    if kv_tokens is not None and kv_pages is not None:
        raise ValueError(f"give the pool in tokens or in pages, not both (kv_tokens={kv_tokens}, kv_pages={kv_pages})")
    if kv_pages is not None:
        return kv_pages * page_size
    return kv_tokens if kv_tokens is not None else default_kv_tokens(requests, page_size)


def scheduler_config(*, kv_tokens: int, eviction: str = "shortfall", page_size: int = 1, max_running: int = 256,
                     policy: str = "lru", **config: Any) -> SchedulerConfig:
    """The scheduler's config for one run; ``config`` holds any other ``SchedulerConfig`` field."""
    return SchedulerConfig(kv_tokens=kv_tokens, page_size=page_size, eviction=eviction, max_running=max_running,
                           policy=policy, **config)


def source_label(*, workload: str | None = None, trace: str | Path | None = None,
                 overrides: dict | None = None) -> str:
    """What a row says it ran on: the trace path as given, or the workload's name with its overrides."""
    if trace is not None:
        return str(trace)
    if not overrides:
        return str(workload)
    return f"{workload} {json.dumps(overrides, sort_keys=True, separators=(',', ':'))}"


@dataclass(frozen=True, order=True)
class Point:
    """One run's settings: the grid's axes. ``kv_tokens`` is whole pages (``SchedulerConfig`` checks it);
    ``hicache_ratio`` > 0 adds HiCache's host tier of that ratio, written with ``hicache_write_policy``, and a
    ``hicache_storage_backend`` other than none the storage tier behind it (``hicache_storage_prefetch_policy``)."""

    eviction: str
    policy: str
    page_size: int
    max_running: int
    kv_tokens: int
    hicache_ratio: float = 0.0  # the host pool over the device pool (HiCache); 0: no host tier
    hicache_write_policy: str = "write_through"  # read only with a host tier
    hicache_storage_backend: str = "none"  # the storage tier (L3) behind the host tier; none: no storage tier
    hicache_storage_prefetch_policy: str = "best_effort"  # read only with a storage tier

    @property
    def kv_pages(self) -> int:
        return self.kv_tokens // self.page_size

    def config(self, **extra: Any) -> SchedulerConfig:
        fields = asdict(self)
        ratio = fields.pop("hicache_ratio")
        if ratio:
            fields["hicache_ratio"] = ratio
        else:
            fields.pop("hicache_write_policy")
        if fields["hicache_storage_backend"] == "none":
            fields.pop("hicache_storage_backend")
            fields.pop("hicache_storage_prefetch_policy")
        return scheduler_config(**fields, **extra)


# The totals ``kvlab simulate --json`` prints, minus the four the grid already names (eviction, page_size,
# kv_tokens, policy): declared once, in kvlab/sched/result.py. Wall-clock time is kept apart (TIMING_COLUMNS): it
# differs run to run and engine to engine.
TOTAL_COLUMNS = RESULT_KEYS
TIMING_COLUMNS = ("wall_s",)


def run_point(requests: Sequence[RequestLike], point: Point, **extra: Any) -> dict:
    """Simulate one point; returns its totals (:data:`TOTAL_COLUMNS`) and ``wall_s``."""
    start = time.perf_counter()
    totals = simulate(requests, point.config(**extra), progress=False).totals()
    return {**{c: totals[c] for c in TOTAL_COLUMNS}, "wall_s": round(time.perf_counter() - start, 6)}


#: the largest number a ``--workload-param`` takes: a million groups or tokens is far beyond any workload kvlab's
#: simulator runs in reasonable time, and ``num_groups=1000000000`` ran unbounded (issue 26)
MAX_WORKLOAD_PARAM = 1_000_000


def parse_workload_params(items: list[str]) -> dict:
    """``--workload-param KEY=VALUE`` items as a dict; each VALUE read as JSON where it parses, else a string.
    A key given twice, and a number beyond :data:`MAX_WORKLOAD_PARAM`, are refused (issue 26)."""
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--workload-param {item!r}: expected KEY=VALUE")
        if key == "seed":  # make_workload's own argument, one flag for it (it was a TypeError, issue 37)
            raise ValueError(f"--workload-param {item[:60]}: the seed is no workload parameter; give it as --seed "
                             f"{value[:40] or 'N'}")
        if key in params:
            raise ValueError(f"--workload-param {key!r} given twice ({params[key]!r} and {value!r}): give it once")
        try:
            parsed = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            parsed = value
        if isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and abs(parsed) > MAX_WORKLOAD_PARAM:
            raise ValueError(f"--workload-param {key}={value[:40]}: expected at most {MAX_WORKLOAD_PARAM:,}")
        params[key] = parsed
    return params
