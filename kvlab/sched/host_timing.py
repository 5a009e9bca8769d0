"""The host tier's part of a step (HiCache), as one component the loop calls the same way with or without it.

SGLang's loop completes the copies finished by a step's start (``check_hicache_events``), and a step's time is its
compute plus what the copies add: a write-back waits before the compute, load-backs run under it
(:meth:`~kvlab.sched.cost.CostModel.overlapped_step_s`). :class:`HostTierTiming` keeps that clock for a run with a
host tier; :class:`NoHostTier` is the same four calls for a run without one (the step's time is its compute, and no
copy is ever in flight), so the loop has no HiCache branch.
"""

from __future__ import annotations

from operator import sub
from typing import TYPE_CHECKING

from kvlab.sched.cost import CostModel
from kvlab.sched.ledger import Ledger, Transfers

if TYPE_CHECKING:
    from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
    from kvlab.sched.kv import SchedulerKV

_INF = float("inf")
_new_transfers = tuple.__new__  # (a Transfers from its seven fields, without the named tuple's Python-level __new__:
# once per step with traffic)
overlapped_step_s = CostModel.overlapped_step_s  # the overlap rule: write-back waits before the compute, loads under it


class NoHostTier:
    """No host tier: nothing to complete at a step's start, the step takes its compute time, no copy in flight."""

    join = None  # what a request's joining the queue starts (the storage tier's prefetch), when anything does

    def begin_step(self, now_s: float) -> None:
        """(Nothing is in flight.)"""

    def end_step(self, compute_s: float) -> float:
        return compute_s

    def next_transfer_s(self) -> float:
        return _INF

    def finish(self) -> None:
        """(Nothing is in flight.)"""


class HostTierTiming(NoHostTier):
    """The copy clock of a run's :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache`: moved to each step's start,
    each step priced with its copies and its traffic noted in the ledger."""

    def __init__(self, tree: HiRadixCache, ledger: Ledger) -> None:
        self.tree = tree
        self.controller = tree.cache_controller
        self.ledger = ledger
        self.step_start_s = 0.0
        self._seen = Transfers()  # the controller's running totals at the last step's end
        self._ops = 0  # copies issued, host tokens evicted and storage tokens moved by then (most steps move nothing)

    def begin_step(self, now_s: float) -> None:
        """The step starts at ``now_s``: complete the copies finished by then (``check_hicache_events``)."""
        self.step_start_s = now_s
        self.tree.poll(now_s)

    def open_step(self) -> None:
        """The loop's step opens: the ledger's counters zeroed, then :meth:`begin_step` at the ledger's clock."""
        ledger = self.ledger
        ledger.begin_step()
        now = self.step_start_s = ledger.now_s
        self.tree.poll(now)

    def close_step(self, kind: str, compute_s: float, computed: int, retracted: int, sizes, running: int,
                   waiting: int) -> None:
        """The loop's step closes: the ledger's ``end_step`` with the step's time from :meth:`end_step`."""
        self.ledger.end_step(kind, self.end_step(compute_s), computed, retracted, sizes, running, waiting)

    def end_step(self, compute_s: float) -> float:
        """The step's time given its compute (write-back waits before it, load-backs under it); its host-tier
        traffic goes into the ledger."""
        ctl, start = self.controller, self.step_start_s
        stall_s = ctl.now_s - start
        if stall_s or ctl.load_queue:  # (else the step is its compute: most steps)
            loads = ctl.load_queue[-1].finish_s - start if ctl.load_queue else 0.0
            compute_s = overlapped_step_s(compute_s, stall_s=stall_s, load_s=loads)
        t = ctl.totals
        ops = t.writes + t.loads + self.tree.host_evicted_tokens  # (each only grows in a run: a change grows the sum)
        storage = self.tree.storage_controller
        if storage is not None:  # the storage tier's moves too, in the step they happen (they only grow too)
            s = storage.totals
            ops += s.prefetched_tokens + s.prefetch_aborted_tokens + s.written_to_storage_tokens
        if ops != self._ops:
            self._ops = ops
            self.ledger.note_transfers(self._transfers())
        return compute_s  # (else the step moved nothing: its row and the totals stay as they are)

    def _transfers(self) -> Transfers:
        """Host-tier traffic since the last call (the step's, when called once per step)."""
        now = self._running_totals()
        seen, self._seen = self._seen, now
        return _new_transfers(Transfers, map(sub, now, seen))

    def _running_totals(self) -> Transfers:
        t = self.controller.totals  # (Transfers' fields past these four: their defaults, zeros)
        return _new_transfers(Transfers, (t.loaded_tokens, t.written_tokens, self.tree.host_evicted_tokens,
                                          t.write_s + t.load_s, 0, 0, 0))

    def next_transfer_s(self) -> float:
        """Before this clock time no copy completes (the quiet decode steps stop there); inf when none is in
        flight. A step starting at ``t`` completes a copy iff ``t >= next_transfer_s()``."""
        return self.controller.due_s

    def finish(self) -> None:
        """The run's traffic goes into the ledger's totals (the sum of its rows'); then the copies still in flight
        land (the run's clock is not moved, and no row shows them)."""
        self.ledger.note_transfer_totals(self._seen)
        self.tree.drain()


class StorageTierTiming(HostTierTiming):
    """A host tier with a storage tier (L3) behind it: a request's arrival starts its prefetch (``arrive``:
    SGLang's ``_prefetch_kvcache`` as the request joins the waiting queue), the steps stop where a backup lands or a
    prefetch may stop, and the storage traffic goes into the rows beside the host tier's. The storage threads never
    hold up a step's compute; a request waits for its prefetch in the queue (``check_prefetch_progress``)."""

    def __init__(self, tree: HiRadixCache, ledger: Ledger, kv: SchedulerKV) -> None:
        super().__init__(tree, ledger)
        self.prefetch = kv.prefetch

    def join(self, req, now_s: float) -> None:
        """``req`` joined the waiting queue at ``now_s`` (``_prefetch_kvcache``): its prefetch, timed from now."""
        self.begin_step(now_s)
        self.prefetch(req)

    def _running_totals(self) -> Transfers:
        """:meth:`HostTierTiming._running_totals` (its four fields, repeated: one tuple per step with traffic) with
        the storage tier's three."""
        tree = self.tree
        t, s = self.controller.totals, tree.storage_controller.totals
        return _new_transfers(Transfers, (t.loaded_tokens, t.written_tokens, tree.host_evicted_tokens,
                                          t.write_s + t.load_s, s.prefetched_tokens, s.prefetch_aborted_tokens,
                                          s.written_to_storage_tokens))

    def next_transfer_s(self) -> float:
        """:meth:`HostTierTiming.next_transfer_s` or the storage tier's next event, whichever comes first: a backup
        landing (its tokens are the row's ``written_to_storage_tokens``), a prefetch's host slots taken, its last
        page landing or its timeout. Each shows in the row of the step that polls it (the reference loop polls every
        step), so the quiet decode rounds stop there too."""
        copies = HostTierTiming.next_transfer_s(self)
        nxt = self.tree.storage_next_event_s()
        return copies if copies < nxt else nxt
