"""Replay a real torch memory snapshot's trace through kvlab's allocator model, and say how faithful it was.

``replay_snapshot(path)`` takes one device's trace from a ``_dump_snapshot`` pickle and drives a
:class:`~kvlab.device.caching_allocator.CachingAllocatorModel` with it, event by event:

- the model starts from the state at the trace's first event (:mod:`kvlab.device.replay.seed`, exact
  when the history starts mid-run), under the recorded ``allocator_settings`` (torch's defaults, said
  so, when the snapshot has none);
- each ``alloc`` is a ``malloc`` of the recorded request on the recorded stream, and each new segment
  gets the address the recorded driver returned (the ``segment_alloc``/``segment_map`` events before it);
  the model's segment events and block address are compared with the recording;
- a ``free_requested`` whose ``free_completed`` comes later is a free deferred on CUDA events: the block
  stays unusable until then, while ``memory_allocated()`` already dropped (torch's stats);
- a run of ``segment_free``/``segment_unmap`` is an ``empty_cache``, unless new segments follow it inside
  the same allocation: then it is the allocator's own release before retrying a failed cudaMalloc, and the
  model's driver is given the free bytes that make its first try fail and its retry fit (see
  :mod:`kvlab.device.replay.engine`); either way the set released is compared;
- an ``oom`` is a ``malloc`` against a driver with exactly the recorded ``device_free`` bytes left,
  which must fail too;
- expandable segments reserve address space for 1 1/8 of the device, a size the snapshot does not
  record: ``device_memory`` (``kvlab replay --device-memory``) gives it, else a recorded ``oom`` tells it
  (free + reserved), and each recorded new segment fences the model's segments below it;
- segments in CUDA-graph private pools (``segment_pool_id`` other than ``(0, 0)``) and events on their
  addresses are left out, with a note: the model has no private pools.

At the end the model's segments, blocks, reserved and allocated bytes are compared with ``segments``.
If the model cannot take an event at all (its state has drifted too far), the replay stops there and
the report says so. Known limits (the report shows where they bite): expandable segments near the
device's limit with a history that starts mid-run, or with ``max_split_size`` as well.
:class:`~kvlab.device.replay.report.ReplayResult` holds the verdict, the first divergence with its
context, the event-by-event timeline and the compiled alloc/free stream that the what-ifs replay
(:mod:`kvlab.device.replay.whatif`).
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
    round_size,
)
from kvlab.device.replay.engine import (
    GROWS,
    MODEL_TOTAL_BYTES,
    Addresses,
    Sink,
    fence,
    model_device_bytes,
    reserved_at_start,
    run_trace,
)
from kvlab.device.replay.report import OP_ALLOC, OP_FREE_REQUESTED, ReplayResult
from kvlab.device.replay.seed import infer_seed
from kvlab.device.replay.settings import SettingsError, recorded_settings
from kvlab.device.snapshot import Snapshot, SnapshotError, read_snapshot
from kvlab.errors import InvariantError, KvlabError


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
                    stop_after: int | None = None, device_memory: int | None = None) -> ReplayResult:
    """Replay one device's trace; ``config`` overrides the recorded settings, ``model_factory`` builds
    the model (a test passes a deliberately wrong one), ``check_invariants`` walks the model after each
    event (slow), ``stop_after`` stops after that event (no final comparison; see :func:`state_at`),
    ``device_memory`` is the device's total memory in bytes (it sets the address space of expandable
    segments; else a recorded oom tells it, else it is unknown)."""
    snap = snapshot if isinstance(snapshot, Snapshot) else read_snapshot(snapshot)
    dev, notes = choose_device(snap, device)
    try:
        settings, setting_notes = recorded_settings(snap.raw.get("allocator_settings"), snap.source)
    except SettingsError as exc:
        raise SnapshotError(str(exc)) from None
    segments = [s for s in snap.raw["segments"] if s.get("device", 0) == dev]
    traces = snap.raw.get("device_traces") or []
    trace = list(traces[dev]) if dev < len(traces) else []
    if setting_notes and not snap.raw.get("allocator_settings") and (
            any(s.get("is_expandable") for s in segments)
            or any(e["action"] in ("segment_map", "segment_unmap") for e in trace)):
        settings = AllocatorConfig(expandable_segments=True)  # torch 2.1 to 2.4: expandable, settings unrecorded
        setting_notes = ["the snapshot records no allocator_settings (written by torch 2.5 and later), but its "
                         "segments are expandable: replayed with expandable_segments=True and torch's other defaults"]
    settings = config or settings
    notes += setting_notes
    private = [s for s in segments if _pool_id(s.get("segment_pool_id")) != (0, 0)]
    segments = [s for s in segments if _pool_id(s.get("segment_pool_id")) == (0, 0)]
    if private:
        spans = [(s["address"], s["address"] + s["total_size"]) for s in private]
        kept = [e for e in trace if _pool_id(e.get("pool_id")) == (0, 0)
                and not any(a <= e.get("addr", -1) < b for a, b in spans)]
        notes.append(f"CUDA-graph private pools are not modelled: {len(private)} segments "
                     f"({sum(s['total_size'] for s in private):,} B) and {len(trace) - len(kept)} events on them "
                     "are left out; the rest replays")
        trace = kept
    device_bytes, known = model_device_bytes(reserved_at_start(segments, trace), trace, settings, device_memory)
    if known == "oom":
        notes.append(f"the device's memory is taken from the recorded oom (free + reserved: {device_bytes:,} B); "
                     "it sets the expandable segments' address space (give the true total with --device-memory)")
    elif known == "unknown":
        notes.append("the device's total memory is not recorded (no oom event): expandable segments' address "
                     "space is taken as unbounded above the last segment; give it with --device-memory if the "
                     "history fills a segment near the device's limit")
    elif known == "given" and device_memory < max(reserved_at_start(segments, trace), 1):
        raise SnapshotError(f"{snap.source}: --device-memory {device_memory:,} B is less than the "
                            f"{reserved_at_start(segments, trace):,} B reserved at the trace's first event")
    tails: dict[int, int] = {}
    while True:  # each pass may learn one ambiguous tail from the recorded allocator's own choice
        result = _replay_once(snap, dev, settings, segments, trace, list(notes), model_factory, check_invariants, tails,
                              stop_after, device_bytes)
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
                 stop_after, device_bytes) -> ReplayResult:
    seed = infer_seed(segments, trace, settings, tails=tails,
                      device_bytes=device_bytes if device_bytes < MODEL_TOTAL_BYTES else None)
    notes += seed.notes
    model = model_factory(device_bytes, config=settings, device_index=dev)
    addresses = Addresses(max([s["address"] + s["total_size"] for s in segments]
                               + [e.get("addr", 0) + e["size"] for e in trace if e["action"] in GROWS] + [0]), model)
    model.segment_address_source = addresses
    blocks: dict[int, Any] = {}
    pending: dict[int, int] = {}
    ops: list[tuple] = []
    try:
        for seg in seed.segments:
            adopted = model.adopt_segment(seg.addr, seg.pool, seg.stream, seg.layout,
                                          is_expandable=seg.is_expandable)
            for block, sb in zip(adopted, seg.blocks):
                blocks[sb.addr] = block
                ops.append((OP_ALLOC, sb.addr, sb.requested, sb.stream, -1))
                if sb.pending:
                    pending[sb.addr] = block.size
                    ops.append((OP_FREE_REQUESTED, sb.addr, -1))
        fence(model)
        model.check_invariants()
    except (KvlabError, InvariantError, ValueError) as exc:
        raise SnapshotError(f"{snap.source}: device {dev}: cannot replay: the allocator's state at the trace's "
                            f"first event could not be rebuilt from segments ({exc})") from None
    sink = Sink()  # set as the model's recorder only around malloc and empty_cache: frees need no events
    run = trace if stop_after is None else trace[:stop_after + 1]
    result = ReplayResult(snap.source, dev, settings, seed, notes, run, has_history=bool(trace))
    run_trace(model, run, blocks, pending, ops, sink, addresses, result, check_invariants)
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


def event_counts(trace: list[Mapping]) -> Counter:
    return Counter(e["action"] for e in trace)
