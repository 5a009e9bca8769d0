"""Read, record and replay allocator snapshots in torch's ``_dump_snapshot`` schema.

A snapshot is the pickle ``torch.cuda.memory._dump_snapshot(path)`` writes (docs/semantics.md#memory-snapshots)::

    {"segments": [{address, total_size, allocated_size, active_size, stream, segment_type,
                   is_expandable, blocks: [{address, size, requested_size, state}, ...]}, ...],
     "device_traces": [[{action, addr, size, stream, time_us, frames}, ...], ...],  # one per device
     "allocator_settings": {...}}

``segments`` is the state *now*; ``device_traces`` is a ring buffer, so its first event may come
long after allocations that are still alive. :meth:`Snapshot.timeline` therefore starts from the
final state in ``segments`` and undoes the trace backwards, as
``torch/cuda/_memory_viz.py`` / ``MemoryViz.js::process_alloc_data`` do.

Where kvlab differs on purpose: memory_viz draws requested bytes; the timeline here carries
both ``requested_bytes`` (trace sizes, memory_viz's view) and ``allocated_bytes`` (block sizes,
``torch.cuda.memory_allocated()``'s view). A block freed inside the trace but allocated before
it has no size in the snapshot but its request, so its block size is estimated with
``round_size`` (exact unless the allocator left it unsplit).
"""

from __future__ import annotations

import gc
import math
import os
import pickle
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.device.caching_allocator import round_size
from kvlab.device.events import ACTIONS
from kvlab.device.snapshot_keys import SnapshotKeyWarning as SnapshotKeyWarning  # re-exported
from kvlab.device.snapshot_keys import short_repr, warn_unknown_keys
from kvlab.errors import KvlabError
from kvlab.input_limits import check_size, reading
from kvlab.paths import data_path
from kvlab.units import KiB, MiB

BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
# One vocabulary for block states in every table, legend and CLI line (memory_viz's words, shortened).
STATE_NAMES = {"active_allocated": "live", "active_pending_free": "pending free", "inactive": "free"}
# torch's docs spell the pending state ``active_awaiting_free``; the C++ writes ``active_pending_free``.
_STATE_ALIASES = {"active_awaiting_free": "active_pending_free"}
SEGMENT_FIELDS = ("address", "total_size", "allocated_size", "stream", "segment_type", "blocks")
BLOCK_FIELDS = ("size", "state")
TRACE_FIELDS = ("action", "size")
PICKLE_PROTOCOL = 4

# What each action does to (allocated, reserved): alloc / free_completed move allocated bytes,
# segment_* move reserved bytes; free_requested, snapshot and oom move neither.
_ALLOCATED_SIGN = {"alloc": +1, "free_completed": -1}
_RESERVED_SIGN = {"segment_alloc": +1, "segment_map": +1, "segment_free": -1, "segment_unmap": -1}

SEGMENT_COLUMNS = (
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size",
    "segment_type", "stream", "is_expandable",
)
BLOCK_COLUMNS = ("device", "segment_address", "address", "size", "requested_size", "state")
EVENT_COLUMNS = ("device", "time_us", "action", "addr", "size", "stream")
TIMELINE_COLUMNS = (
    "device", "step", "time_us", "action", "addr", "size", "allocated_bytes", "requested_bytes", "reserved_bytes",
)


# The objects a pickle may build per byte of its file: the real and generated snapshots build 0.02 to 0.15 (dense
# events without stacks), a crafted pickle of empty dicts 0.5 (40 M of them took 3.7 GB). Small files get a floor.
PICKLE_OBJECTS_PER_BYTE = 0.25
PICKLE_OBJECTS_FLOOR = 1 << 20
_OBJECTS_PER_BYTE_AT_MOST = 2  # what one byte of a pickle can build: an opcode of one byte makes one object


class SnapshotError(KvlabError, ValueError):
    """A snapshot that does not follow torch's schema, or a pickle that asks for code to run; the message
    names the source and the field (or the refused ``module.name``)."""


class _SnapshotUnpickler(pickle.Unpickler):
    """Unpickles plain data only: a pickle that names any global or persistent id is refused.

    ``torch.cuda.memory._dump_snapshot`` is ``pickle.dump(torch.cuda.memory._snapshot(), f)`` (default
    protocol, 4 or 5): dicts, lists, tuples, str, int, float, bool and None, each with its own opcode, so
    a real snapshot names no global at all (the shipped example and three snapshots recorded on real GPUs
    with torch 2.6 and 2.9 name none; tests/device/test_snapshot_safety.py). A global is how a pickle
    reaches code (``os.system``, ``builtins.eval``, a class's ``__reduce__``), so none is admitted: a
    plain ``pickle.load`` would run it while reading the file.
    """

    def __init__(self, file, source: str):
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str):  # GLOBAL, STACK_GLOBAL, INST and EXT* opcodes land here
        raise SnapshotError(
            f"{self._source}: refused global {module}.{name}: not a torch memory snapshot, which holds only plain "
            "data (dict, list, tuple, str, int, float, bool, None); a plain pickle.load could run code from this file"
        )

    def persistent_load(self, pid):
        raise SnapshotError(
            f"{self._source}: refused persistent id {_shown(pid)}: not a torch memory snapshot, which has none "
            "(torch.save checkpoints have them: read those with torch.load(weights_only=True))"
        )


class _BoundedPickleInput:
    """A pickle's bytes as the file the C unpickler reads, which asks for more each time its buffer runs dry
    (every frame of 64 KiB, or 128 KiB without frames): each time, the objects built so far (the process's
    allocated blocks, ``sys.getallocatedblocks``) plus the most the bytes it asks for can build must stay within
    :attr:`bound`, or the load stops there with a :class:`SnapshotError` naming the bound. So a small file cannot
    build tens of millions of objects before the snapshot is even checked (issue 37: 3.7 GB and 17 s)."""

    def __init__(self, data: bytes, source: str):
        self._bytes, self._data, self._pos, self._source = data, memoryview(data), 0, source
        self.bound = max(PICKLE_OBJECTS_FLOOR, int(len(data) * PICKLE_OBJECTS_PER_BYTE))
        self._start = sys.getallocatedblocks()

    def _take(self, n: int | None, *, advance: bool = True) -> bytes:
        end = len(self._data) if n is None or n < 0 else min(self._pos + n, len(self._data))
        built = sys.getallocatedblocks() - self._start
        if built + (end - self._pos) * _OBJECTS_PER_BYTE_AT_MOST > self.bound:
            raise _fail(self._source, "", f"the pickle built {built:,} objects from its first {self._pos:,} bytes "
                        f"and could build more than the {self.bound:,} kvlab allows a file of {len(self._data):,} "
                        f"bytes ({PICKLE_OBJECTS_PER_BYTE:g} per byte; a torch snapshot builds under 0.15): refused "
                        "before the rest is loaded")
        chunk = bytes(self._data[self._pos:end])
        if advance:
            self._pos = end
        return chunk

    def read(self, n: int = -1) -> bytes:
        return self._take(n)

    def peek(self, n: int = 0) -> bytes:
        return self._take(max(n, 1), advance=False)

    def readinto(self, buffer) -> int:
        chunk = self._take(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)

    def readline(self) -> bytes:
        newline = self._bytes.find(b"\n", self._pos)
        return self._take(None if newline < 0 else newline + 1 - self._pos)


def load_snapshot_pickle(path: str | os.PathLike, then: Callable[[Any], Any] | None = None) -> Any:
    """The object in a ``_dump_snapshot`` pickle, read without running code from it.

    Only plain data is admitted (see :class:`_SnapshotUnpickler`); a pickle that names a global or a
    persistent id raises :class:`SnapshotError` naming the file and the refused ``module.name``, and
    nothing in it has run. A file too large for the memory this machine has is refused before it is read
    (:mod:`kvlab.input_limits`), and a pickle that builds more objects than its size explains is refused while it
    loads (:class:`_BoundedPickleInput`). Other unreadable content raises :class:`SnapshotError` too (not a
    pickle file). ``then``: called on the object, where the object's nesting cannot overflow the stack
    (:func:`_where_deep_tuples_fit`); its result is returned."""
    source = str(path)
    with open(path, "rb") as f, reading(path, source):
        status = os.fstat(f.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise _fail(source, "", "not a regular file (a FIFO, socket or device); give the snapshot file")
        check_size(path, source, "snapshot", status.st_size)
        data = f.read()  # a regular file of a known size that fits in memory
        try:  # from memory: a length field larger than the file (FRAME, BINBYTES8) reads short, or fails to allocate
            def load():
                obj = _SnapshotUnpickler(_BoundedPickleInput(data, source), source).load()
                return obj if then is None else then(obj)

            return _where_deep_tuples_fit(load, data)
        except SnapshotError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError,
                KeyError, OverflowError, RecursionError, MemoryError) as exc:
            raise _fail(source, "", f"not a pickle file ({type(exc).__name__}: {str(exc)[:200]})") from None


_MAIN_STACK_TUPLES = 50_000  # tuples nested in one another that hashing one on the main thread's 8 MiB stack takes
_STACK_PER_TUPLE = 128  # bytes of C stack per level of hash(): 150,000 levels overflowed 8 MiB
_TUPLE_OPCODES = (b"\x85", b"\x86", b"\x87", b"t")  # TUPLE1, TUPLE2, TUPLE3, TUPLE: one level each at most


def _where_deep_tuples_fit(call: Callable[[], Any], data: bytes) -> Any:
    """``call()``, where hashing the most deeply nested tuple the pickle ``data`` can build cannot overflow the C
    stack: ``hash()`` of a tuple recurses into its items in C, below Python's recursion limit, so a tuple nested
    150,000 deep as a dict key crashed the process while it loaded (a segmentation fault, not an error). Each
    level takes a tuple opcode, so their count bounds the depth: under :data:`_MAIN_STACK_TUPLES` (a real
    snapshot of 2 MB has 3,500 of those bytes) here, else in a thread whose stack holds that depth (reserved
    address space, used only as deep as the tuples go)."""
    depth = sum(map(data.count, _TUPLE_OPCODES))
    if depth < _MAIN_STACK_TUPLES:
        return call()
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread as it is
            outcome["error"] = exc

    previous = threading.stack_size(-(-(depth * _STACK_PER_TUPLE + (16 << 20)) // 65536) * 65536)
    try:
        worker = threading.Thread(target=run, name="kvlab-snapshot-load", daemon=True)  # Ctrl-C ends the process
        worker.start()
    finally:
        threading.stack_size(previous)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _fail(source: str, where: str, message: str) -> SnapshotError:
    return SnapshotError(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def _require(entry: Any, fields: tuple[str, ...], source: str, where: str) -> None:
    if not isinstance(entry, Mapping):
        raise _fail(source, where, f"expected a dict, got {type(entry).__name__}")
    for field in fields:
        if field not in entry:
            raise _fail(source, where, f"missing required field {field!r}")


def normalise_state(state: str, source: str = "snapshot", where: str = "") -> str:
    state = _STATE_ALIASES.get(state, state) if isinstance(state, str) else state  # a list is no dict key
    if not isinstance(state, str) or state not in BLOCK_STATES:
        accepted = BLOCK_STATES + tuple(_STATE_ALIASES)
        raise _fail(source, where, f"unknown block state {_shown(state)}; expected one of {accepted}")
    return state


@dataclass(frozen=True)
class TimelineResult:
    """The replayed totals: ``frame`` has one row per trace event (totals *after* it);
    ``initial_*`` is the state before the first recorded event (the largest over devices)."""

    frame: pd.DataFrame
    initial_allocated_bytes: int
    initial_reserved_bytes: int


@dataclass(frozen=True)
class Snapshot:
    """A validated ``_dump_snapshot`` dict. Build it with :func:`read_snapshot`."""

    raw: Mapping[str, Any]
    source: str = "snapshot"
    format: str = "dump_snapshot"  # or "segment_list": torch.cuda.memory_snapshot()'s list, no history

    @property
    def has_history(self) -> bool:
        return any(self.raw.get("device_traces") or [])

    # ---- frames -----------------------------------------------------------------------------
    def segments_frame(self) -> pd.DataFrame:
        rows = []
        for seg in self.raw["segments"]:
            allocated = seg["allocated_size"]
            rows.append(
                {
                    "device": seg.get("device", 0),
                    "address": seg["address"],
                    "total_size": seg["total_size"],
                    "allocated_size": allocated,
                    "active_size": seg.get("active_size", allocated),
                    "requested_size": seg.get("requested_size", 0),
                    "segment_type": seg["segment_type"],
                    "stream": seg["stream"],
                    "is_expandable": bool(seg.get("is_expandable", False)),
                }
            )
        return pd.DataFrame(rows, columns=list(SEGMENT_COLUMNS))

    def _iter_blocks(self):
        """(segment, block address, block) in address order; old snapshots without block
        addresses get them by summing sizes from the segment start (as memory_viz does)."""
        for seg in self.raw["segments"]:
            addr = seg["address"]
            for block in seg["blocks"]:
                yield seg, block.get("address", addr), block
                addr = block.get("address", addr) + block["size"]

    def blocks_frame(self) -> pd.DataFrame:
        rows = [
            {
                "device": seg.get("device", 0),
                "segment_address": seg["address"],
                "address": addr,
                "size": block["size"],
                "requested_size": block.get("requested_size", 0),
                "state": normalise_state(block["state"]),
            }
            for seg, addr, block in self._iter_blocks()
        ]
        return pd.DataFrame(rows, columns=list(BLOCK_COLUMNS))

    def events_frame(self) -> pd.DataFrame:
        rows = []
        for device, trace in enumerate(self.raw.get("device_traces", [])):
            for entry in trace:
                rows.append(
                    {
                        "device": device,
                        "time_us": entry.get("time_us", 0),
                        "action": entry["action"],
                        # oom entries carry the driver's free bytes instead of an address
                        "addr": entry.get("addr", entry.get("device_free", 0)),
                        "size": entry["size"],
                        "stream": entry.get("stream", 0),
                    }
                )
        return pd.DataFrame(rows, columns=list(EVENT_COLUMNS))

    # ---- replay -----------------------------------------------------------------------------
    def _block_round_size(self, size: int) -> int:
        divisions = self.raw.get("allocator_settings", {}).get("roundup_power2_divisions")
        # kvlab and torch write a per-interval dict; the model implements one value for all.
        if isinstance(divisions, Mapping):
            values = set(divisions.values())
            divisions = values.pop() if len(values) == 1 else None
        return round_size(size, divisions if isinstance(divisions, int) else None)

    def _prehistory_block_sizes(self, device: int, trace: list) -> dict[int, int]:
        """Exact sizes of the blocks live at the trace's first event (kvlab.device.replay.seed)."""
        from kvlab.device.replay.seed import infer_seed
        from kvlab.device.replay.settings import recorded_settings

        if not trace:
            return {}
        try:
            config, _ = recorded_settings(self.raw.get("allocator_settings"), self.source)
        except ValueError as exc:  # kvlab.device.replay.settings.SettingsError
            raise SnapshotError(str(exc)) from None
        segments = [s for s in self.raw["segments"] if s.get("device", 0) == device]
        return infer_seed(segments, trace, config).block_sizes

    def replay(self) -> TimelineResult:
        """Undo the trace from the final state in ``segments`` (one device at a time).

        Seed: allocated = sum of live block sizes, requested = their requested sizes,
        reserved = sum of segment sizes, per device. Walking back over event i, the totals
        before it are the totals after it minus what it did; a live block's exact size comes from
        ``segments``; a block that predates the history and is freed inside it gets the size
        :func:`~kvlab.device.replay.seed.infer_seed` rebuilds (its unsplit tail included); a block
        allocated and freed inside the trace gets ``round_size`` of its request
        (:func:`kvlab.device.replay.fidelity.replay_snapshot` sizes those exactly, with the allocator model)."""
        segments = self.segments_frame()
        blocks = self.blocks_frame()
        live = blocks[blocks["state"] != "inactive"]
        rows: list[dict] = []
        initial_allocated = initial_reserved = 0
        for device, trace in enumerate(self.raw.get("device_traces", [])):
            on_dev = live[live["device"] == device]
            allocated = int(on_dev["size"].sum())
            requested = int(on_dev["requested_size"].sum())
            reserved = int(segments.loc[segments["device"] == device, "total_size"].sum())
            block_bytes = dict(zip(on_dev["address"].tolist(), on_dev["size"].tolist()))
            prehistory = self._prehistory_block_sizes(device, trace)
            first_alloc: dict[int, int] = {}
            for k, entry in enumerate(trace):
                if entry["action"] == "alloc":
                    first_alloc.setdefault(entry["addr"], k)
            backwards = []
            for step in range(len(trace) - 1, -1, -1):
                entry = trace[step]
                action, size = entry["action"], entry["size"]
                addr = entry.get("addr", entry.get("device_free", 0))
                backwards.append(
                    {
                        "device": device, "step": step, "time_us": entry.get("time_us", 0), "action": action,
                        "addr": addr, "size": size, "allocated_bytes": allocated,
                        "requested_bytes": requested, "reserved_bytes": reserved,
                    }
                )
                if action == "alloc":  # before it, the block did not exist
                    allocated -= block_bytes.pop(addr, None) or self._block_round_size(size)
                    requested -= size
                elif action == "free_completed":  # before it, the block was alive
                    before_history = first_alloc.get(addr, step + 1) > step
                    block_bytes[addr] = (before_history and prehistory.get(addr)) or self._block_round_size(size)
                    allocated += block_bytes[addr]
                    requested += size
                reserved -= _RESERVED_SIGN.get(action, 0) * size
            rows.extend(reversed(backwards))
            initial_allocated = max(initial_allocated, allocated)
            initial_reserved = max(initial_reserved, reserved)
        return TimelineResult(pd.DataFrame(rows, columns=list(TIMELINE_COLUMNS)), initial_allocated, initial_reserved)

    def timeline(self) -> pd.DataFrame:
        """Allocated, requested and reserved bytes after each trace event, seeded from ``segments``."""
        return self.replay().frame

    @property
    def final_allocated_bytes(self) -> int:
        """Live block bytes now, summed over devices."""
        blocks = self.blocks_frame()
        return int(blocks.loc[blocks["state"] != "inactive", "size"].sum())

    @property
    def final_reserved_bytes(self) -> int:
        return int(self.segments_frame()["total_size"].sum())

    def _final_on_one_device(self, column: str) -> int:
        """The largest final total on any one device (``final_*_bytes`` sum over devices)."""
        if column == "allocated_bytes":
            blocks = self.blocks_frame()
            per_device = blocks[blocks["state"] != "inactive"].groupby("device")["size"].sum()
        else:
            per_device = self.segments_frame().groupby("device")["total_size"].sum()
        return int(per_device.max()) if len(per_device) else 0

    @property
    def peak_allocated_bytes(self) -> int:
        """Largest allocated total seen on one device: before the trace, after any event, or now."""
        result = self.replay()
        values = [result.initial_allocated_bytes, self._final_on_one_device("allocated_bytes"),
                  *result.frame["allocated_bytes"]]
        return int(max(values))

    @property
    def peak_reserved_bytes(self) -> int:
        """Largest reserved total seen on one device: before the trace, after any event, or now."""
        result = self.replay()
        values = [result.initial_reserved_bytes, self._final_on_one_device("reserved_bytes"),
                  *result.frame["reserved_bytes"]]
        return int(max(values))

    def summary(self) -> pd.Series:
        """What the file holds, in words and human units: segments, blocks per state (live / pending free /
        free), trace events, and peak and final allocated / reserved bytes."""
        from kvlab.units import fmt_bytes

        blocks = self.blocks_frame()
        states = {f"{STATE_NAMES[s]} blocks": int((blocks["state"] == s).sum())
                  for s in BLOCK_STATES if (blocks["state"] == s).any()}
        return pd.Series({
            "file": self.source, "segments": len(self.segments_frame()), "blocks": len(blocks), **states,
            "trace events": len(self.events_frame()),
            "peak allocated": fmt_bytes(self.peak_allocated_bytes),
            "peak reserved": fmt_bytes(self.peak_reserved_bytes),
            "allocated now": fmt_bytes(self.final_allocated_bytes),
            "reserved now": fmt_bytes(self.final_reserved_bytes),
        }, name="snapshot")


# ---- reading ------------------------------------------------------------------------------------


def _as_snapshot_dict(raw: Any, source: str) -> tuple[Any, str]:
    """``torch.cuda.memory_snapshot()`` returns the segment list alone: read it as a snapshot without history."""
    if not isinstance(raw, list):
        return raw, "dump_snapshot"
    for i, seg in enumerate(raw):
        if not isinstance(seg, Mapping):
            raise _fail(source, f"[{i}]", f"expected a segment dict, got {type(seg).__name__} (a top-level list is "
                        "read as torch.cuda.memory_snapshot()'s segment list)")
    return {"segments": raw, "device_traces": []}, "segment_list"


def _validate(raw: Any, source: str) -> None:
    if not isinstance(raw, Mapping):
        raise _fail(source, "", f"expected a dict at the top level, got {type(raw).__name__}")
    if "segments" not in raw:
        raise _fail(source, "", "missing top key 'segments' (not a torch.cuda.memory._dump_snapshot file?)")
    if not isinstance(raw["segments"], list):
        raise _fail(source, "segments", f"expected a list, got {type(raw['segments']).__name__}")
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
            raise _fail(source, f"segments[{i}].blocks", f"expected a list, got {type(seg['blocks']).__name__}")
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
        raise _fail(source, "device_traces", f"expected a list, got {type(traces).__name__}")
    _check_devices(raw["segments"], traces, source)
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            raise _fail(source, f"device_traces[{d}]", f"expected a list, got {type(trace).__name__}")
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
        raise _fail(source, f"{where}.segment_type", f"expected one of {SEGMENT_TYPES}, got {_shown(seg['segment_type'])}")
    if type(seg.get("is_expandable", False)) is not bool:
        raise _fail(source, f"{where}.is_expandable", f"expected True or False, got {_shown(seg['is_expandable'])}")
    if seg["total_size"] == 0:
        raise _fail(source, f"{where}.total_size", "0 bytes: a segment holds at least one block (torch never records "
                                                   "an empty one)")
    start, end = seg["address"], seg["address"] + seg["total_size"]
    addr = start
    for j, block in enumerate(seg["blocks"]):
        addr = block.get("address", addr)
        if addr < start or (not seg.get("is_expandable", False) and addr + block["size"] > end):
            field = "address" if addr < start or addr >= end else "size"
            raise _fail(source, f"{where}.blocks[{j}].{field}", f"block {addr:#x} + {block['size']:,} B lies outside "
                        f"its segment {start:#x} + {seg['total_size']:,} B")
        addr += block["size"]


def _check_devices(segments: list, traces: list, source: str) -> None:
    """torch writes one trace per device (``device_traces[d]``): a segment of a device beyond them contradicts it."""
    if not traces:
        return
    for i, seg in enumerate(segments):
        if seg.get("device", 0) >= len(traces):
            known = "device 0 only" if len(traces) == 1 else f"devices 0 to {len(traces) - 1}"
            raise _fail(source, f"segments[{i}].device", f"device {seg['device']}, but device_traces holds one trace "
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
                raise _fail(source, f"{where}[{k}]", f"alloc at {addr:#x} while the block event {live[addr][0]} "
                            "allocated there is not freed: the trace contradicts itself")
            live[addr] = (k, size)
            freed.pop(addr, None)
        elif action in ("free_requested", "free_completed"):
            _check_free(entry, k, live, freed, fresh, source, where)


def _check_free(entry: Mapping, k: int, live: dict, freed: dict, fresh: list, source: str, where: str) -> None:
    action, addr, size = entry["action"], entry["addr"], entry["size"]
    if addr in freed:
        raise _fail(source, f"{where}[{k}]", f"{action} at {addr:#x}, which event {freed[addr]} freed already "
                    "with no alloc between: the trace contradicts itself")
    if addr not in live:  # a block older than the history: its segment cannot be one the trace made
        segment = next((f for f in fresh if f[0] <= addr < f[1]), None)
        if segment is not None:
            raise _fail(source, f"{where}[{k}]", f"{action} at {addr:#x} before any alloc there: event "
                        f"{segment[2]} allocated its segment {segment[0]:#x} empty, so no block was there to free")
    if action == "free_completed":
        alloc = live.pop(addr, None)
        if alloc is not None and alloc[1] != size:
            raise _fail(source, f"{where}[{k}].size", f"free_completed of {size:,} B at {addr:#x}, but event "
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
            raise _fail(source, f"segments[{second}]", f"{segments[second]['address']:#x} + "
                        f"{segments[second]['total_size']:,} B overlaps segments[{first}] "
                        f"({segments[first]['address']:#x} + {segments[first]['total_size']:,} B) on device {d0}: "
                        "torch never records two segments over the same addresses")


def _check_settings(settings: Any, source: str) -> None:
    """``allocator_settings`` (torch >= 2.5): each setting the replay reads has torch's type, or the snapshot is
    refused naming the setting (a string or infinite max_split_size is no size)."""
    if settings is None:
        return
    if not isinstance(settings, Mapping):
        raise _fail(source, "allocator_settings", f"expected a dict, got {_shown(settings)}")

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
            raise _fail(source, f"allocator_settings.{key}", f"expected {expected}, got {_shown(settings[key])}")


def _once(entry: Any, seen: set[int], source: str, where: str) -> None:
    """Refuse an entry that is the very object of an earlier one: a pickle's shared reference, which lets a
    file of kilobytes stand for billions of blocks or events (torch never writes one)."""
    if id(entry) in seen:
        raise _shared(source, where)
    seen.add(id(entry))


def _shared(source: str, where: str) -> SnapshotError:
    return _fail(source, where, "the same object as an earlier entry (a shared reference in the pickle): torch "
                                "writes each segment, block and event as its own; refused, so a small file cannot "
                                "stand for billions of entries")


def _shown(value: Any) -> str:
    """``value`` for an error message: its repr cut to 60 characters and 3 levels of nesting (a value nested a
    million deep is shown, never a RecursionError), with its type unless it is plain."""
    text = short_repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if value is None or type(value) in (str, int, float, bool) else f"{type(value).__name__} {text}"


_ACTION_SET = frozenset(ACTIONS)


def _require_int(value: Any, source: str, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 1 << 64:
        raise _fail(source, where, f"expected a non-negative int, got {_shown(value)}"
                           + (" (2**64 or more)" if isinstance(value, int) and value >= 1 << 64 else ""))


def _check_entry(entry: Any, source: str, where: str) -> None:
    _require(entry, TRACE_FIELDS, source, where)
    if not isinstance(entry["action"], str) or entry["action"] not in ACTIONS:
        raise _fail(source, f"{where}.action", f"unknown action {_shown(entry['action'])}; expected one of {ACTIONS}")
    if "addr" not in entry and not (entry["action"] == "oom" and "device_free" in entry):
        raise _fail(source, where, "missing required field 'addr'")
    for key in ("size", "addr", "device_free", "stream"):
        if key in entry:
            _require_int(entry[key], source, f"{where}.{key}")
    time_us = entry.get("time_us", 0)
    if not ((type(time_us) is int and 0 <= time_us < 1 << 63)
            or (type(time_us) is float and math.isfinite(time_us) and 0 <= time_us < 2.0 ** 63)):
        raise _fail(source, f"{where}.time_us", f"expected microseconds, a non-negative int under 2**63, got "
                                                f"{_shown(time_us)}")


def read_snapshot(path_or_dict: str | os.PathLike | Mapping[str, Any] | list) -> Snapshot:
    """Load and validate a ``_dump_snapshot`` pickle (or an already-loaded dict). A top-level list is
    ``torch.cuda.memory_snapshot()``'s segment list: read as a snapshot without history
    (``format == "segment_list"``). Keys kvlab does not know warn (:class:`SnapshotKeyWarning`) and are
    ignored.

    The file is read with :func:`load_snapshot_pickle`, which admits plain data only, so a crafted
    pickle cannot run code here. Raises ``FileNotFoundError`` for a missing file and
    :class:`SnapshotError` (a ``ValueError`` and a ``KvlabError``) naming the file and the field for
    anything that does not follow torch's schema, or the refused ``module.name`` for a pickle that
    names a global."""
    if isinstance(path_or_dict, (Mapping, list)):
        return _checked(path_or_dict, "snapshot dict" if isinstance(path_or_dict, Mapping) else "segment list")
    path = Path(path_or_dict)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: snapshot file not found")
    return load_snapshot_pickle(path, then=lambda raw: _checked(raw, str(path)))


def _checked(raw: Any, source: str) -> Snapshot:
    """The snapshot of a loaded object, validated; its unknown keys warned about."""
    raw, kind = _as_snapshot_dict(raw, source)
    _validate(raw, source)
    warn_unknown_keys(raw, source)
    return Snapshot(raw, source, kind)


# ---- recording ----------------------------------------------------------------------------------


def record_snapshot(device) -> dict:
    """The device's allocator state in torch's schema: the model's ``snapshot()`` for a
    ``SimulatedGPU``, ``torch.cuda.memory._snapshot()`` for a ``CudaDevice``."""
    kind = getattr(device, "kind", None)
    if kind == "sim":
        return device.snapshot()
    if kind == "cuda":
        import torch

        return torch.cuda.memory._snapshot(device.index)
    raise TypeError(f"record_snapshot: expected a kvlab SimulatedGPU or CudaDevice, got {type(device).__name__}")


def write_snapshot(device, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Pickle :func:`record_snapshot` to ``path`` (readable by torch's memory_viz)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: exists; pass overwrite=True to replace it")
    snapshot = record_snapshot(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL)
    return path


# ---- the shipped example --------------------------------------------------------------------------

EXAMPLE_DEVICE = "sim:h100-80g"
EXAMPLE_SNAPSHOT = data_path("snapshots", "example.pickle")  # data/README.md


def run_example_script():
    """A short allocation script on a simulated H100 whose trace exercises every replay rule:
    small and large pools, frees, ``empty_cache`` (segment_free), and a reference cycle that
    only ``gc.collect()`` frees. Deterministic: logical clock, bump-pointer addresses, no RNG.
    Returns the device (its allocator state is the snapshot)."""
    import torch

    from kvlab.device import get_device

    device = get_device(EXAMPLE_DEVICE)
    keep = [device.empty((64 * KiB,), torch.uint8), device.empty((300 * KiB + 100,), torch.uint8)]  # small pool
    weights = device.empty((12 * MiB,), torch.uint8)  # large pool, own segment
    scratch = [device.empty((3 * MiB,), torch.uint8) for _ in range(3)]  # one shared 20 MiB segment
    del scratch[1]
    big = device.empty((40 * MiB,), torch.uint8)
    del big
    device.empty_cache()  # the 40 MiB segment goes back to the driver
    # A reference cycle: the tensor dies only when the collector runs.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        cycle: list = [device.empty((5 * MiB,), torch.uint8)]
        cycle.append(cycle)
        del cycle
        gc.collect()
    finally:
        if gc_was_enabled:
            gc.enable()
    keep.append(device.empty((1 * MiB,), torch.uint8))
    del scratch[0]
    device.empty_cache()
    device.check_invariants()
    return device, (keep, weights, scratch)


def make_example_snapshot(path: str | os.PathLike, *, overwrite: bool = True) -> Path:
    """Regenerate ``data/snapshots/example.pickle`` (see data/README.md)."""
    device, alive = run_example_script()
    written = write_snapshot(device, path, overwrite=overwrite)
    del alive
    return written
