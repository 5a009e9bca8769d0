"""The storage tier's threads on the modelled clock: prefetch (storage -> host) and backup (host -> storage).

Upstream (SGLang 0.5.16 and 0.5.23 alike): ``managers/cache_controller.py::HiCacheController``'s ``prefetch``,
``prefetch_thread_func`` (``_storage_hit_query``: the chained page keys of the prompt past the host match,
``batch_exists``; fewer hit tokens than ``prefetch_threshold``: revoked), ``prefetch_io_aux_func`` /
``_page_transfer`` (pages read in order, ``completed_tokens`` growing page by page, stopping when the scheduler
terminates the operation), ``terminate_prefetch``, ``prefetch_rate_limited`` (no new prefetch while the
prefetches in flight hold half the host pool), ``write_storage`` / ``backup_thread_func`` / ``_page_backup``; and
the host allocation for a hit, ``hiradix_cache.py::_drain_and_alloc_storage_hit`` (evict host first, else a
shorter page-aligned prefix if it still reaches the threshold, else revoke).

kvlab moves no bytes. Each direction is a FIFO channel on the host controller's clock: a read of ``n`` pages
starts when its slots are taken or when the channel frees, and its ``k``-th page lands ``k * page_bytes /
read_bytes_per_s`` after it starts; a backup lands whole at ``latency_s + n * page_bytes / write_bytes_per_s``,
and its keys enter the store then. A prefetch's host slots are taken (:meth:`StorageController.allocate`) at the
tree's first poll once the query's ``latency_s`` has passed, as SGLang allocates at the next
``check_hicache_events`` after its thread's query. Differs on purpose: the query's answer is computed at issue; a
terminated read frees the channel at the end of the page in flight; no batches of
``STORAGE_BATCH_SIZE`` pages, no TP all-reduce (one rank).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

from kvlab.mem_cache.hicache.cache_controller import check_channel
from kvlab.mem_cache.hicache.storage import HiCacheStorage
from kvlab.mem_cache.options import FINISH_TOLERANCE_S

if TYPE_CHECKING:
    import torch


@dataclass(eq=False)
class PrefetchOperation:
    """One prefetch: ``token_ids`` (whole pages past the host match), the storage hit it found (``hash_value``:
    the keys of the hit pages, interned by the store, ``storage_hit_count`` tokens), the host slots it reads into, and its read on the
    channel (``start_s``: begins, ``end_s``: set when terminated)."""

    request_id: object
    token_ids: list[int]
    last_hash: int | None
    issue_s: float
    hash_value: list[int] = field(default_factory=list)
    storage_hit_count: int = 0
    host_indices: torch.Tensor | range | None = None  # (range: the page tree's count)
    start_s: float = 0.0
    page_s: float = 0.0
    latency_s: float = 0.0
    page_size: int = 1
    terminated: bool = False
    alloc_due_s: float = 0.0  # when the hit query has answered: its host slots are taken at the next poll
    queued_s: float = 0.0  # when its read was queued on the channel (its slots taken)

    @property
    def finish_s(self) -> float:
        return self.start_s + self.latency_s + len(self.hash_value) * self.page_s

    def completed_tokens(self, now_s: float) -> int:
        """Tokens read into host by ``now_s`` (whole pages)."""
        if self.host_indices is None:
            return 0
        done = now_s - self.start_s - self.latency_s + FINISH_TOLERANCE_S
        if done < 0:
            return 0
        pages = len(self.hash_value) if self.page_s == 0 else min(len(self.hash_value),
                                                                  int(done / self.page_s + 1e-9))
        return pages * self.page_size


@dataclass(eq=False, slots=True)
class BackupOperation:
    """One backup host -> storage: the page keys and the node whose host copy it reads (host-protected until the
    ack)."""

    hash_value: list[int]
    node: object
    finish_s: float

    @property
    def pages(self) -> int:
        return len(self.hash_value)


@dataclass
class StorageTotals:
    """What the storage tier did since the controller was made: tokens found in storage by prefetch queries,
    read into host (``prefetched_tokens``), found but not read (terminated early or no host room:
    ``prefetch_aborted_tokens``), and backed up (``written_to_storage_tokens``, keys set at the backup's ack)."""

    storage_hit_tokens: int = 0
    prefetched_tokens: int = 0
    prefetch_aborted_tokens: int = 0
    written_to_storage_tokens: int = 0
    prefetches: int = 0
    revoked: int = 0


class StorageController:
    """The prefetch and backup channels between a host pool (``host_controller.mem_pool_host``) and
    ``storage``, timed on ``host_controller``'s clock."""

    def __init__(self, host_controller, storage: HiCacheStorage, page_size: int, read_bytes_per_s: float,
                 write_bytes_per_s: float, latency_s: float, prefetch_threshold: int = 256):
        check_channel(latency_s, read_bytes_per_s=read_bytes_per_s, write_bytes_per_s=write_bytes_per_s)
        self.host_controller = host_controller
        self.mem_pool_host = host_controller.mem_pool_host
        self.storage = storage
        self.page_size = page_size
        self.read_bytes_per_s = read_bytes_per_s
        self.write_bytes_per_s = write_bytes_per_s
        self.latency_s = latency_s
        self.prefetch_threshold = prefetch_threshold
        self.prefetch_capacity_limit = int(0.5 * self.mem_pool_host.size)
        self.write_page_s = self._page_seconds(write_bytes_per_s)  # a page's write on the backup channel
        # a key's page keys: of its tokens (get_hash_str's chain, interned); the page tree gives its own, over page ids
        self.hash_keys = self.page_ids
        self.reset()

    def reset(self) -> None:
        self.prefetch_tokens_occupied = 0
        self.reading: list[PrefetchOperation] = []  # prefetches with host slots, in channel order
        self.read_free_s = 0.0  # the channel is free from here for ops not in ``reading``
        self.backup_queue: list[BackupOperation] = []
        self.write_free_s = 0.0
        self.totals = StorageTotals()

    @property
    def now_s(self) -> float:
        return self.host_controller.now_s

    def _page_seconds(self, bytes_per_s: float) -> float:
        return 0.0 if math.isinf(bytes_per_s) else self.storage.page_bytes / bytes_per_s

    def page_ids(self, token_ids, prior: int | None = None, known: bool = False) -> list[int]:
        """The store's interned keys of the pages of ``token_ids`` after the key ``prior``
        (:meth:`HiCacheStorage.page_ids`: ``get_hash_str``'s chain, its hex on demand; ``known``: up to the first
        not interned, :meth:`HiCacheStorage.chain`'s)."""
        return self.storage.page_ids(token_ids, prior, self.page_size, known)

    # -- prefetch (storage -> host) -------------------------------------------------------------------
    def prefetch_rate_limited(self) -> bool:
        return self.prefetch_tokens_occupied >= self.prefetch_capacity_limit

    def storage_hit_query(self, token_ids, last_hash: int | None) -> tuple[list[int], int]:
        """``_storage_hit_query``: the keys of the pages of ``token_ids`` present in storage consecutively from the
        first, and their tokens (the pages past the first key never interned are not keyed: no store holds them)."""
        keys = self.hash_keys(token_ids, last_hash, True)
        hit = self.storage.batch_exists(keys, interned=True)
        return keys[:hit], hit * self.page_size

    def prefetch(self, request_id, token_ids, last_hash: int | None) -> PrefetchOperation | None:
        """Query storage for ``token_ids`` (``prefetch_thread_func``). None: revoked, too small a hit. Else the
        operation, its host slots taken by :meth:`allocate` once the query's ``latency_s`` has passed (at the
        scheduler's next ``check_hicache_events``: a request scheduled before then gets nothing from it)."""
        hash_value, hit = self.storage_hit_query(token_ids, last_hash)
        totals = self.totals
        totals.prefetches += 1
        totals.storage_hit_tokens += hit
        if hit < self.prefetch_threshold or not hit:  # (a threshold of 0: nothing found is nothing to read)
            totals.revoked += 1
            return None
        op = PrefetchOperation(request_id, token_ids, last_hash, self.now_s, hash_value, hit, page_size=self.page_size)
        op.alloc_due_s = self.now_s + self.latency_s
        return op

    def allocate(self, op: PrefetchOperation, evict_host) -> bool:
        """``_drain_and_alloc_storage_hit``: host slots for ``op``'s hit (``evict_host(n)`` first when short; else
        a shorter page-aligned prefix if it still reaches the threshold), and its read starts. False: no room
        (the caller revokes it)."""
        pool, ps, hit = self.mem_pool_host, self.page_size, op.storage_hit_count
        alloc_len = hit
        host_indices = pool.alloc(alloc_len)
        if host_indices is None:
            evict_host(alloc_len)
            host_indices = pool.alloc(alloc_len)
        if host_indices is None:  # a shorter page-aligned prefix, if still worth it
            available = pool.available_size()
            alloc_len = min(hit, available - available % ps)
            if alloc_len >= max(self.prefetch_threshold, 1):
                host_indices = pool.alloc(alloc_len)
        if host_indices is None:
            self.totals.revoked += 1
            self.totals.prefetch_aborted_tokens += hit
            return False
        self.totals.prefetch_aborted_tokens += hit - alloc_len
        op.hash_value, op.storage_hit_count, op.host_indices = op.hash_value[: alloc_len // ps], alloc_len, host_indices
        op.page_s, op.latency_s = self._page_seconds(self.read_bytes_per_s), 0.0  # (the latency was the query's)
        op.queued_s = self.now_s
        op.start_s = max(self.now_s, self.reading[-1].finish_s if self.reading else self.read_free_s)
        self.reading.append(op)
        return True

    def terminate_prefetch(self, op: PrefetchOperation) -> int:
        """Stop ``op`` now; returns the tokens it completed. The channel frees at the end of the page in flight, and
        the reads queued behind it move up."""
        now = self.now_s
        op.terminated = True
        if op.host_indices is None:  # stopped before its host slots were taken: nothing read
            self.totals.prefetch_aborted_tokens += op.storage_hit_count
            return 0
        done = op.completed_tokens(now)
        if op in self.reading:
            self.reading.remove(op)
            if op.start_s < now:  # it began: the page in flight finishes
                pages_s = now - op.start_s - op.latency_s
                in_flight = 0.0 if op.page_s == 0 or pages_s <= 0 else math.ceil(pages_s / op.page_s) * op.page_s
                end = min(op.finish_s, op.start_s + op.latency_s + in_flight) if pages_s > 0 else now
                self.read_free_s = max(self.read_free_s, end)
            self._replan(now)
        self.totals.prefetched_tokens += done
        self.totals.prefetch_aborted_tokens += op.storage_hit_count - done
        return done

    def _replan(self, now: float) -> None:
        """The reads not begun by ``now`` start as early as the channel allows, in order. (Start times rise along
        ``reading``, FIFO: those begun are a prefix, found by bisection; the waiting queue's prefetches can be
        hundreds.)"""
        reading = self.reading
        i = bisect_right(reading, now, key=_start_s)
        t = reading[i - 1].finish_s if i else self.read_free_s
        for op in reading[i:]:
            op.start_s = max(op.queued_s, t, now)
            t = op.finish_s

    # -- backup (host -> storage) ---------------------------------------------------------------------
    def write_storage(self, hash_value: list[int], node) -> BackupOperation:
        """Back up the pages ``hash_value`` (read from ``node``'s host copy) to storage."""
        now, free = self.host_controller.now_s, self.write_free_s
        finish = (now if now > free else free) + self.latency_s + len(hash_value) * self.write_page_s
        op = BackupOperation(hash_value, node, finish)
        self.write_free_s = finish
        self.backup_queue.append(op)
        return op

    def poll_backups(self, now: float | None = None) -> list[BackupOperation]:
        """The backups landed by now (keys stored, in FIFO order): the tree releases their nodes. ``now``: the
        clock's time, when the caller has it."""
        now = self.now_s if now is None else now
        queue, done = self.backup_queue, []
        batch_set, stored = self.storage.batch_set, 0
        while queue and queue[0].finish_s - FINISH_TOLERANCE_S <= now:
            op = queue.pop(0)
            stored += batch_set(op.hash_value, True)
            done.append(op)
        self.totals.written_to_storage_tokens += stored * self.page_size
        return done

    def next_backup_s(self) -> float:
        return self.backup_queue[0].finish_s if self.backup_queue else math.inf

    def drain_time(self) -> float:
        return max([self.now_s, self.write_free_s] + [op.finish_s for op in self.reading])


_start_s = attrgetter("start_s")

__all__ = ["BackupOperation", "PrefetchOperation", "StorageController", "StorageTotals"]
