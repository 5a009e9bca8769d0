"""The grid a sweep runs: one axis per ``kvlab simulate`` setting, checked whole before any point runs.

Grid order (the order of :meth:`Grid.points`, and of the rows in a finished output file) is eviction, then
policy, page size, max running and pool size, each axis in the order given: a two-mode pool sweep reads as
one block of rows per mode, pools ascending within it; then HiCache's host ratio and write policy (a ratio of 0,
no host tier, is one point whatever the write policies).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.argtypes import MAX_PAGE_POOL, MAX_POOL
from kvlab.errors import KvlabError
from kvlab.sched import RequestLike
from kvlab.sweep.point import Point, default_kv_tokens

MODES = ("shortfall", "full")


class SweepError(KvlabError, ValueError):
    """A sweep that cannot run as asked: a bad grid, an engine that is missing, an --out that is not a sweep's."""


def parse_list(text: str, flag: str, kind: type = str) -> tuple:
    """``"a,b,c"`` as a tuple (spaces dropped); ``kind=int`` parses positive integers up to ``MAX_POOL`` (a pool,
    ``--kv-pages`` / ``--kv-tokens``: ``MAX_PAGE_POOL``, the page engine's; ``check_pool`` holds each point to its
    memory's bound), ``kind=float``
    numbers. An empty list (``""``) and an empty item (``"30,,40"``) are both refused (issue 26: ``""`` meant the default)."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise SweepError(f"{flag}: expected a comma-separated list, got {text[:40]!r}")
    if not all(items):
        raise SweepError(f"{flag}: an empty item in {text[:60]!r}; expected a comma-separated list, e.g. 30,40")
    if kind is int:
        out = []
        for item in items:
            try:
                value = int(item)
            except ValueError:
                raise SweepError(f"{flag}: expected positive integers, got {item[:40]!r}") from None
            bound = MAX_PAGE_POOL if flag in ("--kv-pages", "--kv-tokens") else MAX_POOL
            if value > bound:
                raise SweepError(f"{flag}: expected at most {bound:,}, got {item[:40]}")
            out.append(value)
        items = out
    elif kind is float:
        try:
            items = [float(item) for item in items]
        except ValueError:
            raise SweepError(f"{flag}: expected numbers, got {text!r}") from None
    return tuple(items)


def _distinct(values: Iterable) -> tuple:
    return tuple(dict.fromkeys(values))


def _positive_ints(values: Sequence[Any], flag: str) -> tuple[int, ...]:
    out = []
    for value in values:
        # numbers.Integral so numpy's ints pass; bool is an int but not a size
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise SweepError(f"{flag}: expected positive integers, got {value!r}")
        out.append(int(value))
    if not out:
        raise SweepError(f"{flag}: no values given")
    return _distinct(out)


@dataclass(frozen=True)
class Grid:
    """The axes of a sweep (each a tuple; one value is a one-point axis). The pool is ``kv_pages`` or
    ``kv_tokens`` (at most one); with neither, each page size gets ``kvlab simulate``'s default pool."""

    evictions: tuple[str, ...] = MODES
    policies: tuple[str, ...] = ("lru",)
    page_sizes: tuple[int, ...] = (1,)
    max_running: tuple[int, ...] = (256,)
    kv_pages: tuple[int, ...] | None = None
    kv_tokens: tuple[int, ...] | None = None
    hicache_ratios: tuple[float, ...] = (0.0,)  # 0: no host tier
    hicache_write_policies: tuple[str, ...] = ("write_through",)
    hicache_storage_backends: tuple[str, ...] = ("none",)  # none: no storage tier (L3)
    hicache_storage_prefetch_policies: tuple[str, ...] = ("best_effort",)

    def checked(self) -> Grid:
        """The grid with every value checked (and repeats dropped), or a :class:`SweepError` naming the value."""
        from kvlab.mem_cache.common import EVICTION_MODES
        from kvlab.mem_cache.evict_policy import EVICTION_POLICIES

        _known("--eviction", "eviction mode", self.evictions, EVICTION_MODES)
        _known("--policy", "eviction policy", self.policies, sorted(EVICTION_POLICIES))
        if not self.evictions or not self.policies:
            raise SweepError(f"--eviction and --policy need at least one value each, got {self.evictions!r} "
                             f"and {self.policies!r}")
        if self.kv_pages is not None and self.kv_tokens is not None:
            raise SweepError("give the pool sizes as --kv-pages or as --kv-tokens, not both")
        from kvlab.mem_cache.options import WRITE_POLICIES
        from kvlab.sched.config import MAX_HICACHE

        top = MAX_HICACHE["hicache_ratio"]
        for ratio in self.hicache_ratios:
            if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 <= ratio <= top \
                    or ratio != ratio:
                raise SweepError(f"--hicache-ratio: expected numbers in [0, {top:g}] (0: no host tier), got {ratio!r}")
        _known("--hicache-write-policy", "write policy", self.hicache_write_policies, WRITE_POLICIES)
        if not self.hicache_ratios or not self.hicache_write_policies:
            raise SweepError("--hicache-ratio and --hicache-write-policy need at least one value each")
        self._check_storage()
        return Grid(
            hicache_ratios=_distinct(float(r) for r in self.hicache_ratios),
            hicache_write_policies=_distinct(self.hicache_write_policies),
            hicache_storage_backends=_distinct(self.hicache_storage_backends),
            hicache_storage_prefetch_policies=_distinct(self.hicache_storage_prefetch_policies),
            evictions=_distinct(self.evictions), policies=_distinct(self.policies),
            page_sizes=_positive_ints(self.page_sizes, "--page-size"),
            max_running=_positive_ints(self.max_running, "--max-running"),
            kv_pages=None if self.kv_pages is None else _positive_ints(self.kv_pages, "--kv-pages"),
            kv_tokens=None if self.kv_tokens is None else _positive_ints(self.kv_tokens, "--kv-tokens"))

    def _check_storage(self) -> None:
        from kvlab.mem_cache.hicache.storage import PREFETCH_POLICIES, STORAGE_BACKENDS

        _known("--hicache-storage-backend", "storage backend", self.hicache_storage_backends,
               ("none", *STORAGE_BACKENDS))
        _known("--hicache-storage-prefetch-policy", "prefetch policy", self.hicache_storage_prefetch_policies,
               PREFETCH_POLICIES)
        if not self.hicache_storage_backends or not self.hicache_storage_prefetch_policies:
            raise SweepError("--hicache-storage-backend and --hicache-storage-prefetch-policy need at least one "
                             "value each")

    def _host_points(self) -> list[tuple]:
        """The host-tier settings of a point: (ratio, write policy, storage backend, prefetch policy); a setting read
        only with the one before it (the write policy and a backend with a host tier, the prefetch policy with a
        backend) is one point without it."""
        out = []
        for ratio in self.hicache_ratios:
            for wp in (self.hicache_write_policies if ratio else self.hicache_write_policies[:1]):
                for backend in (self.hicache_storage_backends if ratio else ("none",)):
                    prefetch = self.hicache_storage_prefetch_policies
                    out += [(ratio, wp, backend, p) for p in (prefetch if backend != "none" else prefetch[:1])]
        return out

    def pools(self, requests: Sequence[RequestLike], page_size: int) -> tuple[int, ...]:
        """The pool sizes in tokens at ``page_size``."""
        if self.kv_pages is not None:
            return tuple(pages * page_size for pages in self.kv_pages)
        if self.kv_tokens is not None:
            return self.kv_tokens
        return (default_kv_tokens(requests, page_size),)

    def points(self, requests: Sequence[RequestLike]) -> list[Point]:
        """Every point in grid order, after checking that each can run, with the check ``kvlab simulate`` makes
        (:func:`kvlab.sched.config.check_pool`: a page that fits a prefill chunk, a pool of whole pages within the
        simulator's bound that holds the longest request alone; then the point's whole ``SchedulerConfig``).
        Raises :class:`SweepError` naming the first value that cannot."""
        from kvlab.sched.config import check_pool, request_extent

        grid = self.checked()
        if not requests:
            raise SweepError("no requests to sweep")
        extent = request_extent(requests)
        for page_size in grid.page_sizes:
            for kv in grid.pools(requests, page_size):
                pool = (f"--kv-pages {kv // page_size}" if grid.kv_pages is not None else
                        f"--kv-tokens {kv}" if grid.kv_tokens is not None else "the default pool")
                try:
                    check_pool(extent, page_size=page_size, kv_tokens=kv, page_flag=f"--page-size {page_size}",
                               pool_flag=pool)
                except ValueError as exc:
                    raise SweepError(str(exc)) from None
        points = [Point(eviction, policy, page_size, max_running, kv, *host)
                  for eviction in grid.evictions for policy in grid.policies for page_size in grid.page_sizes
                  for max_running in grid.max_running for kv in grid.pools(requests, page_size)
                  for host in grid._host_points()]
        for point in points:  # every other setting as SchedulerConfig checks it for kvlab simulate
            try:
                point.config()
            except ValueError as exc:
                raise SweepError(f"the point {_settings(point)}: {exc}") from None
        return points


def _settings(point: Point) -> str:
    """A point's settings as sweep flags, for an error naming it."""
    host = f" --hicache-ratio {point.hicache_ratio:g}" if point.hicache_ratio else ""
    if point.hicache_storage_backend != "none":
        host += f" --hicache-storage-backend {point.hicache_storage_backend}"
    return (f"--page-size {point.page_size} --kv-tokens {point.kv_tokens} --max-running {point.max_running}"
            f"{host}")


def _known(flag: str, what: str, values, known) -> None:
    """A SweepError naming ``flag`` and the first of ``values`` that is not one of ``known``."""
    for value in values:
        if value not in known:
            raise SweepError(f"{flag}: unknown {what} {value!r} (known: {', '.join(known)})")
