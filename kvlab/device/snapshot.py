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

This module is the model (:class:`Snapshot`) and :func:`read_snapshot`; the file is loaded by
``kvlab.device.snapshot_pickle`` (plain data only, no code run) and checked by ``kvlab.device.snapshot_schema``.
"""

from __future__ import annotations

import gc
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.device.caching_allocator import round_size
from kvlab.device.snapshot_keys import SnapshotKeyWarning as SnapshotKeyWarning  # re-exported
from kvlab.device.snapshot_keys import warn_unknown_keys
from kvlab.device.snapshot_pickle import PICKLE_OBJECTS_FLOOR as PICKLE_OBJECTS_FLOOR  # re-exported
from kvlab.device.snapshot_pickle import PICKLE_OBJECTS_PER_BYTE as PICKLE_OBJECTS_PER_BYTE  # re-exported
from kvlab.device.snapshot_pickle import load_snapshot_pickle as load_snapshot_pickle  # re-exported
from kvlab.device.snapshot_schema import BLOCK_FIELDS as BLOCK_FIELDS  # re-exported
from kvlab.device.snapshot_schema import BLOCK_STATES as BLOCK_STATES  # re-exported
from kvlab.device.snapshot_schema import SEGMENT_FIELDS as SEGMENT_FIELDS  # re-exported
from kvlab.device.snapshot_schema import SEGMENT_TYPES as SEGMENT_TYPES  # re-exported
from kvlab.device.snapshot_schema import STATE_NAMES as STATE_NAMES  # re-exported
from kvlab.device.snapshot_schema import TRACE_FIELDS as TRACE_FIELDS  # re-exported
from kvlab.device.snapshot_schema import SnapshotError as SnapshotError  # re-exported
from kvlab.device.snapshot_schema import as_snapshot_dict, validate_snapshot
from kvlab.device.snapshot_schema import normalise_state as normalise_state  # re-exported
from kvlab.paths import data_path
from kvlab.units import KiB, MiB

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
    raw, kind = as_snapshot_dict(raw, source)
    validate_snapshot(raw, source)
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
