"""Replay a real torch memory snapshot's trace through kvlab's allocator model, and say how faithful it was.

``replay_snapshot(path)`` takes one device's trace from a ``_dump_snapshot`` pickle and drives a
:class:`~kvlab.device.caching_allocator.CachingAllocatorModel` with it, event by event:

- the model starts from the state at the trace's first event (:mod:`kvlab.device.replay_seed`, exact
  when the history starts mid-run), under the recorded ``allocator_settings`` (torch's defaults, said
  so, when the snapshot has none);
- each ``alloc`` is a ``malloc`` of the recorded request on the recorded stream, and each new segment
  gets the address the recorded driver returned (the ``segment_alloc``/``segment_map`` events before it);
  the model's segment events and block address are compared with the recording;
- a ``free_requested`` whose ``free_completed`` comes later is a free deferred on CUDA events: the block
  stays unusable until then, while ``memory_allocated()`` already dropped (torch's stats);
- a run of ``segment_free``/``segment_unmap`` is an ``empty_cache`` (or the release torch does before
  retrying a cudaMalloc, the same call): the set released is compared;
- an ``oom`` is a ``malloc`` against a driver with exactly the recorded ``device_free`` bytes left,
  which must fail too;
- segments in CUDA-graph private pools (``segment_pool_id`` other than ``(0, 0)``) and events on their
  addresses are left out, with a note: the model has no private pools.

At the end the model's segments, blocks, reserved and allocated bytes are compared with ``segments``.
:class:`~kvlab.device.replay_report.ReplayResult` holds the verdict, the first divergence with its
context, the event-by-event timeline and the compiled alloc/free stream that the what-ifs replay
(:mod:`kvlab.device.replay_whatif`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from kvlab.device.caching_allocator import (
    MIN_BLOCK_BYTES,
    SMALL_SIZE_BYTES,
    AllocatorConfig,
    CachingAllocatorModel,
    OutOfMemoryError,
    round_size,
)
from kvlab.device.replay_report import OP_ALLOC, OP_EMPTY, OP_FREE, OP_FREE_REQUESTED, Divergence, ReplayResult
from kvlab.device.replay_seed import PENDING_STATES, infer_seed, segment_blocks
from kvlab.device.replay_whatif import recorded_settings
from kvlab.device.snapshot import Snapshot, SnapshotError, read_snapshot

MODEL_TOTAL_BYTES = 1 << 50  # the model's driver never refuses, except where a recorded oom says it did
_RELEASES = frozenset({"segment_free", "segment_unmap"})
_GROWS = frozenset({"segment_alloc", "segment_map"})
_CHECKED = frozenset({"alloc", "free_requested", "free_completed", "oom", "snapshot"})  # not mid-group


class _Sink:
    """The model's recorder during a replay: keeps ``(action, addr, size)`` of the current step."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []

    def record(self, action, addr, size, **_):
        self.events.append((action, addr, size))


class _Addresses:
    """The model's segment-address hook: the recorded address of the segment the recording made before
    this allocation (torch makes or grows one segment per malloc), else a fresh one above every
    recorded address."""

    def __init__(self, highest: int) -> None:
        self.queue: list[int] = []
        self.fresh = highest + (1 << 40)

    def __call__(self, space_bytes: int) -> int:
        if self.queue:
            return self.queue.pop(0)
        addr, self.fresh = self.fresh, self.fresh + space_bytes + (1 << 30)
        return addr


def _pool_id(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (0, 0)


def choose_device(snapshot: Snapshot, device: int | None) -> tuple[int, list[str]]:
    traces = snapshot.raw.get("device_traces") or []
    with_events = [d for d, t in enumerate(traces) if t]
    with_segments = sorted({s.get("device", 0) for s in snapshot.raw["segments"]})
    known = sorted(set(with_events) | set(with_segments))
    if device is not None:
        if device not in known and device >= len(traces):
            raise SnapshotError(f"{snapshot.source}: no device {device} in this snapshot (devices with data: {known})")
        return device, []
    chosen = (with_events or with_segments or [0])[0]
    notes = [f"devices with data: {known}; replaying device {chosen} (choose another with --device)"] \
        if len(known) > 1 else []
    return chosen, notes


def replay_snapshot(snapshot: Snapshot | str | os.PathLike | Mapping | list, device: int | None = None, *,
                    model_factory: Callable[..., CachingAllocatorModel] = CachingAllocatorModel,
                    config: AllocatorConfig | None = None, check_invariants: bool = False,
                    stop_after: int | None = None) -> ReplayResult:
    """Replay one device's trace; ``config`` overrides the recorded settings, ``model_factory`` builds
    the model (a test passes a deliberately wrong one), ``check_invariants`` walks the model after each
    event (slow), ``stop_after`` stops after that event (no final comparison; see :func:`state_at`)."""
    snap = snapshot if isinstance(snapshot, Snapshot) else read_snapshot(snapshot)
    dev, notes = choose_device(snap, device)
    settings, setting_notes = recorded_settings(snap.raw.get("allocator_settings"), snap.source)
    settings = config or settings
    notes += setting_notes
    segments = [s for s in snap.raw["segments"] if s.get("device", 0) == dev]
    private = [s for s in segments if _pool_id(s.get("segment_pool_id")) != (0, 0)]
    segments = [s for s in segments if _pool_id(s.get("segment_pool_id")) == (0, 0)]
    traces = snap.raw.get("device_traces") or []
    trace = list(traces[dev]) if dev < len(traces) else []
    if private:
        spans = [(s["address"], s["address"] + s["total_size"]) for s in private]
        kept = [e for e in trace if _pool_id(e.get("pool_id")) == (0, 0)
                and not any(a <= e.get("addr", -1) < b for a, b in spans)]
        notes.append(f"CUDA-graph private pools are not modelled: {len(private)} segments "
                     f"({sum(s['total_size'] for s in private):,} B) and {len(trace) - len(kept)} events on them "
                     "are left out; the rest replays")
        trace = kept
    tails: dict[int, int] = {}
    while True:  # each pass may learn one ambiguous tail from the recorded allocator's own choice
        result = _replay_once(snap, dev, settings, segments, trace, list(notes), model_factory, check_invariants, tails,
                              stop_after)
        learned = _tail_from_choice(result)
        if learned is None or learned[0] in tails:
            break
        tails[learned[0]] = learned[1]
    if tails:
        result.notes.append(f"{len(tails)} blocks older than the history hold an unsplit tail the trace shows only "
                            "through the allocator's choices (a free block after them was too small for a request); "
                            "the smallest tail that explains each was used")
    return result


def _tail_from_choice(result: ReplayResult) -> tuple[int, int] | None:
    """The model took the free block right after an ambiguous seed block, the recording did not: that
    free block was smaller in reality, so the seed block holds a tail. Returns (block address, the
    smallest tail that makes the free block too small), or None when that does not explain it."""
    first = result.first_divergence
    if first is None or first.kind != "block_address" or not result.seed.ambiguous_blocks:
        return None
    for seg in result.seed.segments:
        cursor = seg.addr
        for (size, _, state), following in zip(seg.layout, seg.layout[1:] + [(0, 0, "")]):
            cursor += size
            if cursor == first.modelled and state == "allocated" and following[2] == "free":
                block = next((b for b in seg.blocks if b.addr + b.size == cursor and b.inferred), None)
                free_bytes = following[0]
                request = round_size(result.trace[first.index]["size"], result.settings.roundup_power2_divisions)
                tail = free_bytes - request + MIN_BLOCK_BYTES
                if block is not None and 0 < tail <= SMALL_SIZE_BYTES and free_bytes - tail > SMALL_SIZE_BYTES:
                    return block.addr, block.tail_bytes + tail
                return None
    return None


def _replay_once(snap, dev, settings, segments, trace, notes, model_factory, check_invariants, tails,
                 stop_after) -> ReplayResult:
    seed = infer_seed(segments, trace, settings, tails=tails)
    notes += seed.notes
    model = model_factory(MODEL_TOTAL_BYTES, config=settings, device_index=dev)
    addresses = _Addresses(max([s["address"] + s["total_size"] for s in segments]
                               + [e.get("addr", 0) + e["size"] for e in trace if e["action"] in _GROWS] + [0]))
    model.segment_address_source = addresses
    blocks: dict[int, Any] = {}
    pending: dict[int, int] = {}
    ops: list[tuple] = []
    for seg in seed.segments:
        adopted = model.adopt_segment(seg.addr, seg.pool, seg.stream, seg.layout, is_expandable=seg.is_expandable)
        for block, sb in zip(adopted, seg.blocks):
            blocks[sb.addr] = block
            ops.append((OP_ALLOC, sb.addr, sb.requested, sb.stream, -1))
            if sb.pending:
                pending[sb.addr] = block.size
                ops.append((OP_FREE_REQUESTED, sb.addr, -1))
    model.check_invariants()
    sink = _Sink()  # set as the model's recorder only around malloc and empty_cache: frees need no events
    run = trace if stop_after is None else trace[:stop_after + 1]
    result = ReplayResult(snap.source, dev, settings, seed, notes, run, has_history=bool(trace),
                          segment_list=snap.format == "segment_list")
    _run(model, run, blocks, pending, ops, sink, addresses, result, check_invariants)
    if stop_after is None:
        result.finish(model, segments, pending, ops)
    else:
        result.model, result.ops = model, ops
    return result


def state_at(snapshot: Snapshot | str | os.PathLike | Mapping | list, event: int, device: int | None = None
             ) -> Snapshot:
    """The modelled allocator state right after trace event ``event`` as a snapshot without history (draw it
    with ``kvlab.viz.snapshot_plots.segment_map``): the segment map at any moment, the peak included."""
    result = replay_snapshot(snapshot, device, stop_after=event)
    segments = result.model.snapshot()["segments"]
    return Snapshot({"segments": segments, "device_traces": []}, f"{result.source} after event {event}",
                    "segment_list")


def _run(model, trace, blocks, pending, ops, sink, addresses, result: ReplayResult, check: bool) -> None:
    diverge = result.diverge
    pending_bytes = sum(pending.values())
    rec_reserved = result.seed.reserved_bytes
    group: list[tuple] = []  # recorded segment_alloc/segment_map before the next alloc
    released: list[tuple] | None = None  # recorded releases of the current run, once the model emptied its cache
    model_released: list[tuple] = []
    rec_res, mod_res, mod_alloc = result.recorded_reserved, result.modelled_reserved, result.modelled_allocated
    reserved, allocated, malloc, free = model.memory_reserved, model.memory_allocated, model.malloc, model.free
    unknown_frees = 0
    for i, e in enumerate(trace):
        action = e["action"]
        if released is not None and action not in _RELEASES:
            if _rows(released) != model_released:
                diverge(Divergence(released[0][3] if released else i, "segment_free", _rows(released), model_released))
            released = None
        if action == "alloc":
            addr = e["addr"]
            if group or addresses.queue:
                addresses.queue = [g[1] for g in group]
            sink.events = []
            model.recorder = sink
            try:
                block = malloc(e["size"], e.get("stream", 0))
            except OutOfMemoryError:
                diverge(Divergence(i, "alloc", "allocated", "out of memory"))
                group = []
                continue
            finally:
                model.recorder = None
            made = sink.events
            if group or len(made) != 1:
                made = sorted(ev for ev in made if ev[0] in _GROWS)
                if _rows(group) != made:
                    diverge(Divergence(i, "segment_alloc", _rows(group), made))
                group = []
            if block.addr != addr:
                diverge(Divergence(i, "block_address", addr, block.addr))
            if addr in blocks:
                diverge(Divergence(i, "alloc", "address already live in the replay", addr))
            blocks[addr] = block
            ops.append((OP_ALLOC, addr, e["size"], e.get("stream", 0), i))
        elif action == "free_requested":
            block = blocks.get(e["addr"])
            if block is None:
                unknown_frees += 1
            else:
                pending[e["addr"]] = block.size
                pending_bytes += block.size
                ops.append((OP_FREE_REQUESTED, e["addr"], i))
        elif action == "free_completed":
            block = blocks.pop(e["addr"], None)
            if block is not None:
                pending_bytes -= pending.pop(e["addr"], 0)
                free(block)
                ops.append((OP_FREE, e["addr"], i))
        elif action in _GROWS:
            rec_reserved += e["size"]
            result.recorded_cuda_mallocs += 1
            group.append((action, e["addr"], e["size"], i))
        elif action in _RELEASES:
            rec_reserved -= e["size"]
            if released is None:
                released, sink.events = [], []
                model.recorder = sink
                model.empty_cache()
                model.recorder = None
                model_released = sorted(ev for ev in sink.events if ev[0] in _RELEASES)
                ops.append((OP_EMPTY, i))
            released.append((action, e["addr"], e["size"], i))
        elif action == "oom":
            _oom(model, e, i, result)
        res, now = reserved(), allocated() - pending_bytes
        rec_res.append(rec_reserved)
        mod_res.append(res)
        mod_alloc.append(now)
        if res != rec_reserved and action in _CHECKED and not group:
            diverge(Divergence(i, "reserved", rec_reserved, res))
        if check:
            model.check_invariants()
    if released is not None and _rows(released) != model_released:
        diverge(Divergence(released[0][3] if released else len(trace), "segment_free", _rows(released),
                           model_released))
    if group:
        diverge(Divergence(group[0][3], "segment_alloc", _rows(group), "no allocation followed"))
    if unknown_frees:
        result.notes.append(f"{unknown_frees} frees name a block the replay does not hold (left out)")


def _rows(group: list[tuple]) -> list[tuple]:
    return sorted((g[0], g[1], g[2]) for g in group)


def _oom(model, e: Mapping, i: int, result: ReplayResult) -> None:
    """The recording ran out of memory here: give the model's driver exactly the recorded free bytes
    (``device_free``) and ask for the same rounded size; the model must run out too."""
    device_free = e.get("device_free", e.get("addr", 0))
    result.recorded_ooms += 1
    model.non_pytorch_bytes = max(0, model.total_bytes - model.memory_reserved() - device_free)
    try:
        block = model.malloc(e["size"], e.get("stream", 0))
    except OutOfMemoryError:
        result.modelled_ooms += 1
    else:
        result.diverge(Divergence(i, "oom", f"out of memory with {device_free:,} B free", f"allocated {block.addr:#x}"))
        model.free(block)
    finally:
        model.non_pytorch_bytes = 0


def recorded_final(segments: list[Mapping]) -> tuple[int, int, list]:
    """(reserved, allocated, layout) of the recorded final state: layout is sorted
    ``(segment address, total_size, ((block address, size, live?), ...))``."""
    layout = []
    allocated = 0
    for seg in segments:
        rows = []
        for addr, size, _, state in segment_blocks(seg):
            rows.append((addr, size, state != "inactive"))
            allocated += size if state not in PENDING_STATES and state != "inactive" else 0
        layout.append((seg["address"], seg["total_size"], tuple(rows)))
    return sum(s["total_size"] for s in segments), allocated, sorted(layout)


def event_counts(trace: list[Mapping]) -> Counter:
    return Counter(e["action"] for e in trace)


DEFAULT_WHAT_IFS = ("expandable_segments=True",)


def replay_with_what_ifs(path: str | os.PathLike | Snapshot, device: int | None = None, what_ifs=None,
                         capacity: int | str | None = None):
    """What ``kvlab replay`` runs: the fidelity replay, then the recorded stream under the recorded
    settings (the model's baseline) and under each what-if (``KEY=VALUE[,...]``; default
    ``expandable_segments=True``). Returns ``(ReplayResult, [WhatIf, ...])``; no what-ifs without history."""
    from kvlab.device.replay_whatif import parse_size, parse_what_if, run_what_if

    capacity = parse_size(capacity) if isinstance(capacity, str) else capacity
    result = replay_snapshot(path, device)
    configs = [(text, parse_what_if(text, result.settings)) for text in (what_ifs or DEFAULT_WHAT_IFS)]
    if not result.has_history:
        result.notes.append("what-ifs need a trace: none run")
        return result, []
    runs = [run_what_if(result.ops, result.settings, label="as recorded (modelled)", capacity=capacity)]
    runs += [run_what_if(result.ops, config, label=text, capacity=capacity) for text, config in configs]
    if result.seed.segments:
        result.notes.append(f"the history starts mid-run: each what-if first allocates the {len(result.seed.blocks)} "
                            "blocks live at its first event, in address order")
    return result, runs
