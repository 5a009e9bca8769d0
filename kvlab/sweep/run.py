"""Run a grid: check it whole, skip the points an earlier run already wrote, run the rest on an engine, and write
each row as it finishes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlab.sched import RequestLike
from kvlab.sweep.engine import Finished, make_engine
from kvlab.sweep.grid import Grid, SweepError
from kvlab.sweep.point import TIMING_COLUMNS, Point
from kvlab.sweep.store import COLUMNS, RowFile, open_row_file, row_key


@dataclass(frozen=True)
class SweepRun:
    """A finished sweep: ``rows`` in grid order, one per point (read from ``out`` or computed now).

    ``computed`` points ran in this call, in ``seconds`` of wall-clock time on ``engine``; ``skipped`` were
    already in ``out``. Two sweeps of the same grid give equal :meth:`comparable` frames whichever engine ran
    them: only the timing columns (:data:`~kvlab.sweep.point.TIMING_COLUMNS`) differ."""

    rows: tuple[dict, ...]
    computed: int
    skipped: int
    seconds: float
    engine: str
    workers: int | None
    out: Path | None = None

    @property
    def points(self) -> int:
        return len(self.rows)

    @property
    def points_per_minute(self) -> float | None:
        """Points computed per minute of wall-clock time (None when nothing was computed)."""
        return 60.0 * self.computed / self.seconds if self.computed and self.seconds > 0 else None

    @property
    def frame(self):
        import pandas as pd

        return pd.DataFrame(list(self.rows), columns=list(COLUMNS))

    def comparable(self):
        """:attr:`frame` without the wall-clock columns: what must be equal between engines and reruns."""
        return self.frame.drop(columns=list(TIMING_COLUMNS))

    def cost(self) -> str:
        """One line: what the sweep cost (the notebooks and the CLI print it)."""
        where = f"{self.engine} × {self.workers}" if self.workers else self.engine
        rate = f", {self.points_per_minute:,.0f} points/minute" if self.points_per_minute else ""
        skipped = f" ({self.skipped} already in {self.out.name})" if self.skipped and self.out else ""
        return f"{self.points} points{skipped}: {self.computed} computed on {where}, took {self.seconds:.1f} s{rate}"


def _params(source: str, seed: int, point: Point) -> dict:
    """The row's first columns (PARAM_COLUMNS, in order): what identifies the point in a file."""
    return dict(source=source, seed=seed, eviction=point.eviction, policy=point.policy, page_size=point.page_size,
                max_running=point.max_running, kv_pages=point.kv_pages, kv_tokens=point.kv_tokens,
                hicache_ratio=float(point.hicache_ratio), hicache_write_policy=point.hicache_write_policy,
                hicache_storage_backend=point.hicache_storage_backend,
                hicache_storage_prefetch_policy=point.hicache_storage_prefetch_policy)


def _row(source: str, seed: int, point: Point, totals: dict) -> dict:
    values = _params(source, seed, point) | totals
    return {c: values[c] for c in COLUMNS}


def run_sweep(requests: Sequence[RequestLike], grid: Grid, *, source: str = "requests", seed: int = 0,
              engine: str | Any = "local", workers: int | None = None, ray_address: str | None = None,
              out: str | os.PathLike | None = None, progress: bool | None = None, extra: dict | None = None,
              on_row: Callable[[dict, Finished], None] | None = None) -> SweepRun:
    """Run every point of ``grid`` on ``requests``; a row is the point's settings (``source`` and ``seed`` say
    what the requests are) and its ``kvlab simulate`` totals.

    ``out`` (.csv or .parquet): rows are written as they finish, and points already in the file are not run
    again, so an interrupted sweep resumes where it stopped. ``engine``: ``"local"`` (``workers`` processes),
    ``"ray"`` (``ray_address``, or a local cluster), or an engine object. ``extra``: other ``SchedulerConfig``
    fields for every point (not columns: a file's rows must all share them). ``on_row(row, finished)`` is
    called after each new row is written."""
    extra = dict(extra or {})
    points = grid.points(requests)  # every value checked before anything runs or any file is touched
    runner = make_engine(engine, workers=workers, ray_address=ray_address)
    store = open_row_file(out, write=True) if out is not None else None  # this sweep is its one writer
    try:
        return _run(requests, points, runner, store, source=source, seed=seed, out=out, progress=progress,
                    extra=extra, on_row=on_row)
    finally:
        if store is not None:
            store.close()


def _run(requests: Sequence[Any], points: list[Point], runner: Any, store: RowFile | None, *, source: str,
         seed: int, out: str | os.PathLike | None, progress: bool | None, extra: dict,
         on_row: Callable[[dict, Finished], None] | None) -> SweepRun:
    from kvlab.progress import progress_bar

    wanted = {row_key(_params(source, seed, p)): i for i, p in enumerate(points)}
    rows: dict[int, dict] = {}
    others: list[dict] = []  # rows of the file that are not points of this grid: kept, after the grid's
    for row in store.rows if store else ():
        index = wanted.get(row_key(row))
        if index is None:
            others.append(row)
        elif index not in rows:
            rows[index] = row
    skipped = len(rows)
    todo = [i for i in range(len(points)) if i not in rows]

    def ordered() -> list[dict]:
        return [rows[i] for i in sorted(rows)] + others

    where = f"{runner.name} × {getattr(runner, 'workers', None) or '?'}"
    bar = progress_bar(total=len(points), initial=skipped, desc=f"sweep ({where})", enabled=progress, unit="point")

    def finished(done: Finished) -> None:
        index = todo[done.index]
        row = _row(source, seed, points[index], done.totals)
        rows[index] = row
        if store is not None:
            store.append(row, ordered)
        bar.update(1)
        if on_row is not None:
            on_row(row, done)

    start = time.perf_counter()
    try:
        if todo:
            runner.run(requests, [points[i] for i in todo], extra, finished)
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    if store is not None:
        store.finish(ordered())  # in grid order, now that every point is there
    if len(rows) != len(points):  # an engine must report every point or raise
        raise SweepError(f"sweep ended with {len(rows)} of {len(points)} points")
    return SweepRun(tuple(rows[i] for i in range(len(points))), len(todo), skipped, seconds, runner.name,
                    getattr(runner, "workers", None), Path(out) if out is not None else None)

