"""Capacity planning on a Mooncake-format trace: hit rate against KV pool size in both eviction modes, and the
regime map of where full eviction (the bug, SGLang ≤ 0.5.16) costs hit rate and where it does not.

One sweep (:func:`kvlab.sweep.run_sweep`, the code path of ``kvlab sweep``) over pool size × max running ×
eviction mode gives both: the curve is the rows at one max running, the map is ``shortfall − full`` at every
(pool, max running). Notebook 06 draws them; :meth:`CapacityResult.cli` is the same sweep from a shell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from kvlab.experiments.pool_sweep import EXAMPLE_TRACE, default_pool_pages
from kvlab.paths import shown_path
from kvlab.sweep import Grid, SweepRun, run_sweep

DEFAULT_MAX_RUNNING = (4, 16, 256)  # a server that runs few requests at once, a middling one, SGLang's scale
DEFAULT_NUM_POINTS = 6
COST_FREE_POINTS = 0.05  # a hit-rate loss below this many points is "no cost" in the verdict


@dataclass(frozen=True)
class CapacityResult:
    """The sweep's rows and what a planner reads from them (``frame``: one row per point, ``mode`` = eviction)."""

    trace: Path
    num_requests: int
    page_size: int
    policy: str
    pool_pages: tuple[int, ...]
    max_running: tuple[int, ...]
    ideal_hit_rate: float | None  # an infinite cache's hit rate (counted in 512-token blocks), when it applies
    sweep: SweepRun
    whole_trace: bool = True  # False: the sweep ran the trace's first num_requests arrivals only

    @property
    def frame(self):
        return self.sweep.frame.rename(columns={"eviction": "mode"})

    def curve(self, max_running: int | None = None):
        """The rows at one max running (default: the largest), for ``sweep_plots.hit_rate_vs_pool``."""
        running = max(self.max_running) if max_running is None else max_running
        if running not in self.max_running:
            raise ValueError(f"max_running={running!r} is not in the sweep's {self.max_running}")
        frame = self.frame
        return frame[frame["max_running"] == running].reset_index(drop=True)

    def hit_rates(self, max_running: int | None = None):
        """Hit rate (0-1) at one max running: a row per pool size (pages), a column per mode."""
        table = self.curve(max_running).pivot(index="kv_pages", columns="mode", values="hit_rate")
        return table[[m for m in ("shortfall", "full") if m in table.columns]]

    def loss_points(self):
        """Hit-rate points lost to full eviction, ``100 × (shortfall − full)``: a row per max running, a column
        per pool size (pages). Positive: the bug costs there; 0: it does not; negative: it happened to help."""
        table = self.frame.pivot_table(index="max_running", columns=["kv_pages", "mode"], values="hit_rate")
        loss = 100 * (table.xs("shortfall", axis=1, level="mode") - table.xs("full", axis=1, level="mode"))
        loss = loss.round(4).sort_index().sort_index(axis=1)
        loss.index.name, loss.columns.name = "max running", "KV pool (pages)"
        return loss

    def verdict(self) -> str:
        """Where the bug costs and where it does not, in one or two sentences."""
        loss = self.loss_points()
        worst = loss.stack()
        (running, pages), points = worst.idxmax(), worst.max()
        free = int((worst.abs() < COST_FREE_POINTS).sum())
        costly_pools = sorted({p for (_, p), v in worst.items() if v >= COST_FREE_POINTS})
        if points < COST_FREE_POINTS:
            return (f"Full eviction costs no hit rate anywhere on this grid (every difference is under "
                    f"{COST_FREE_POINTS} points): at these pools the tokens it evicts early are not asked for again.")
        where = ", ".join(f"{p:,}" for p in costly_pools)
        return (f"Full eviction costs up to {points:.2f} points of hit rate (pool {pages:,} pages, max running "
                f"{running}); it costs at pools of {where} pages and nothing at {free} of the {worst.size} "
                f"settings: a pool large enough to keep what the trace comes back to makes the bug harmless.")

    def cli(self, out: str = "capacity.csv") -> str:
        """The same sweep as a ``kvlab sweep`` command line to run from the working directory (add ``--engine ray``
        to run it on a cluster)."""
        command = (f"kvlab sweep --trace {shown_path(self.trace)} --kv-pages {','.join(map(str, self.pool_pages))} "
                   f"--max-running {','.join(map(str, self.max_running))} --page-size {self.page_size} "
                   f"--policy {self.policy} --out {out}")
        note = f"  # on the whole trace; this sweep ran its first {self.num_requests} requests"
        return command + ("" if self.whole_trace else note)


class Trace(NamedTuple):
    path: Path
    requests: list  # kvlab Requests, the first num_requests arrivals when asked
    records: list  # the same arrivals as Mooncake records (for trace_stats)
    whole: bool  # every request of the file


def load(trace: str | Path | None = None, num_requests: int | None = None) -> Trace:
    """A Mooncake-format trace (default: the shipped one), its first ``num_requests`` arrivals when given."""
    from kvlab.workloads.mooncake import read_records, records_to_requests

    path = Path(trace) if trace is not None else EXAMPLE_TRACE
    records = read_records(path)  # the file read once: load_trace's requests are these records, converted
    requests = records_to_requests(records, rid_prefix=path.stem)  # sorted by arrival, ties in file order
    records = sorted(records, key=lambda r: r.timestamp_ms)  # the same (stable) order as the requests
    if num_requests is not None and (not isinstance(num_requests, int) or isinstance(num_requests, bool)
                                     or num_requests < 1):
        raise ValueError(f"num_requests must be a positive int, got {num_requests!r}")
    total = len(requests)
    if num_requests is not None:
        requests, records = requests[:num_requests], records[:num_requests]
    return Trace(path, requests, records, len(requests) == total)


def run(trace: str | Path | None = None, *, pool_pages: Sequence[int] | None = None,
        num_points: int = DEFAULT_NUM_POINTS, max_running: Sequence[int] = DEFAULT_MAX_RUNNING, page_size: int = 512,
        policy: str = "lru", num_requests: int | None = None, engine: str | Any = "local",
        workers: int | None = None, ray_address: str | None = None, out: str | Path | None = None,
        progress: bool | None = None) -> CapacityResult:
    """Sweep pool size × max running × both eviction modes on a trace. ``pool_pages=None``: ``num_points``
    log-spaced sizes from one request's worth to every distinct block cached (``pool_sweep.default_pool_pages``).
    ``engine``/``workers``/``ray_address``/``out`` as in :func:`kvlab.sweep.run_sweep`."""
    from kvlab.workloads.mooncake import MOONCAKE_BLOCK_SIZE, trace_stats

    path, requests, records, whole = load(trace, num_requests)
    pools = tuple(pool_pages) if pool_pages is not None else tuple(default_pool_pages(requests, page_size, num_points))
    grid = Grid(page_sizes=(page_size,), policies=(policy,), max_running=tuple(max_running), kv_pages=pools)
    sweep = run_sweep(requests, grid, source=str(path), engine=engine, workers=workers, ray_address=ray_address,
                      out=out, progress=progress)
    checked = grid.checked()
    # the ideal counts whole 512-token blocks: with smaller pages a hit can also land inside one
    ideal = trace_stats(records).ideal_hit_rate if page_size == MOONCAKE_BLOCK_SIZE else None
    return CapacityResult(path, len(requests), page_size, policy, checked.kv_pages, tuple(sorted(checked.max_running)),
                          ideal, sweep, whole)


# ---- a host tier (SGLang's HiCache) as one more axis ------------------------------------------------------------
DEFAULT_HOST_RATIOS = (1.0, 4.0)  # --hicache-ratio: a host pool as big as the device pool, and four times it
HOST_MAX_RUNNING = 16


@dataclass(frozen=True)
class HostAxis:
    """Hit rate against pool size with host pools beside it (``frame``: one row per run; ``host_ratio`` 0 is the
    device-only sweep's own rows, the others are ``host_tier_sweep.host_sweep`` runs at the same pools)."""

    frame: Any
    max_running: int
    write_policy: str
    host_ratios: tuple[float, ...]
    trace: Path
    page_size: int

    def hit_rates(self):
        """Hit rate (0-1): a row per pool (pages), a column per (host ratio, mode); ratio 0 = no host tier."""
        table = self.frame.pivot_table(index="kv_pages", columns=["host_ratio", "mode"], values="hit_rate")
        modes = [m for m in ("shortfall", "full") if m in table.columns.get_level_values("mode")]
        table = table.reindex(columns=[(r, m) for r in sorted(set(table.columns.get_level_values(0))) for m in modes])
        table.index.name = "KV pool (pages)"
        return table

    def gain_points(self):
        """Hit-rate points a host pool adds over the device-only server (shortfall): a row per pool, a column per
        host ratio."""
        rates = self.hit_rates().xs("shortfall", axis=1, level="mode")
        return (100 * rates.sub(rates[0.0], axis=0)).drop(columns=[0.0]).round(2)

    def cli(self, kv_pages: int, host_ratio: float) -> str:
        """One point of the axis as a ``kvlab simulate`` command."""
        return (f"kvlab simulate --trace {shown_path(self.trace)} --kv-pages {kv_pages} --page-size {self.page_size} "
                f"--max-running {self.max_running} --hicache-ratio {host_ratio:g} "
                f"--hicache-write-policy {self.write_policy} --json")


def host_axis(result: CapacityResult, host_ratios: Sequence[float] = DEFAULT_HOST_RATIOS, *,
              max_running: int | None = None, write_policy: str = "write_through",
              processes: int = 2) -> HostAxis:
    """``result``'s pools at one max running (default :data:`HOST_MAX_RUNNING` when swept, else the largest), run
    again with each host ratio beside them (both eviction modes, ``write_policy``); the device-only rows come from
    ``result`` itself."""
    import pandas as pd

    from kvlab.experiments import host_tier_sweep

    running = max_running if max_running is not None else (
        HOST_MAX_RUNNING if HOST_MAX_RUNNING in result.max_running else max(result.max_running))
    ratios = tuple(float(r) for r in host_ratios if r)
    if not ratios:
        raise ValueError(f"host_ratios: give at least one ratio > 0 (--hicache-ratio), got {list(host_ratios)!r}")
    requests = load(result.trace, None if result.whole_trace else result.num_requests).requests
    hosted = host_tier_sweep.host_sweep(requests, kv_pages=result.pool_pages, host_ratios=ratios,
                                        policies=(write_policy,), page_size=result.page_size, max_running=running,
                                        processes=processes)
    device = result.curve(running)[["kv_pages", "mode", "hit_rate"]].assign(
        host_ratio=0.0, write_policy=host_tier_sweep.DEVICE_ONLY, host_gib=0.0)
    frame = pd.concat([device, hosted[list(device.columns) + ["loaded_back_tokens", "transfer_s"]]],
                      ignore_index=True).fillna({"loaded_back_tokens": 0, "transfer_s": 0.0})
    return HostAxis(frame, running, write_policy, (0.0, *ratios), result.trace, result.page_size)
