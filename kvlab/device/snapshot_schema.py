"""Validating a loaded allocator snapshot against torch's ``_dump_snapshot`` schema: the block states, the fields
each segment, block and trace event must carry, and the checks that refuse a snapshot contradicting itself, each
naming the source and the field (:class:`SnapshotError`). ``kvlab.device.snapshot.read_snapshot`` runs them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvlab.device.events import ACTIONS
from kvlab.device.snapshot_keys import short_repr
from kvlab.errors import KvlabError

BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
# One vocabulary for block states in every table, legend and CLI line (memory_viz's words, shortened).
STATE_NAMES = {"active_allocated": "live", "active_pending_free": "pending free", "inactive": "free"}
# torch's docs spell the pending state ``active_awaiting_free``; the C++ writes ``active_pending_free``.
_STATE_ALIASES = {"active_awaiting_free": "active_pending_free"}
SEGMENT_FIELDS = ("address", "total_size", "allocated_size", "stream", "segment_type", "blocks")
BLOCK_FIELDS = ("size", "state")
TRACE_FIELDS = ("action", "size")


class SnapshotError(KvlabError, ValueError):
    """A snapshot that does not follow torch's schema, or a pickle that asks for code to run; the message
    names the source and the field (or the refused ``module.name``)."""


def snapshot_error(source: str, where: str, message: str) -> SnapshotError:
    return SnapshotError(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def _require(entry: Any, fields: tuple[str, ...], source: str, where: str) -> None:
    if not isinstance(entry, Mapping):
        raise snapshot_error(source, where, f"expected a dict, got {type(entry).__name__}")
    for field in fields:
        if field not in entry:
            raise snapshot_error(source, where, f"missing required field {field!r}")


def normalise_state(state: str, source: str = "snapshot", where: str = "") -> str:
    state = _STATE_ALIASES.get(state, state) if isinstance(state, str) else state  # a list is no dict key
    if not isinstance(state, str) or state not in BLOCK_STATES:
        accepted = BLOCK_STATES + tuple(_STATE_ALIASES)
        raise snapshot_error(source, where, f"unknown block state {shown_value(state)}; expected one of {accepted}")
    return state


def as_snapshot_dict(raw: Any, source: str) -> tuple[Any, str]:
    """``torch.cuda.memory_snapshot()`` returns the segment list alone: read it as a snapshot without history."""
    if not isinstance(raw, list):
        return raw, "dump_snapshot"
    for i, seg in enumerate(raw):
        if not isinstance(seg, Mapping):
            raise snapshot_error(source, f"[{i}]", f"expected a segment dict, got {type(seg).__name__} (a top-level list is "
                        "read as torch.cuda.memory_snapshot()'s segment list)")
    return {"segments": raw, "device_traces": []}, "segment_list"


def validate_snapshot(raw: Any, source: str) -> None:
    if not isinstance(raw, Mapping):
        raise snapshot_error(source, "", f"expected a dict at the top level, got {type(raw).__name__}")
    if "segments" not in raw:
        raise snapshot_error(source, "", "missing top key 'segments' (not a torch.cuda.memory._dump_snapshot file?)")
    if not isinstance(raw["segments"], list):
        raise snapshot_error(source, "segments", f"expected a list, got {type(raw['segments']).__name__}")
    seen: set[int] = set()  # ids of the entries read: torch writes every segment, block and event as its own object
    for i, seg in enumerate(raw["segments"]):
        _require(seg, SEGMENT_FIELDS, source, f"segments[{i}]")
        _once(seg, seen, source, f"segments[{i}]")
        for key in ("address", "total_size", "allocated_size"):
            _require_int(seg[key], source, f"segments[{i}].{key}")
        for key in ("device", "stream", "requested_size", "active_size"):
            if key in seg:
                _require_int(seg[key], source, f"segments[{i}].{key}")
        if not isinstance(seg["blocks"], list):
            raise snapshot_error(source, f"segments[{i}].blocks", f"expected a list, got {type(seg['blocks']).__name__}")
        for j, block in enumerate(seg["blocks"]):
            where = f"segments[{i}].blocks[{j}]"
            _require(block, BLOCK_FIELDS, source, where)
            _once(block, seen, source, where)
            _require_int(block["size"], source, f"{where}.size")
            for key in ("address", "requested_size"):
                if key in block:
                    _require_int(block[key], source, f"{where}.{key}")
            normalise_state(block["state"], source, f"{where}.state")
        _check_segment(seg, source, f"segments[{i}]")
    _check_overlaps(raw["segments"], source)
    _check_settings(raw.get("allocator_settings"), source)
    traces = raw.get("device_traces", [])
    if not isinstance(traces, list):
        raise snapshot_error(source, "device_traces", f"expected a list, got {type(traces).__name__}")
    _check_devices(raw["segments"], traces, source)
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            raise snapshot_error(source, f"device_traces[{d}]", f"expected a list, got {type(trace).__name__}")
        if id(trace) in seen:
            raise _shared(source, f"device_traces[{d}]")
        seen.add(id(trace))
        for k, entry in enumerate(trace):
            _once(entry, seen, source, f"device_traces[{d}][{k}]")
            # fast path for a well-formed entry (a million take ~0.5 s); anything else gets the precise error
            if type(entry) is dict and type(entry.get("action")) is str and entry["action"] in _ACTION_SET:
                size, stream = entry.get("size"), entry.get("stream", 0)
                addr = entry.get("addr", entry.get("device_free"))
                time_us = entry.get("time_us", 0)
                if type(size) is int and type(addr) is int and type(stream) is int and min(size, addr, stream) >= 0 \
                        and max(size, addr, stream) < 1 << 64 and type(time_us) is int and 0 <= time_us < 1 << 63:
                    continue
            _check_entry(entry, source, f"device_traces[{d}][{k}]")
        _check_trace_order(trace, source, f"device_traces[{d}]")


SEGMENT_TYPES = ("small", "large")


def _check_segment(seg: Mapping, source: str, where: str) -> None:
    """What torch's own segments always are: a pool of ``small`` or ``large``, ``is_expandable`` a bool, at least one
    byte, and blocks inside it; a snapshot that says otherwise contradicts itself and is refused naming the field
    (it was replayed without a note, issue 37)."""
    if seg["segment_type"] not in SEGMENT_TYPES or type(seg["segment_type"]) is not str:
        raise snapshot_error(source, f"{where}.segment_type", f"expected one of {SEGMENT_TYPES}, got {shown_value(seg['segment_type'])}")
    if type(seg.get("is_expandable", False)) is not bool:
        raise snapshot_error(source, f"{where}.is_expandable", f"expected True or False, got {shown_value(seg['is_expandable'])}")
    if seg["total_size"] == 0:
        raise snapshot_error(source, f"{where}.total_size", "0 bytes: a segment holds at least one block (torch never records "
                                                   "an empty one)")
    start, end = seg["address"], seg["address"] + seg["total_size"]
    addr = start
    for j, block in enumerate(seg["blocks"]):
        addr = block.get("address", addr)
        if addr < start or (not seg.get("is_expandable", False) and addr + block["size"] > end):
            field = "address" if addr < start or addr >= end else "size"
            raise snapshot_error(source, f"{where}.blocks[{j}].{field}", f"block {addr:#x} + {block['size']:,} B lies outside "
                        f"its segment {start:#x} + {seg['total_size']:,} B")
        addr += block["size"]


def _check_devices(segments: list, traces: list, source: str) -> None:
    """torch writes one trace per device (``device_traces[d]``): a segment of a device beyond them contradicts it."""
    if not traces:
        return
    for i, seg in enumerate(segments):
        if seg.get("device", 0) >= len(traces):
            known = "device 0 only" if len(traces) == 1 else f"devices 0 to {len(traces) - 1}"
            raise snapshot_error(source, f"segments[{i}].device", f"device {seg['device']}, but device_traces holds one trace "
                        f"per device, for {known}")


def _check_trace_order(trace: list, source: str, where: str) -> None:
    """A block's events come in torch's order: alloc, (free_requested,) free_completed of the same size. A trace may
    begin with an older block's free (the history is a ring buffer), but it never allocates an address still
    allocated, frees one twice, frees other bytes than it allocated, or frees a block in a segment it allocated
    (or mapped) with nothing allocated there since: each is refused naming the event."""
    live: dict[int, tuple[int, int]] = {}  # addr -> (event index of its alloc, size)
    freed: dict[int, int] = {}  # addr -> event index of its free_completed
    fresh: list[tuple[int, int, int]] = []  # (start, end, event index): segments the trace allocated, still held
    for k, entry in enumerate(trace):
        action, addr, size = entry["action"], entry.get("addr"), entry["size"]
        if action in ("segment_alloc", "segment_map"):
            fresh.append((addr, addr + size, k))
        elif action in ("segment_free", "segment_unmap"):
            fresh = [f for f in fresh if not addr <= f[0] < addr + size]
        elif action == "alloc":
            if addr in live:
                raise snapshot_error(source, f"{where}[{k}]", f"alloc at {addr:#x} while the block event {live[addr][0]} "
                            "allocated there is not freed: the trace contradicts itself")
            live[addr] = (k, size)
            freed.pop(addr, None)
        elif action in ("free_requested", "free_completed"):
            _check_free(entry, k, live, freed, fresh, source, where)


def _check_free(entry: Mapping, k: int, live: dict, freed: dict, fresh: list, source: str, where: str) -> None:
    action, addr, size = entry["action"], entry["addr"], entry["size"]
    if addr in freed:
        raise snapshot_error(source, f"{where}[{k}]", f"{action} at {addr:#x}, which event {freed[addr]} freed already "
                    "with no alloc between: the trace contradicts itself")
    if addr not in live:  # a block older than the history: its segment cannot be one the trace made
        segment = next((f for f in fresh if f[0] <= addr < f[1]), None)
        if segment is not None:
            raise snapshot_error(source, f"{where}[{k}]", f"{action} at {addr:#x} before any alloc there: event "
                        f"{segment[2]} allocated its segment {segment[0]:#x} empty, so no block was there to free")
    if action == "free_completed":
        alloc = live.pop(addr, None)
        if alloc is not None and alloc[1] != size:
            raise snapshot_error(source, f"{where}[{k}].size", f"free_completed of {size:,} B at {addr:#x}, but event "
                        f"{alloc[0]} allocated {alloc[1]:,} B there: the trace contradicts itself")
        freed[addr] = k


def _check_overlaps(segments: list, source: str) -> None:
    """Two segments over the same addresses of one device: torch never records that (each is its own cudaMalloc
    or mapped range), so the file was edited or is corrupt; it was replayed without a note (issue 26)."""
    spans = sorted((seg.get("device", 0), seg["address"], seg["address"] + seg["total_size"], i)
                   for i, seg in enumerate(segments))
    for (d0, _, e0, i0), (d1, a1, _, i1) in zip(spans, spans[1:]):
        if d0 == d1 and a1 < e0:
            first, second = sorted((i0, i1))
            raise snapshot_error(source, f"segments[{second}]", f"{segments[second]['address']:#x} + "
                        f"{segments[second]['total_size']:,} B overlaps segments[{first}] "
                        f"({segments[first]['address']:#x} + {segments[first]['total_size']:,} B) on device {d0}: "
                        "torch never records two segments over the same addresses")


def _check_settings(settings: Any, source: str) -> None:
    """``allocator_settings`` (torch >= 2.5): each setting the replay reads has torch's type, or the snapshot is
    refused naming the setting (a string or infinite max_split_size is no size)."""
    if settings is None:
        return
    if not isinstance(settings, Mapping):
        raise snapshot_error(source, "allocator_settings", f"expected a dict, got {shown_value(settings)}")

    def number(value: Any) -> bool:
        return (type(value) is int and abs(value) < 1 << 64) or (type(value) is float and math.isfinite(value))

    for key, valid, expected in (
        ("max_split_size", lambda v: v is None or (type(v) is int and -1 <= v < 1 << 64), "an int (-1: unlimited)"),
        ("expandable_segments", lambda v: type(v) is bool, "a bool"),
        ("garbage_collection_threshold", lambda v: v is None or (number(v) and 0 <= v <= 1), "a number in [0, 1]"),
        ("roundup_power2_divisions", lambda v: (type(v) is int and 0 <= v < 1 << 16) or (
            isinstance(v, (list, tuple, Mapping)) and len(v) <= 1 << 16 and all(
                type(d) is int and 0 <= d < 1 << 16 for d in (v.values() if isinstance(v, Mapping) else v))),
         "an int or a list or dict of ints under 65,536"),
    ):
        if key in settings and not valid(settings[key]):
            raise snapshot_error(source, f"allocator_settings.{key}", f"expected {expected}, got {shown_value(settings[key])}")


def _once(entry: Any, seen: set[int], source: str, where: str) -> None:
    """Refuse an entry that is the very object of an earlier one: a pickle's shared reference, which lets a
    file of kilobytes stand for billions of blocks or events (torch never writes one)."""
    if id(entry) in seen:
        raise _shared(source, where)
    seen.add(id(entry))


def _shared(source: str, where: str) -> SnapshotError:
    return snapshot_error(source, where, "the same object as an earlier entry (a shared reference in the pickle): torch "
                                "writes each segment, block and event as its own; refused, so a small file cannot "
                                "stand for billions of entries")


def shown_value(value: Any) -> str:
    """``value`` for an error message: its repr cut to 60 characters and 3 levels of nesting (a value nested a
    million deep is shown, never a RecursionError), with its type unless it is plain."""
    text = short_repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if value is None or type(value) in (str, int, float, bool) else f"{type(value).__name__} {text}"


_ACTION_SET = frozenset(ACTIONS)


def _require_int(value: Any, source: str, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 1 << 64:
        raise snapshot_error(source, where, f"expected a non-negative int, got {shown_value(value)}"
                           + (" (2**64 or more)" if isinstance(value, int) and value >= 1 << 64 else ""))


def _check_entry(entry: Any, source: str, where: str) -> None:
    _require(entry, TRACE_FIELDS, source, where)
    if not isinstance(entry["action"], str) or entry["action"] not in ACTIONS:
        raise snapshot_error(source, f"{where}.action", f"unknown action {shown_value(entry['action'])}; expected one of {ACTIONS}")
    if "addr" not in entry and not (entry["action"] == "oom" and "device_free" in entry):
        raise snapshot_error(source, where, "missing required field 'addr'")
    for key in ("size", "addr", "device_free", "stream"):
        if key in entry:
            _require_int(entry[key], source, f"{where}.{key}")
    time_us = entry.get("time_us", 0)
    if not ((type(time_us) is int and 0 <= time_us < 1 << 63)
            or (type(time_us) is float and math.isfinite(time_us) and 0 <= time_us < 2.0 ** 63)):
        raise snapshot_error(source, f"{where}.time_us", f"expected microseconds, a non-negative int under 2**63, got "
                                                f"{shown_value(time_us)}")
