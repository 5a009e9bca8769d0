"""The scheduler with a host tier (HiCache's L2) on the shipped Mooncake-format trace: notebook 07's sections 3 and 4
and notebook 06's host axis.

Each point (:class:`HostPoint`) is one ``kvlab simulate`` run (``shortfall_eviction.run``: the config
``kvlab.sweep.point`` builds, with SchedulerConfig's hicache_ratio / hicache_write_policy), and
:meth:`HostPoint.cli_args` is that run's command line. ``host_ratio`` 0 means no host tier (a plain RadixCache).

- :func:`host_sweep`: device pool × host ratio × write policy × eviction mode, one tidy row per run;
- :func:`hit_rate_frame`, :func:`curve_table`: hit rate against host size at one device pool;
- :func:`finding2_frame`, :func:`finding2_table`, :func:`finding2_verdict`, :func:`regime_frame`: finding 2 with a
  host tier, what full eviction costs in hits and in copies, as numbers, words and a regime map.

The hand-sized two-tier trees (one pressure event, the write policies side by side, the demo, the exercise's leaf)
are :mod:`kvlab.experiments.host_tier`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.mem_cache.common import EVICTION_MODES
from kvlab.mem_cache.hicache.cache_controller import WRITE_POLICIES
from kvlab.paths import shown_path
from kvlab.procs import worker_count, worker_pool
from kvlab.units import DIFFERENCE, fmt_points, fmt_signed_int, with_sign

MODES = EVICTION_MODES  # ("shortfall", "full")
POLICIES = WRITE_POLICIES  # ("write_through", "write_through_selective", "write_back")
TRACE_PAGE_SIZE = 512  # a Mooncake trace's hash ids are 512-token blocks
TRACE_MAX_RUNNING = 16
DEVICE_ONLY = "device only"  # the write_policy column of a run without a host tier
HOST_RATIOS = (0.0, 0.5, 1.0, 2.0, 4.0)  # --hicache-ratio; 0: no host tier
# the shipped trace's two smallest default pools (pool_sweep.default_pool_pages(requests, 512, 6)[:2]): one
# request's worth and twice that (a sixteenth of the distinct prompt pages), where a device-only pool turns over fast
REGIME_POOL_PAGES = (78, 157)
REGIME_HOST_RATIOS = (1.0, 4.0)
CURVE_POOL_PAGES = 157  # section 3's device pool
CURVE_HOST_RATIOS = (0.0, 1.0, 2.0, 4.0, 8.0)
NO_COST_POINTS = 0.05  # capacity.COST_FREE_POINTS: a hit-rate difference below this is "no cost"
SIM_KEYS = ("hit_rate", "cached_prompt_tokens", "device_hit_tokens", "host_hit_tokens", "loaded_back_tokens",
            "written_to_host_tokens", "host_evicted_tokens", "transfer_s", "evicted_tokens", "over_evicted_tokens",
            "prompt_tokens", "sim_time_s")


@dataclass(frozen=True, order=True)
class HostPoint:
    """One simulated run: device pool (pages), host ratio (0: none), write policy, eviction mode."""

    kv_pages: int
    host_ratio: float
    write_policy: str
    mode: str

    def options(self, page_size: int, max_running: int) -> dict:
        """``shortfall_eviction.run`` keyword arguments (and so ``kvlab simulate``'s flags, :meth:`cli_args`)."""
        opts = dict(eviction=self.mode, page_size=page_size, kv_tokens=self.kv_pages * page_size,
                    max_running=max_running)
        if self.host_ratio:
            opts.update(hicache_ratio=self.host_ratio, hicache_write_policy=self.write_policy)
        return opts

    def cli_args(self, page_size: int = TRACE_PAGE_SIZE, max_running: int = TRACE_MAX_RUNNING, *,
                 trace: str | os.PathLike | None = None) -> list[str]:
        """The whole ``kvlab simulate`` command line of this point, less ``--json``: ``--trace`` (default: the
        shipped trace, relative to the working directory when that is shorter), the pool, page size, max running,
        eviction mode and, with a host tier, its ratio and write policy. ``--policy`` is left at its default,
        ``lru``, as the sweep's runs leave it."""
        from kvlab.experiments.pool_sweep import EXAMPLE_TRACE

        args = ["--trace", shown_path(EXAMPLE_TRACE if trace is None else trace), "--kv-pages", str(self.kv_pages),
                "--page-size", str(page_size), "--max-running", str(max_running), "--eviction", self.mode]
        if self.host_ratio:
            args += ["--hicache-ratio", _exact(self.host_ratio), "--hicache-write-policy", self.write_policy]
        return args


def _exact(number: float) -> str:
    """``number`` as short as it reads back exactly (``4``, ``0.5``; ``1/3`` keeps every digit)."""
    short = f"{number:g}"
    return short if float(short) == number else repr(float(number))


def trace_requests(trace=None, num_requests: int | None = None) -> list:
    """The shipped Mooncake-format trace (``data/traces/mooncake_small.jsonl``), or ``trace``, as requests sorted by
    arrival (``capacity.load``'s order), the first ``num_requests`` when given."""
    from pathlib import Path

    from kvlab.experiments.pool_sweep import EXAMPLE_TRACE
    from kvlab.workloads.mooncake import read_records, records_to_requests

    path = Path(trace) if trace is not None else EXAMPLE_TRACE
    requests = records_to_requests(read_records(path), rid_prefix=path.stem)
    return requests if num_requests is None else requests[:num_requests]


def _point_totals(requests, point: HostPoint, page_size: int, max_running: int) -> dict:
    from kvlab.experiments.shortfall_eviction import run

    result = run(requests, progress=False, **point.options(page_size, max_running))
    totals = result.totals()
    host_tokens = result.config.host_pool().size_tokens if point.host_ratio else 0
    return {**{k: totals[k] for k in SIM_KEYS if k in totals}, "host_tokens": host_tokens,
            "kv_bytes_per_token": result.config.cost.kv_bytes_per_token}


def _run_points(requests, points: Sequence[HostPoint], page_size: int, max_running: int, processes: int) -> list:
    if processes <= 1 or len(points) <= 1:
        return [_point_totals(requests, p, page_size, max_running) for p in points]

    with worker_pool(processes) as pool:
        return list(pool.map(_point_totals, [requests] * len(points), points, [page_size] * len(points),
                             [max_running] * len(points)))


_POINTS: dict = {}  # (id of the request list, point, page_size, max_running) -> totals: each run once per process
_TRACE: list = []  # the shipped trace's requests, read once


def host_sweep(requests=None, *, kv_pages: Sequence[int], host_ratios: Sequence[float] = HOST_RATIOS,
               policies: Sequence[str] = ("write_through",), modes: Sequence[str] = MODES,
               page_size: int = TRACE_PAGE_SIZE, max_running: int = TRACE_MAX_RUNNING, processes: int | None = None):
    """Device pool × host ratio × write policy × eviction mode on ``requests`` (default: the shipped trace). A host
    ratio of 0 is one device-only run per pool and mode (write policy :data:`DEVICE_ONLY`). Returns a tidy frame:
    one row per run with the point, :data:`SIM_KEYS`, ``host_tokens``, ``host_gib``, ``moved_gib`` (both
    directions, GiB) and ``kv_pages``. Seeded and deterministic; each point runs once per process (a later
    sweep that shares points with an earlier one runs only the new ones), ``processes`` at a time (default: one core
    fewer than the machine has, at least one, so a browser showing the notebook keeps a core: on two cores, Voila's
    websocket to a page whose renderer starved for 30 s closed and the rest of the notebook never ran)."""
    import pandas as pd

    processes = worker_count(max(1, (os.cpu_count() or 1) - 1) if processes is None else processes)

    from kvlab.units import GiB

    for p in policies:
        if p not in POLICIES:
            raise ValueError(f"write policy must be one of {', '.join(POLICIES)}, got {p!r}")
    for r in host_ratios:
        if isinstance(r, bool) or not isinstance(r, (int, float)) or r < 0:
            raise ValueError(f"host ratio must be a number >= 0 (0: no host tier), got {r!r}")
    if requests is None:
        if not _TRACE:
            _TRACE.extend(trace_requests())
        requests = _TRACE
    points = sorted({HostPoint(int(pages), float(r), DEVICE_ONLY if not r else p, m)
                     for pages in kv_pages for r in host_ratios for p in policies for m in modes})
    key = (id(requests), page_size, max_running)
    todo = [p for p in points if (key, p) not in _POINTS]
    for point, totals in zip(todo, _run_points(requests, todo, page_size, max_running, processes)):
        _POINTS[(key, point)] = totals
    rows = []
    for point in points:
        totals = dict(_POINTS[(key, point)])
        bpt = totals.pop("kv_bytes_per_token")
        rows.append({"kv_pages": point.kv_pages, "host_ratio": point.host_ratio, "write_policy": point.write_policy,
                     "mode": point.mode, **totals, "host_gib": totals["host_tokens"] * bpt / GiB,
                     "moved_gib": (totals["written_to_host_tokens"] + totals["loaded_back_tokens"]) * bpt / GiB})
    return pd.DataFrame(rows)


def hit_rate_frame(sweep, kv_pages: int, policies: Sequence[str] = POLICIES, mode: str | None = "shortfall"):
    """The rows of :func:`host_sweep` at one device pool for ``host_tier_plots.hit_rate_vs_host_size``: one
    ``series`` per write policy, each starting from the device-only run as host size 0; ``mode`` (default the fix)
    keeps one eviction mode, ``None`` both."""
    import pandas as pd

    rows = sweep[sweep["kv_pages"] == kv_pages]
    if mode is not None:
        rows = rows[rows["mode"] == mode]
    device = rows[rows["write_policy"] == DEVICE_ONLY]
    parts = [pd.concat([device, rows[rows["write_policy"] == p]]).assign(series=p) for p in policies]
    return pd.concat(parts).sort_values(["series", "mode", "host_ratio"], kind="stable").reset_index(drop=True)


def finding2_frame(sweep):
    """Finding 2 with a host tier, one row per (device pool, host ratio, write policy): each mode's hit rate, the
    points full eviction loses (``gap_points``: shortfall − full), and what it costs in copies: ``extra_gib_moved``
    and ``extra_transfer_s`` (full − shortfall), ``lost_hit_tokens`` (prompt tokens the fix served from a tier and
    the bug computed)."""
    import pandas as pd

    keys = ["kv_pages", "host_ratio", "write_policy"]
    fix = sweep[sweep["mode"] == "shortfall"].set_index(keys)
    bug = sweep[sweep["mode"] == "full"].set_index(keys)
    out = pd.DataFrame({
        "hit_rate_shortfall": fix["hit_rate"], "hit_rate_full": bug["hit_rate"],
        "gap_points": (100 * (fix["hit_rate"] - bug["hit_rate"])).round(4),
        "extra_gib_moved": (bug["moved_gib"] - fix["moved_gib"]).round(4),
        "extra_transfer_s": (bug["transfer_s"] - fix["transfer_s"]).round(6),
        "lost_hit_tokens": fix["cached_prompt_tokens"] - bug["cached_prompt_tokens"],
        "extra_evicted_tokens": bug["evicted_tokens"] - fix["evicted_tokens"],
        "host_evicted_tokens_full": bug["host_evicted_tokens"],
    })
    return out.reset_index()


def regime_frame(finding2, unique_prompt_pages: int):
    """:func:`finding2_frame` in ``eviction_plots.regime_heatmap``'s shape: a group per write policy (the
    device-only runs first), a row per host ratio, a column per device pool as a share of the trace's distinct
    prompt pages."""
    import pandas as pd

    rows = []
    for r in finding2.itertuples(index=False):
        group = "device only (no host tier)" if r.write_policy == DEVICE_ONLY else f"host tier, {r.write_policy}"
        regime = "no host tier" if r.write_policy == DEVICE_ONLY else f"host ratio {r.host_ratio:g}"
        rows.append(dict(group=group, regime=regime, share=r.kv_pages / unique_prompt_pages,
                         kv_tokens=r.kv_pages * TRACE_PAGE_SIZE, gap_points=r.gap_points,
                         hit_rate_shortfall=r.hit_rate_shortfall, hit_rate_full=r.hit_rate_full,
                         host_ratio=r.host_ratio, write_policy=r.write_policy, kv_pages=r.kv_pages))
    frame = pd.DataFrame(rows)
    order = {g: i for i, g in enumerate(["device only (no host tier)"] + [f"host tier, {p}" for p in POLICIES])}
    return frame.sort_values(["group", "host_ratio", "kv_pages"], key=lambda c: c.map(order) if c.name == "group"
                             else c).reset_index(drop=True)


def unique_prompt_pages(requests=None, page_size: int = TRACE_PAGE_SIZE) -> int:
    """Distinct prompt pages of ``requests`` (default: the shipped trace): what an infinite cache would hold."""
    from kvlab.experiments.pool_sweep import unique_prompt_pages as pages

    return pages(trace_requests() if requests is None else requests, page_size)


def curve_table(sweep, kv_pages: int = CURVE_POOL_PAGES, policies: Sequence[str] = POLICIES):
    """Section 3's numbers, one row per host size: the host pool (ratio, tokens, GiB) and each write policy's hit
    rate (shortfall eviction), as the figure draws them, then each policy's gain over no host tier in points."""
    import pandas as pd

    rows = hit_rate_frame(sweep, kv_pages, policies)
    first = rows[rows["series"] == policies[0]].set_index("host_ratio")
    out = {"host pool (tokens)": first["host_tokens"], "host pool (GiB)": first["host_gib"].round(3)}
    rates = {p: rows[rows["series"] == p].set_index("host_ratio")["hit_rate"] for p in policies}
    out.update({f"hit rate, {p}": rates[p] for p in policies})
    out.update({f"{p}: points over no host tier": (100 * (rates[p] - rates[p].loc[0.0])).round(2) for p in policies})
    return pd.DataFrame(out).rename_axis("--hicache-ratio (0: none)")


def host_gain_text(curve) -> str:
    """What a host pool the size of the device pool (ratio 1) adds under each policy, from :func:`curve_table`,
    and why the policy decides it."""
    gains = {c.split(":")[0]: curve.loc[1.0, c] for c in curve.columns if c.endswith("points over no host tier")}
    best = max(gains, key=gains.get)
    worst = min(gains, key=gains.get)
    listed = ", ".join(f"{p} {fmt_points(g)}" for p, g in gains.items())
    return (f"A host pool the size of the device pool (ratio 1, {curve.loc[1.0, 'host pool (GiB)']:.2f} GiB) adds: "
            f"{listed}. {worst} gains least: it copies every node to host as it is inserted, so much of its host pool "
            f"duplicates what the device holds already and little is left for what the device evicts; {best} gains "
            "most.")


# ---- section 2: the write policies side by side on the shipped trace -----------------------------------------------
POLICY_HOST_RATIOS = (1.0, 2.0)  # section 2's host pools, at section 3's device pool


def policy_numbers(sweep, kv_pages: int = CURVE_POOL_PAGES, host_ratios: Sequence[float] = POLICY_HOST_RATIOS,
                   mode: str = "shortfall"):
    """One row per (host ratio, write policy) of :func:`host_sweep` at one device pool and eviction mode, with the
    copies in GiB (``written_gib``, ``loaded_back_gib``, ``host_evicted_gib``), for the table and the bars."""
    from kvlab.units import GiB

    rows = sweep[(sweep["kv_pages"] == kv_pages) & (sweep["mode"] == mode) & sweep["host_ratio"].isin(host_ratios)
                 & sweep["write_policy"].isin(POLICIES)].copy()
    bpt = rows["host_gib"] * GiB / rows["host_tokens"]  # KV bytes per token
    for column, tokens in (("written_gib", "written_to_host_tokens"), ("loaded_back_gib", "loaded_back_tokens"),
                           ("host_evicted_gib", "host_evicted_tokens")):
        rows[column] = rows[tokens] * bpt / GiB
    order = {p: i for i, p in enumerate(POLICIES)}
    return rows.sort_values(["host_ratio", "write_policy"], key=lambda c: c.map(order) if c.name == "write_policy"
                            else c).reset_index(drop=True)


def policy_table(numbers):
    """:func:`policy_numbers` in words: one row per (host pool, write policy), flat labels."""
    import pandas as pd

    return pd.DataFrame({
        "host pool": [f"ratio {r:g} ({g:.2f} GiB)" for r, g in zip(numbers["host_ratio"], numbers["host_gib"])],
        "write policy": numbers["write_policy"],
        "hit rate (device + loaded back)": numbers["hit_rate"].map("{:.2%}".format),
        "hit on the device (tokens)": numbers["device_hit_tokens"].map("{:,}".format),
        "loaded back from host (tokens)": numbers["loaded_back_tokens"].map("{:,}".format),
        "written to host (GiB)": numbers["written_gib"].map("{:,.2f}".format),
        "loaded back (GiB)": numbers["loaded_back_gib"].map("{:,.2f}".format),
        "host copies evicted (GiB)": numbers["host_evicted_gib"].map("{:,.2f}".format),
        "transfer seconds": numbers["transfer_s"].map("{:.3f}".format),
    })


def policy_ranking(numbers, host_ratio: float) -> list[tuple[str, float]]:
    """``[(write policy, hit rate), ...]`` at one host ratio, most hits first (ties in :data:`POLICIES` order)."""
    at = numbers[numbers["host_ratio"] == host_ratio]
    return sorted(zip(at["write_policy"], at["hit_rate"]), key=lambda pr: (-pr[1], POLICIES.index(pr[0])))


def policy_verdict(numbers) -> str:
    """Which write policy gets the most hits at each host size, by how much, and which writes the most, all read
    from ``numbers`` (:func:`policy_numbers`)."""
    lines = []
    for ratio in sorted(set(numbers["host_ratio"])):
        ranking = policy_ranking(numbers, ratio)
        (best, top), (worst, low) = ranking[0], ranking[-1]
        at = numbers[numbers["host_ratio"] == ratio].set_index("write_policy")
        most = at["written_gib"].idxmax()
        order = " > ".join(f"{p} {r:.2%}" for p, r in ranking)
        lines.append(f"host ratio {ratio:g}: {order}. {best} gets the most hits, {fmt_points(100 * (top - low))} "
                     f"over {worst}; {most} writes the most to host ({at.loc[most, 'written_gib']:,.2f} GiB).")
    return "\n".join(lines)


def finding2_table(finding2):
    """:func:`finding2_frame` in words, one row per (device pool, host tier), numbers rounded for reading: the bug's
    column, the fix's, then fix − bug (``kvlab.units``' convention: positive when the fix has more), signed."""
    import pandas as pd

    return pd.DataFrame({
        "device pool (pages)": finding2["kv_pages"],
        "host tier": [("none" if p == DEVICE_ONLY else f"ratio {r:g}, {p}")
                      for r, p in zip(finding2["host_ratio"], finding2["write_policy"])],
        "hit rate, bug (full)": finding2["hit_rate_full"].map("{:.2%}".format),
        "hit rate, fix (shortfall)": finding2["hit_rate_shortfall"].map("{:.2%}".format),
        f"hit rate, {DIFFERENCE}": finding2["gap_points"].map(fmt_points),
        f"hit tokens, {DIFFERENCE}": finding2["lost_hit_tokens"].map(fmt_signed_int),
        f"GiB moved, {DIFFERENCE}": (-finding2["extra_gib_moved"]).map(lambda v: with_sign(f"{abs(v):.2f}", round(v, 2))),
        f"transfer s, {DIFFERENCE}": (-finding2["extra_transfer_s"]).map(
            lambda v: with_sign(f"{abs(v):.3f}", round(v, 3))),
    })


def finding2_verdict(finding2) -> str:
    """Where the bug costs hits with and without a host tier, and where it costs nothing, in plain words."""
    device = finding2[finding2["write_policy"] == DEVICE_ONLY]
    host = finding2[finding2["write_policy"] != DEVICE_ONLY]
    free = host[host["gap_points"].abs() < NO_COST_POINTS]
    worst_device = device["gap_points"].max() if len(device) else 0.0
    worst_host = host.loc[host["gap_points"].idxmax()] if len(host) else None
    parts = [f"Without a host tier full eviction (the bug) hits up to {abs(worst_device):.2f} points less than the "
             f"fix ({DIFFERENCE}: {fmt_points(worst_device)})."]
    if worst_host is not None:
        parts.append(f"With one it costs nothing in {len(free)} of {len(host)} settings (under {NO_COST_POINTS} "
                     f"points); at worst the bug hits {abs(worst_host.gap_points):.2f} points less ({DIFFERENCE}: "
                     f"{fmt_points(worst_host.gap_points)}; device pool "
                     f"{int(worst_host.kv_pages)} pages, host ratio {worst_host.host_ratio:g}, "
                     f"{worst_host.write_policy}).")
        parts.append(f"Its price there is copies: up to {host['extra_gib_moved'].max():.2f} GiB more moved between host "
                     f"and device and {host['extra_transfer_s'].max():.3f} s more of transfers.")
    return " ".join(parts)


# ---- the README's HiCache headline, computed ------------------------------------------------------------------------
HEADLINE_POOL_PAGES = 100  # the README's `kvlab simulate --trace ... --kv-pages 100 --hicache-ratio 4`
HEADLINE_HOST_RATIO = 4.0


@dataclass(frozen=True)
class HiCacheHeadline:
    """The README's HiCache line: the shipped trace on a device pool of ``kv_pages`` pages, without a host tier and
    with one ``host_ratio`` × the device pool (write_through, shortfall eviction: ``kvlab simulate``'s defaults)."""

    kv_pages: int
    host_ratio: float
    hit_rate_device_only: float
    hit_rate_with_host: float
    host_gib: float
    command: str

    @property
    def points(self) -> float:
        return 100 * (self.hit_rate_with_host - self.hit_rate_device_only)

    def text(self) -> str:
        return (f"HiCache's host tier on the shipped trace, device pool {self.kv_pages} pages: a host pool "
                f"{self.host_ratio:g}× the device pool ({self.host_gib:.2f} GiB): hit rate {_pct(self.hit_rate_device_only)} → "
                f"{_pct(self.hit_rate_with_host)} ({fmt_points(self.points)}, with − without). From a shell: {self.command}")


def _pct(rate: float) -> str:
    return f"{100 * rate:.2f} %"  # the README's "18.37 %"


def hicache_headline(kv_pages: int = HEADLINE_POOL_PAGES, host_ratio: float = HEADLINE_HOST_RATIO) -> HiCacheHeadline:
    """:class:`HiCacheHeadline` from two :func:`host_sweep` runs (the runs ``kvlab simulate`` makes)."""
    sweep = host_sweep(kv_pages=[kv_pages], host_ratios=(0.0, host_ratio), modes=("shortfall",))
    without = sweep[sweep["host_ratio"] == 0.0].iloc[0]
    with_host = sweep[sweep["host_ratio"] == host_ratio].iloc[0]
    point = HostPoint(kv_pages, host_ratio, "write_through", "shortfall")
    return HiCacheHeadline(kv_pages, host_ratio, float(without["hit_rate"]), float(with_host["hit_rate"]),
                           float(with_host["host_gib"]), "kvlab simulate " + " ".join(point.cli_args()) + " --json")
