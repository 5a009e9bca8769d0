"""The event-by-event engine of :mod:`kvlab.device.replay.fidelity`: how each recorded event drives the
allocator model, and what is compared.

``run_trace`` walks one device's trace. Segment events are buffered until the next other event: an ``alloc`` or
``oom`` takes them as its own (:func:`_malloc`: new segments at the recorded addresses, releases that are
the allocator's own before a retried cudaMalloc, the driver limit that sends the model down that path),
any other event turns buffered releases into an ``empty_cache`` (:func:`_empty_cache`). Frees deferred on
CUDA events keep their block until ``free_completed``. Every difference becomes a
:class:`~kvlab.device.replay.report.Divergence`.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvlab.device.caching_allocator import (
    AllocatorConfig,
    CachingAllocatorModel,
    OutOfMemoryError,
)
from kvlab.device.replay.report import OP_ALLOC, OP_EMPTY, OP_FREE, OP_FREE_REQUESTED, Divergence, ReplayResult
from kvlab.errors import InvariantError, KvlabError
from kvlab.units import GiB, TiB

MODEL_TOTAL_BYTES = 1 << 50  # the model's driver never refuses, except where a recorded oom says it did
_RELEASES = frozenset({"segment_free", "segment_unmap"})
GROWS = frozenset({"segment_alloc", "segment_map"})
_SEGMENT_EVENTS = _RELEASES | GROWS
_CHECKED = frozenset({"alloc", "free_requested", "free_completed", "oom", "snapshot"})  # not mid-group


class Sink:
    """The model's recorder during a replay: keeps ``(action, addr, size)`` of the current step."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []

    def record(self, action, addr, size, **_):
        self.events.append((action, addr, size))


class Addresses:
    """The model's segment-address hook: the recorded address of the segment the recording made before
    this allocation (torch makes or grows one segment per malloc), else a fresh one above every recorded
    address. A recorded address inside what a model segment already uses is refused (the model would file
    two blocks under one address): the model then differs from the recording, and the checks say so."""

    def __init__(self, highest: int, model: CachingAllocatorModel) -> None:
        self.queue: list[int] = []
        self.fresh = highest + TiB
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
        addr, self.fresh = self.fresh, self.fresh + space_bytes + GiB
        return addr


def _used_end(segment) -> int:
    """The end of the last mapped block of a segment (its whole range for a cudaMalloc segment)."""
    end = segment.addr
    for block in segment.iter_all_blocks():
        if block.mapped:
            end = block.end_addr
    return end


def fence(model) -> None:
    """An expandable segment's address space is 1 1/8 of the device; the model's device is huge, the real
    one is not: the next recorded segment marks where each space really ends."""
    ordered = sorted(model.segments, key=lambda s: s.addr)
    for low, high in zip(ordered, ordered[1:]):
        if low.is_expandable and low.addr + low.address_space_bytes > high.addr >= _used_end(low):
            model.limit_address_space(low, high.addr)


def model_device_bytes(reserved: int, trace: list[Mapping], settings: AllocatorConfig,
                  device_memory: int | None = None) -> tuple[int, str]:
    """The model's device size and where it came from. Without expandable segments: plenty (its driver
    refuses only where a recorded oom says so). With them the size also sets each segment's address space
    (1 1/8 of it), which decides when a segment is full: ``device_memory`` (``kvlab replay
    --device-memory``) when given, else a recorded oom's usable bytes then (free + reserved; the CUDA
    context and other processes' memory make the real device somewhat larger), else unknown (plenty)."""
    if not settings.expandable_segments:
        return MODEL_TOTAL_BYTES, "not needed"
    if device_memory is not None:
        return device_memory, "given"
    usable = 0
    for e in trace:
        action = e["action"]
        reserved += e["size"] if action in GROWS else (-e["size"] if action in _RELEASES else 0)
        if action == "oom":
            usable = max(usable, reserved + e.get("device_free", e.get("addr", 0)))
    return (usable, "oom") if usable else (MODEL_TOTAL_BYTES, "unknown")


def reserved_at_start(segments: list[Mapping], trace: list[Mapping]) -> int:
    """Reserved bytes before ``trace[0]``: the final segments' bytes with the trace's mappings undone."""
    reserved = sum(s["total_size"] for s in segments)
    for e in trace:
        action = e["action"]
        reserved -= e["size"] if action in GROWS else (-e["size"] if action in _RELEASES else 0)
    return reserved


def run_trace(model, trace, blocks, pending, ops, sink, addresses, result: ReplayResult, check: bool) -> None:
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
                rec_reserved += e["size"] if action in GROWS else -e["size"]
                result.recorded_cuda_mallocs += action in GROWS
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
    except (KvlabError, InvariantError, KeyError, ValueError) as exc:  # the model's state drifted from the recording's
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


def _empty_cache(model, segs: list[tuple], i: int, ops: list, sink: Sink, result: ReplayResult) -> None:
    """Segment events that no allocation follows: releases are an ``empty_cache``; a segment made for
    nothing is a divergence."""
    releases = [g for g in segs if g[0] in _RELEASES]
    grows = [g for g in segs if g[0] in GROWS]
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


def _attempt(model, e: Mapping, limit: int | None, grows: list[tuple], addresses: Addresses, sink: Sink,
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
        fence(model)
    return block, sorted(ev for ev in sink.events if ev[0] in _SEGMENT_EVENTS)


def _malloc(model, e: Mapping, i: int, segs: list[tuple], blocks: dict, ops: list, sink: Sink,
            addresses: Addresses, result: ReplayResult) -> None:
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
    grows = [g for g in segs if g[0] in GROWS]
    mapped_first = sum(g[2] for g in segs[:first_release] if g[0] in GROWS)
    device_free = e.get("device_free", e.get("addr", 0))
    needed = device_free if oom else sum(g[2] for g in grows) - mapped_first  # what the retry found free
    own = oom or (first_release is not None and any(g[0] in GROWS for g in segs[first_release:])
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
