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
- a run of ``segment_free``/``segment_unmap`` is an ``empty_cache``, unless new segments follow it inside
  the same allocation: then it is the allocator's own release before retrying a failed cudaMalloc, and the
  model's driver is given the free bytes that make its first try fail and its retry fit (see
  :func:`_malloc`); either way the set released is compared;
- an ``oom`` is a ``malloc`` against a driver with exactly the recorded ``device_free`` bytes left,
  which must fail too;
- expandable segments reserve address space for 1 1/8 of the device, a size the snapshot does not
  record: a recorded ``oom`` tells it (free + reserved), and each recorded new segment fences the
  model's segments below it;
- segments in CUDA-graph private pools (``segment_pool_id`` other than ``(0, 0)``) and events on their
  addresses are left out, with a note: the model has no private pools.

At the end the model's segments, blocks, reserved and allocated bytes are compared with ``segments``.
If the model cannot take an event at all (its state has drifted too far), the replay stops there and
the report says so. Known limits (the report shows where they bite): expandable segments near the
device's limit with a history that starts mid-run, or with ``max_split_size`` as well.
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
from kvlab.errors import KvlabError

MODEL_TOTAL_BYTES = 1 << 50  # the model's driver never refuses, except where a recorded oom says it did
_RELEASES = frozenset({"segment_free", "segment_unmap"})
_GROWS = frozenset({"segment_alloc", "segment_map"})
_SEGMENT_EVENTS = _RELEASES | _GROWS
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
    this allocation (torch makes or grows one segment per malloc), else a fresh one above every recorded
    address. A recorded address inside what a model segment already uses is refused (the model would file
    two blocks under one address): the model then differs from the recording, and the checks say so."""

    def __init__(self, highest: int, model: CachingAllocatorModel) -> None:
        self.queue: list[int] = []
        self.fresh = highest + (1 << 40)
        self.model = model
        self.made_segment = False

    def __call__(self, space_bytes: int) -> int:
        self.made_segment = True
        while self.queue:
            addr = self.queue.pop(0)
            if any(s.addr <= addr < _used_end(s) for s in self.model.segments):
                continue
            for s in self.model.segments:  # the recording says the space below ends here
                if s.is_expandable and s.addr < addr < s.addr + s.address_space_bytes:
                    self.model.limit_address_space(s, addr)
            return addr
        addr, self.fresh = self.fresh, self.fresh + space_bytes + (1 << 30)
        return addr


def _used_end(segment) -> int:
    """The end of the last mapped block of a segment (its whole range for a cudaMalloc segment)."""
    end = segment.addr
    for block in segment.iter_all_blocks():
        if block.mapped:
            end = block.end_addr
    return end


def _fence(model) -> None:
    """An expandable segment's address space is 1 1/8 of the device; the model's device is huge, the real
    one is not: the next recorded segment marks where each space really ends."""
    ordered = sorted(model.segments, key=lambda s: s.addr)
    for low, high in zip(ordered, ordered[1:]):
        if low.is_expandable and low.addr + low.address_space_bytes > high.addr >= _used_end(low):
            model.limit_address_space(low, high.addr)


def _device_bytes(reserved: int, trace: list[Mapping], settings: AllocatorConfig) -> int:
    """The model's device size: plenty (its driver refuses only where a recorded oom says so). With
    expandable segments the size also sets each segment's address space (1 1/8 of it), which decides when
    a segment is full; a recorded oom tells the device's usable bytes then (free + reserved)."""
    if not settings.expandable_segments:
        return MODEL_TOTAL_BYTES
    usable = 0
    for e in trace:
        action = e["action"]
        reserved += e["size"] if action in _GROWS else (-e["size"] if action in _RELEASES else 0)
        if action == "oom":
            usable = max(usable, reserved + e.get("device_free", e.get("addr", 0)))
    return usable or MODEL_TOTAL_BYTES


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
    model = model_factory(_device_bytes(seed.reserved_bytes, trace, settings), config=settings, device_index=dev)
    addresses = _Addresses(max([s["address"] + s["total_size"] for s in segments]
                               + [e.get("addr", 0) + e["size"] for e in trace if e["action"] in _GROWS] + [0]), model)
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
        _fence(model)
        model.check_invariants()
    except (KvlabError, ValueError) as exc:
        raise SnapshotError(f"{snap.source}: device {dev}: cannot replay: the allocator's state at the trace's "
                            f"first event could not be rebuilt from segments ({exc})") from None
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
    segs: list[tuple] = []  # recorded segment events since the last other event
    rec_res, mod_res, mod_alloc = result.recorded_reserved, result.modelled_reserved, result.modelled_allocated
    reserved, allocated, free = model.memory_reserved, model.memory_allocated, model.free
    unknown_frees = 0
    i = -1
    try:
        for i, e in enumerate(trace):
            action = e["action"]
            if action in _SEGMENT_EVENTS:
                rec_reserved += e["size"] if action in _GROWS else -e["size"]
                result.recorded_cuda_mallocs += action in _GROWS
                segs.append((action, e["addr"], e["size"], i))
            elif action == "alloc" or action == "oom":
                _malloc(model, e, i, segs, blocks, ops, sink, addresses, result)
                segs = []
            else:
                if segs:
                    _empty_cache(model, segs, i, ops, sink, result)
                    segs = []
                if action == "free_requested":
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
            res, now = reserved(), allocated() - pending_bytes
            rec_res.append(rec_reserved)
            mod_res.append(res)
            mod_alloc.append(now)
            if res != rec_reserved and action in _CHECKED:
                diverge(Divergence(i, "reserved", rec_reserved, res))
            if check:
                model.check_invariants()
        if segs:
            _empty_cache(model, segs, len(trace), ops, sink, result)
    except (KvlabError, KeyError, ValueError) as exc:  # the model's state no longer matches the recording's
        _stop(result, i, exc)
    if unknown_frees:
        result.notes.append(f"{unknown_frees} frees name a block the replay does not hold (left out)")


def _stop(result: ReplayResult, i: int, exc: Exception) -> None:
    """The model could not take event ``i`` (its state has drifted from the recording's, e.g. two segments
    over one address): stop there, keep what was replayed, and say so."""
    n = min(i, len(result.modelled_reserved))
    for series in (result.recorded_reserved, result.modelled_reserved, result.modelled_allocated):
        del series[n:]
    result.diverge(Divergence(i, "stopped", f"{len(result.trace):,} events", f"stopped: {type(exc).__name__}: {exc}"))
    result.notes.append(f"the replay stopped at event {i} of {len(result.trace):,}: the model could not take it "
                        f"({type(exc).__name__}: {exc}); the checks cover the events before it")
    result.trace = result.trace[:n]


def _rows(group: list[tuple]) -> list[tuple]:
    return sorted((g[0], g[1], g[2]) for g in group)


def _empty_cache(model, segs: list[tuple], i: int, ops: list, sink: _Sink, result: ReplayResult) -> None:
    """Segment events that no allocation follows: releases are an ``empty_cache``; a segment made for
    nothing is a divergence."""
    releases = [g for g in segs if g[0] in _RELEASES]
    grows = [g for g in segs if g[0] in _GROWS]
    if releases:
        sink.events = []
        model.recorder = sink
        model.empty_cache()
        model.recorder = None
        made = sorted(ev for ev in sink.events if ev[0] in _RELEASES)
        if _rows(releases) != made:
            result.diverge(Divergence(releases[0][3], "segment_free", _rows(releases), made))
        ops.append((OP_EMPTY, releases[0][3]))
    if grows:
        result.diverge(Divergence(grows[0][3], "segment_alloc", _rows(grows), "no allocation followed"))


def _first_new_address(model, trace: list[Mapping], i: int) -> int | None:
    """The first address mapped after event ``i`` outside every segment the model has: where an expandable
    segment that an out-of-memory allocation reserved (and could not map) is first used."""
    for e in trace[i + 1:]:
        if e["action"] == "segment_map" and not any(
                s.addr <= e["addr"] < s.addr + s.address_space_bytes for s in model.segments):
            return e["addr"]
    return None


def _like_empty_cache(model, releases: list[tuple], mapped_first: int, needed: int) -> bool:
    """Whether recorded releases read as an ``empty_cache`` followed by an allocation that needed a new
    segment, rather than the allocator's own release before a retried cudaMalloc (which maps the new pages
    without looking at the cache again). A partial mapping released is the allocator's own. Without
    expandable segments, an ``empty_cache`` freed exactly every fully free segment (the allocator's own
    frees the same, or with ``max_split_size`` only oversize blocks). With them, the allocator's own,
    having mapped nothing first, must have released at least what it then mapped."""
    if mapped_first:
        return False
    if model.config.expandable_segments:
        return sum(g[2] for g in releases) < needed
    whole = sorted(("segment_free", seg.addr, seg.size) for seg in model.segments
                   if not seg.is_expandable and seg.head.next is None and not seg.head.allocated)
    return whole == _rows(releases)


def _attempt(model, e: Mapping, limit: int | None, grows: list[tuple], addresses: _Addresses, sink: _Sink,
             later: int | None = None):
    """``malloc`` the recorded request with the driver holding ``limit`` free bytes (None: plenty) and the
    recorded new-segment addresses queued (then ``later``: where a segment made now is first mapped);
    returns (block or None on OOM, the model's segment events)."""
    if grows or addresses.queue or later is not None:
        addresses.queue = [g[1] for g in grows] + ([later] if later is not None else [])
    if limit is not None:
        model.non_pytorch_bytes = max(0, model.total_bytes - model.memory_reserved() - limit)
    sink.events = []
    model.recorder = sink
    try:
        block = model.malloc(e["size"], e.get("stream", 0))
    except OutOfMemoryError:
        block = None
    finally:
        model.recorder = None
        model.non_pytorch_bytes = 0
    if addresses.made_segment:
        addresses.made_segment = False
        _fence(model)
    return block, sorted(ev for ev in sink.events if ev[0] in _SEGMENT_EVENTS)


def _malloc(model, e: Mapping, i: int, segs: list[tuple], blocks: dict, ops: list, sink: _Sink,
            addresses: _Addresses, result: ReplayResult) -> None:
    """One recorded ``malloc``: its segment events, then ``alloc`` (or ``oom``).

    Releases *before* new segments (or before an ``oom``) may be the allocator's own: a cudaMalloc failed,
    it freed cached segments (all of them, or with ``max_split_size`` only oversize ones; with expandable
    segments it unmaps free pages, a partial mapping included) and retried. The model's driver is then
    given the free bytes that make its first try fail and its retry fit what the recording mapped (an
    ``oom``: the recorded ``device_free`` after the releases), and the model's own releases are compared.
    When the model serves the request from its cache instead, no cudaMalloc failed: the releases were an
    ``empty_cache`` just before the allocation (the allocation is undone and replayed after one)."""
    first_release = next((k for k, g in enumerate(segs) if g[0] in _RELEASES), None)
    oom = e["action"] == "oom"
    releases = [g for g in segs if g[0] in _RELEASES]
    grows = [g for g in segs if g[0] in _GROWS]
    mapped_first = sum(g[2] for g in segs[:first_release] if g[0] in _GROWS)
    device_free = e.get("device_free", e.get("addr", 0))
    needed = device_free if oom else sum(g[2] for g in grows) - mapped_first  # what the retry found free
    own = oom or (first_release is not None and any(g[0] in _GROWS for g in segs[first_release:])
                  and not _like_empty_cache(model, releases, mapped_first, needed))
    block, made = None, []
    if own:
        limit = mapped_first + max(0, needed - sum(g[2] for g in releases))  # a partial mapping fits first
        later = _first_new_address(model, result.trace, i) if oom and model.config.expandable_segments else None
        block, made = _attempt(model, e, limit, grows, addresses, sink, later)
        if not oom and block is not None and not any(ev[0] in _RELEASES for ev in made):
            model.free(block)  # served from the cache: undo, then empty_cache and allocate
            own = False
    if not own:
        if releases:
            _empty_cache(model, releases, i, ops, sink, result)
        segs = grows
        block, made = _attempt(model, e, None, grows, addresses, sink)
    elif releases:  # the what-ifs release their cache where the recording did (and, at a capacity, when they must)
        ops.append((OP_EMPTY, releases[0][3]))
    if _rows(segs) != made:
        kind = "segment_free" if _rows([g for g in segs if g[0] in _RELEASES]) != [
            ev for ev in made if ev[0] in _RELEASES] else "segment_alloc"
        result.diverge(Divergence(segs[0][3] if segs else i, kind, _rows(segs), made))
    if oom:
        result.recorded_ooms += 1
        if block is None:
            result.modelled_ooms += 1
        else:
            result.diverge(Divergence(i, "oom", f"out of memory with {device_free:,} B free",
                                      f"allocated {block.addr:#x}"))
            model.free(block)
        return
    if block is None:
        result.diverge(Divergence(i, "alloc", "allocated", "out of memory"))
        return
    addr = e["addr"]
    if block.addr != addr:
        result.diverge(Divergence(i, "block_address", addr, block.addr))
    if addr in blocks:
        result.diverge(Divergence(i, "alloc", "address already live in the replay", addr))
    blocks[addr] = block
    ops.append((OP_ALLOC, addr, e["size"], e.get("stream", 0), i))


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
