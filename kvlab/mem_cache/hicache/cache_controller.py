"""Transfers between the device pool and the host pool, on a modelled clock (``managers/cache_controller.py``).

SGLang's ``HiCacheController`` copies KV on two CUDA streams: backups device -> host (``write``, the
write stream) and load-backs host -> device (``load``, the load stream). Each copy is acknowledged by an
event the tree polls (``writing_check`` / ``loading_check``); the tree keeps a node locked until its ack.

kvlab moves no bytes. A transfer takes ``tokens * size_per_token / bandwidth`` seconds (plus a fixed
``latency_s``) on its own channel, and each channel is a FIFO: an operation starts when it is issued or when
the previous one on its channel finishes, whichever is later (one stream each, as in SGLang)::

    write channel (D->H):  |--op1--|--op2----|        |--op3--|
    load channel  (H->D):     |----op4----|
    now_s ------------------------------^   advance()/poll() move it; finished ops become acks

The clock never moves by itself: :meth:`advance` / :meth:`poll` move it and turn every operation whose
finish time has come into an ack (``ack_write_queue`` / ``ack_load_queue``, in FIFO order); :meth:`wait_writes`
is the blocking wait of ``writing_check(write_back=True)``: the clock jumps to the last write's finish
(``stall_s`` counts the wait). Slot allocation happens at issue, as in SGLang: ``write`` takes host slots
(None when the host pool is full), ``load`` takes device slots (None when the device pool is short).

Differs on purpose: no per-layer pipelining of load-backs (SGLang lets layer i compute while layer i+1 loads;
the scheduler's cost model, not this module, decides how much of a transfer overlaps compute), no merging of
queued operations into one kernel launch, no storage (L3) threads.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlab.errors import require
from kvlab.mem_cache.options import FINISH_TOLERANCE_S as FINISH_TOLERANCE_S  # re-exported, as WRITE_POLICIES
from kvlab.mem_cache.options import WRITE_POLICIES as WRITE_POLICIES  # re-exported: its home is the torch-free options

if TYPE_CHECKING:  # (annotations only: the page engine's controller, page_host.PageHiController, runs without torch)
    import torch

    from kvlab.mem_cache.base_prefix_cache import KVAllocator
    from kvlab.mem_cache.hicache.memory_pool_host import HostKVCache

# The default bandwidth (bytes/s) of host<->device copies: an H100/H200's PCIe Gen5 x16 link, ~55 GB/s for pinned
# copies, the figure kvlab.sched.cost.DEFAULT_HOST_LINK_BYTES_PER_S gives the scheduler (one figure everywhere: a test
# holds the two equal); callers that price transfers for another GPU pass its preset's figure.
DEFAULT_HOST_DEVICE_BYTES_PER_S = 55 * 10**9


def check_channel(latency_s: float, **bandwidths: float) -> None:
    """A copy channel's speed: every bandwidth (bytes/s) > 0 (``math.inf``: instant), the latency >= 0 seconds."""
    for name, bw in bandwidths.items():
        if not bw > 0:
            raise ValueError(f"{name} must be > 0 bytes/s, got {bw}")
    if latency_s < 0:
        raise ValueError(f"latency_s must be >= 0, got {latency_s}")


@dataclass(slots=True)
class CacheOperation:
    """One copy. ``kind``: ``"write"`` (device -> host backup) or ``"load"`` (host -> device load-back);
    ``node_id``: the tree node it acknowledges; times in seconds on the controller's clock."""

    kind: str
    host_indices: torch.Tensor
    device_indices: torch.Tensor
    node_id: int
    start_s: float
    finish_s: float

    @property
    def num_tokens(self) -> int:
        return len(self.host_indices)


@dataclass
class TransferTotals:
    """What the controller moved since the last ``reset``: tokens and busy seconds per direction, and the
    seconds spent blocked waiting for write-back copies."""

    written_tokens: int = 0
    loaded_tokens: int = 0
    write_s: float = 0.0
    load_s: float = 0.0
    stall_s: float = 0.0
    writes: int = 0
    loads: int = 0
    write_failures: int = 0  # ``write`` found the host pool full
    load_failures: int = 0  # ``load`` found the device pool short


@dataclass(frozen=True, slots=True)
class Direction:
    """One copy direction: its ops' ``kind``, the controller's ``queue`` and ``bandwidth`` attributes, and the
    :class:`TransferTotals` fields it counts (tokens, busy seconds, copies, refusals)."""

    kind: str
    queue: str
    bandwidth: str
    tokens: str
    seconds: str
    copies: str
    failures: str


WRITE = Direction("write", "write_queue", "d2h_bytes_per_s", "written_tokens", "write_s", "writes", "write_failures")
LOAD = Direction("load", "load_queue", "h2d_bytes_per_s", "loaded_tokens", "load_s", "loads", "load_failures")


class HiCacheController:
    """Issues and times the copies between ``mem_pool_device_allocator`` and ``mem_pool_host``.

    ``d2h_bytes_per_s`` / ``h2d_bytes_per_s``: bandwidth of each direction; ``math.inf`` makes every copy
    take ``latency_s`` (0 by default: instant once the clock is polled, which is still not before)."""

    def __init__(self, mem_pool_device_allocator: KVAllocator, mem_pool_host: HostKVCache,
                 write_policy: str = "write_through", d2h_bytes_per_s: float = DEFAULT_HOST_DEVICE_BYTES_PER_S,
                 h2d_bytes_per_s: float = DEFAULT_HOST_DEVICE_BYTES_PER_S, latency_s: float = 0.0):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy (--hicache-write-policy) must be one of {', '.join(WRITE_POLICIES)}; "
                             f"got {write_policy!r}")
        check_channel(latency_s, d2h_bytes_per_s=d2h_bytes_per_s, h2d_bytes_per_s=h2d_bytes_per_s)
        self.mem_pool_device_allocator = mem_pool_device_allocator
        self.mem_pool_host = mem_pool_host
        self.write_policy = write_policy
        self.d2h_bytes_per_s = d2h_bytes_per_s
        self.h2d_bytes_per_s = h2d_bytes_per_s
        self.latency_s = latency_s
        self.reset()

    def reset(self) -> None:
        self.now_s = 0.0
        self.write_queue: deque[CacheOperation] = deque()  # issued, not finished (FIFO)
        self.load_queue: deque[CacheOperation] = deque()
        self.ack_write_queue: list[CacheOperation] = []  # finished, not yet consumed by the tree
        self.ack_load_queue: list[CacheOperation] = []
        self.due_s = math.inf  # the clock time from which the earliest copy in flight is finished: inf when none is
        self.totals = TransferTotals()

    # -- timing ------------------------------------------------------------------------------------
    def transfer_seconds(self, num_tokens: int, bytes_per_s: float) -> float:
        """Seconds one copy of ``num_tokens`` takes on a channel of ``bytes_per_s``."""
        if math.isinf(bytes_per_s):
            return self.latency_s
        return self.latency_s + num_tokens * self.mem_pool_host.size_per_token / bytes_per_s

    def _issue_counted(self, d: Direction, host, device, node_id: int) -> CacheOperation | None:
        """Issue a copy of direction ``d`` between ``host`` and ``device`` slots on its channel (FIFO: it starts
        when issued or when the channel's last copy finishes, whichever is later), counted in :attr:`totals`; None
        (a refusal counted, nothing issued) when the pool it takes from was short (its slots None)."""
        if host is None or device is None:
            vars(self.totals)[d.failures] += 1
            return None
        return self._issue(d, host, device, node_id)

    def _issue(self, d: Direction, host, device, node_id: int) -> CacheOperation:
        """:meth:`_issue_counted` once both pools gave their slots: the copy queued on its channel and counted."""
        totals = vars(self.totals)
        queue = getattr(self, d.queue)
        start = self.now_s
        if queue and queue[-1].finish_s > start:
            start = queue[-1].finish_s
        op = CacheOperation(d.kind, host, device, node_id, start,
                            start + self.transfer_seconds(len(host), getattr(self, d.bandwidth)))
        queue.append(op)
        if op.finish_s - FINISH_TOLERANCE_S < self.due_s:
            self.due_s = op.finish_s - FINISH_TOLERANCE_S
        totals[d.tokens] += len(host)
        totals[d.seconds] += op.finish_s - start
        totals[d.copies] += 1
        return op

    # -- SGLang's verbs ------------------------------------------------------------------------------
    def write(self, device_indices: torch.Tensor, node_id: int) -> torch.Tensor | None:
        """Back up ``device_indices`` to fresh host slots; None (and nothing issued) if the host pool is full."""
        host_indices = self.mem_pool_host.alloc(device_indices.shape[0])
        op = self._issue_counted(WRITE, host_indices, device_indices, node_id)
        return None if op is None else host_indices

    def load(self, host_indices: torch.Tensor, node_id: int) -> torch.Tensor | None:
        """Load ``host_indices`` into fresh device slots; None (and nothing issued) if the device pool is short."""
        device_indices = self.mem_pool_device_allocator.alloc(host_indices.shape[0])
        op = self._issue_counted(LOAD, host_indices, device_indices, node_id)
        return None if op is None else device_indices

    def evict_device(self, device_indices: torch.Tensor) -> int:
        # a tree value holds whole pages, each page's slots in order: free_row frees the same pages in the same
        # (sorted) order as free, without its sort over every slot (an allocator without it: free)
        alloc = self.mem_pool_device_allocator
        getattr(alloc, "free_row", alloc.free)(device_indices)
        return device_indices.shape[0]

    def evict_host(self, host_indices: torch.Tensor) -> int:
        return self.mem_pool_host.free(host_indices)

    # -- the clock ---------------------------------------------------------------------------------
    def poll(self, now_s: float) -> None:
        """Move the clock to ``now_s`` (never back) and acknowledge every copy finished by then."""
        now = self.now_s
        if now_s > now:
            self.now_s = now = now_s
        elif now_s != now_s:  # (NaN: neither later nor earlier)
            raise ValueError("poll: now_s is NaN")
        if now < self.due_s:  # (no copy finished by now: most polls)
            return
        tol = FINISH_TOLERANCE_S  # 0.009 + 0.001 < 0.01 in floats: a copy due within tol is done
        writes, loads = self.write_queue, self.load_queue
        while writes and writes[0].finish_s - tol <= now:
            self.ack_write_queue.append(writes.popleft())
        while loads and loads[0].finish_s - tol <= now:
            self.ack_load_queue.append(loads.popleft())
        due = writes[0].finish_s - tol if writes else math.inf  # (each channel's copies finish in issue order)
        if loads and loads[0].finish_s - tol < due:
            due = loads[0].finish_s - tol
        self.due_s = due

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"advance: seconds must be >= 0, got {seconds}")
        self.poll(self.now_s + seconds)

    def wait_writes(self) -> float:
        """Block until every issued write has finished (write-back eviction); returns the seconds waited."""
        if not self.write_queue:
            return 0.0
        waited = max(0.0, self.write_queue[-1].finish_s - self.now_s)
        self.totals.stall_s += waited
        self.poll(self.now_s + waited)
        return waited

    def drain_time(self) -> float:
        """The clock time at which every issued copy has finished."""
        return max([self.now_s] + [q[-1].finish_s for q in (self.write_queue, self.load_queue) if q])

    def check_invariants(self) -> None:
        """Each channel's copies in flight finish in issue order, and :attr:`due_s` is the earliest one's finish less
        the tolerance (inf when none)."""
        tol, heads = FINISH_TOLERANCE_S, []
        for queue in (self.write_queue, self.load_queue):
            require(all(a.finish_s <= b.finish_s for a, b in zip(queue, list(queue)[1:])),
                    "HiCacheController: each channel's copies finish in issue order", finish_s=[op.finish_s for op in queue])
            heads += [queue[0].finish_s - tol] if queue else []
        require(self.due_s == min(heads, default=math.inf), "HiCacheController: due_s is the earliest copy's finish",
                due_s=self.due_s, heads=heads)

    def in_flight(self) -> list[CacheOperation]:
        """Issued copies not yet acknowledged to the tree (in flight or finished-but-unconsumed)."""
        return [*self.write_queue, *self.ack_write_queue, *self.load_queue, *self.ack_load_queue]
