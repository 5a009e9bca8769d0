"""A guided tour of PyTorch's CUDA caching allocator: the six allocation scripts of notebook
``00_caching_allocator_tour`` (the lab steps around them, with predictions, ``check()`` and solutions, are
``kvlab.labs.allocator_tour``).

Every step runs on a fresh device built from a name: ``"sim:h200"`` (kvlab's model,
``kvlab.device.caching_allocator``) or ``"cuda"`` (torch's own allocator, one per process, so a step
starts by releasing the cache and measures from that baseline). After each action the step keeps a
:class:`StepState`: the allocator snapshot in torch's ``_snapshot()`` schema plus allocated/reserved
bytes, so ``kvlab.viz.allocator_map`` can draw memory_viz's "Allocator State History".

The steps, and the allocator rule each one isolates (docs/semantics.md#pytorch-cuda-caching-allocator):

====================  =====================================================================
``rounding``          every request rounds up to a multiple of 512 B (``round_size``)
``pools``             <= 1 MiB: small pool, 2 MiB segments; above: large pool, 20 MiB segments
                      (< 10 MiB requests) or the request rounded to 2 MiB (``get_allocation_size``)
``splitting``         a segment is split into blocks; one live block pins its whole segment
``fragmentation``     the same bytes in another order reserve different memory
``gc_cycle``          a reference cycle keeps a block allocated until ``gc.collect()``
``expandable``        ``expandable_segments:True`` grows one segment instead of adding new ones
====================  =====================================================================
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd
import torch

from kvlab.device import Device, get_device, resolve_device_name
from kvlab.device.caching_allocator import AllocatorConfig
from kvlab.device.measure import automatic_gc_paused
from kvlab.device.snapshot import read_snapshot, record_snapshot
from kvlab.units import KiB, MiB

# ---- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepState:
    """The allocator right after one action of a step (bytes are relative to the step's start)."""

    label: str
    snapshot: dict  # torch's _snapshot() schema (kvlab.device.snapshot.record_snapshot)
    allocated_bytes: int
    reserved_bytes: int
    timeline_index: int = 0  # row of StepRun.timeline at this state (its marker event)


@dataclass(frozen=True)
class StepRun:
    """One run of a step: its states in order, the event timeline and the facts a check compares."""

    key: str
    device_name: str
    device_kind: str  # "sim" | "cuda"
    states: tuple[StepState, ...]
    # device.timeline() rows (allocated/reserved/free after each event) + "arm" and "step" (the
    # label of the state each event leads to)
    timeline: pd.DataFrame
    facts: dict[str, int] = field(default_factory=dict)
    focus: int | None = None  # the state the step is about (its facts are read there); None = last
    view_bytes: int | None = None  # how much of each segment a map should show (None: all of it)

    @property
    def focus_index(self) -> int:
        return len(self.states) - 1 if self.focus is None else self.focus

    def blocks_frame(self, state: int | None = None) -> pd.DataFrame:
        """The blocks of one state (default: the focus state): segment and block address (hex),
        requested size, block size (what ``memory_allocated()`` counts) and state."""
        index = self.focus_index if state is None else state
        frame = read_snapshot(self.states[index].snapshot).blocks_frame()
        return pd.DataFrame({
            "segment": [f"{a:#x}" for a in frame["segment_address"]],
            "address": [f"{a:#x}" for a in frame["address"]],
            "requested_size": frame["requested_size"], "size": frame["size"], "state": frame["state"],
        })

    def facts_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"value": self.facts})



# ---- devices ------------------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_device(name: str | None = None, *, expandable_segments: bool = False) -> Iterator[Device]:
    """A device with an empty cache for one step (or one arm of it).

    Simulated: a new model with the requested ``AllocatorConfig``. CUDA: torch's process-wide
    allocator, emptied, with ``expandable_segments`` switched through torch's (private)
    ``_set_allocator_settings`` for the duration and switched off afterwards."""
    resolved = resolve_device_name(name)
    if resolved.startswith("sim:"):
        yield get_device(resolved, allocator_config=AllocatorConfig(expandable_segments=expandable_segments))
        return
    device = get_device(resolved)
    if expandable_segments:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        gc.collect()
        device.empty_cache()
        yield device
    finally:
        if expandable_segments:
            device.empty_cache()
            torch.cuda.memory._set_allocator_settings("expandable_segments:False")


class _Recorder:
    """Collects the states of one step; bytes are measured from the device's reading at the start
    (0 on a fresh model, whatever else the process holds on a real GPU)."""

    def __init__(self, key: str, device_name: str | None) -> None:
        self.key, self.device_name = key, resolve_device_name(device_name)
        self.device_kind = "sim"
        self.states: list[StepState] = []
        self.frames: list[pd.DataFrame] = []
        self.facts: dict[str, int] = {}
        self._device: Device | None = None
        self._arm = ""
        self._base = (0, 0)
        self._base_segments: set[int] = set()
        self._offset = 0  # timeline rows of the arms already finished
        self._marks: dict[int, str] = {}
        self.focus: int | None = None
        self.view_bytes: int | None = None

    @contextlib.contextmanager
    def arm(self, label: str = "", *, expandable_segments: bool = False) -> Iterator[Device]:
        with fresh_device(self.device_name, expandable_segments=expandable_segments) as device:
            self._device, self._arm, self.device_kind = device, label, device.kind
            self._base = (device.memory_allocated(), device.memory_reserved())
            # Segments that exist before the arm (other tensors of the process, on a real GPU) are
            # left out of its maps and counts.
            self._base_segments = {seg["address"] for seg in record_snapshot(device)["segments"]}
            self._marks = {}
            try:
                yield device
            finally:
                frame = device.timeline()
                if self._marks:  # leave out the clean-up after the arm's last state
                    frame = frame.iloc[: max(self._marks) + 1].copy()
                frame["allocated_bytes"] -= self._base[0]
                frame["reserved_bytes"] -= self._base[1]
                frame["arm"] = label
                frame["step"] = pd.Series(self._marks, dtype=object).reindex(frame.index).bfill()
                frame["step"] = frame["step"].fillna(self.states[-1].label if self.states else "")
                self._offset += len(frame)
                self.frames.append(frame)

    def allocated(self) -> int:
        return self._device.memory_allocated() - self._base[0]

    def reserved(self) -> int:
        return self._device.memory_reserved() - self._base[1]

    def snap(self, label: str, *, focus: bool = False) -> StepState:
        device = self._device
        device.check_invariants()
        label = f"{self._arm} · {label}" if self._arm else label
        device.mark(label)
        index = len(device.recorder.events) - 1
        self._marks[index] = label
        snapshot = record_snapshot(device)
        if self._base_segments:
            snapshot = {**snapshot, "segments": [s for s in snapshot["segments"]
                                                 if s["address"] not in self._base_segments]}
        state = StepState(label, snapshot, self.allocated(), self.reserved(), self._offset + index)
        self.states.append(state)
        if focus:
            self.focus = len(self.states) - 1
        return state

    def result(self) -> StepRun:
        timeline = pd.concat(self.frames, ignore_index=True) if self.frames else pd.DataFrame()
        return StepRun(self.key, self.device_name, self.device_kind, tuple(self.states), timeline, dict(self.facts),
                       self.focus, self.view_bytes)


def _u8(device: Device, nbytes: int, label: str) -> torch.Tensor:
    return device.empty((nbytes,), torch.uint8, label=label)


def segment_counts(snapshot: dict) -> dict[str, int]:
    """Segments per pool ("small", "large") in a snapshot (an expandable segment counts once)."""
    segments = read_snapshot(snapshot).segments_frame()
    # torch lists one entry per mapped range of an expandable segment; there is one such segment
    # per (pool, stream)
    expandable = segments[segments["is_expandable"]].drop_duplicates(subset=["segment_type", "stream"])
    counts = pd.concat([segments[~segments["is_expandable"]], expandable])["segment_type"].value_counts()
    return {pool: int(counts.get(pool, 0)) for pool in ("small", "large")}


def largest_free_block_bytes(snapshot: dict) -> int:
    blocks = read_snapshot(snapshot).blocks_frame()
    free = blocks.loc[blocks["state"] == "inactive", "size"]
    return int(free.max()) if len(free) else 0


# ---- the six scripts ----------------------------------------------------------------------------

ROUNDING_REQUESTS_BYTES = (1, 512, 513, 1000, 4097)
ROUNDING_VIEW_BYTES = 8 * KiB  # the five blocks sit in the first 7.5 KiB of their 2 MiB segment
POOLS_REQUESTS_BYTES = {"a": 1 * MiB, "b": 1 * MiB + 1, "c": 300 * KiB, "d": 25 * MiB}
SPLIT_BIG_BYTES, SPLIT_PIN_BYTES = 8 * MiB, 2 * MiB
FRAGMENTATION_ORDERS_BYTES = {"ascending": (2 * MiB, 4 * MiB, 14 * MiB), "descending": (14 * MiB, 4 * MiB, 2 * MiB)}
CYCLE_BYTES = 40 * MiB
GROWING_REQUESTS_BYTES = (30 * MiB, 32 * MiB, 34 * MiB)


def _fmt_request(nbytes: int) -> str:
    if nbytes >= MiB and nbytes % MiB == 0:
        return f"{nbytes // MiB} MiB"
    if nbytes >= MiB:
        return f"{nbytes // MiB} MiB + {nbytes % MiB} B"
    if nbytes >= KiB and nbytes % KiB == 0:
        return f"{nbytes // KiB} KiB"
    return f"{nbytes} B"


def run_rounding(device_name: str | None = None) -> StepRun:
    """Five tiny requests; each block is the request rounded up to 512 B, all in one small segment."""
    rec = _Recorder("rounding", device_name)
    rec.view_bytes = ROUNDING_VIEW_BYTES
    with rec.arm() as device:
        live = []
        for nbytes in ROUNDING_REQUESTS_BYTES:
            live.append(_u8(device, nbytes, f"{nbytes} B"))
            rec.snap(f"alloc {_fmt_request(nbytes)}")
        rec.facts = {"allocated_bytes": rec.allocated(), "reserved_bytes": rec.reserved()}
        del live
    return rec.result()


def run_pools(device_name: str | None = None) -> StepRun:
    """1 MiB (small), 1 MiB + 1 B (large: 20 MiB segment), 300 KiB (small, same segment), 25 MiB
    (large: does not fit the 20 MiB segment's rest, gets its own 26 MiB segment)."""
    rec = _Recorder("pools", device_name)
    with rec.arm() as device:
        live = {}
        for name, nbytes in POOLS_REQUESTS_BYTES.items():
            live[name] = _u8(device, nbytes, name)
            state = rec.snap(f"alloc {name} = {_fmt_request(nbytes)}")
        counts = segment_counts(state.snapshot)
        rec.facts = {"small_segments": counts["small"], "large_segments": counts["large"],
                     "reserved_bytes": rec.reserved()}
        del live
    return rec.result()


def run_splitting(device_name: str | None = None) -> StepRun:
    """8 MiB then 2 MiB share one 20 MiB segment (split twice); free the 8 MiB one; empty_cache
    releases nothing while the 2 MiB block lives; only after it dies does the segment go back."""
    rec = _Recorder("splitting", device_name)
    with rec.arm() as device:
        big = _u8(device, SPLIT_BIG_BYTES, "big")
        rec.snap("alloc big = 8 MiB")
        pin = _u8(device, SPLIT_PIN_BYTES, "pin")
        rec.snap("alloc pin = 2 MiB")
        del big
        rec.snap("del big")
        device.empty_cache()
        state = rec.snap("empty_cache() (pin alive)", focus=True)
        rec.facts = {"reserved_bytes": rec.reserved(),
                     "largest_free_block_bytes": largest_free_block_bytes(state.snapshot)}
        del pin
        rec.snap("del pin")
        device.empty_cache()
        rec.snap("empty_cache()")
        rec.facts["reserved_after_release_bytes"] = rec.reserved()
    return rec.result()


def run_fragmentation(device_name: str | None = None, *, expandable_segments: bool = False) -> StepRun:
    """2 + 4 + 14 MiB ascending and descending, each order on an empty cache."""
    rec = _Recorder("fragmentation", device_name)
    for order, sizes in FRAGMENTATION_ORDERS_BYTES.items():
        with rec.arm(order, expandable_segments=expandable_segments) as device:
            live = []
            for nbytes in sizes:
                live.append(_u8(device, nbytes, _fmt_request(nbytes)))
                rec.snap(f"alloc {_fmt_request(nbytes)}")
            rec.facts[f"reserved_{order}_bytes"] = rec.reserved()
            rec.facts[f"allocated_{order}_bytes"] = rec.allocated()
            del live
    return rec.result()


class LoaderScratch:
    """Temporaries that point back at themselves, as a weight loader's often do (a closure, a
    parent link): the object is garbage as soon as its last name goes, but only the cyclic garbage
    collector can free it, and with it its device tensor."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.myself = self  # the reference cycle


def run_gc_cycle(device_name: str | None = None) -> StepRun:
    """A 40 MiB buffer inside a :class:`LoaderScratch` cycle: ``del``, ``empty_cache()`` (nothing
    released: the block is still allocated), a real ``gc.collect()`` (the cycle goes, the storage
    dies, its finalizer frees the block), ``empty_cache()`` (the segment goes back).

    Automatic collection is off for the step so that nothing but the explicit ``gc.collect()`` can
    free the cycle (the same numbers on every run); it is switched back on afterwards."""
    rec = _Recorder("gc_cycle", device_name)
    with rec.arm() as device:
        with automatic_gc_paused():
            scratch = LoaderScratch(_u8(device, CYCLE_BYTES, "scratch"))
            rec.snap("scratch = LoaderScratch(40 MiB)")
            del scratch
            rec.snap("del scratch")
            device.empty_cache()
            rec.snap("empty_cache()", focus=True)
            rec.facts = {"allocated_before_gc_bytes": rec.allocated(), "reserved_before_gc_bytes": rec.reserved()}
            gc.collect()
            rec.snap("gc.collect()")
            rec.facts["allocated_after_gc_bytes"] = rec.allocated()
            device.empty_cache()
            rec.snap("empty_cache()")
            rec.facts["reserved_after_gc_bytes"] = rec.reserved()
    return rec.result()


def run_expandable(device_name: str | None = None) -> StepRun:
    """A buffer that grows (30, 32, 34 MiB; each freed before the next, like a growing batch),
    with ``expandable_segments`` off and on."""
    rec = _Recorder("expandable", device_name)
    for on in (False, True):
        arm = f"expandable {'on' if on else 'off'}"
        with rec.arm(arm, expandable_segments=on) as device:
            buffer = None
            for nbytes in GROWING_REQUESTS_BYTES:
                buffer = None  # free the old buffer first
                buffer = _u8(device, nbytes, _fmt_request(nbytes))
                rec.snap(f"buffer = {_fmt_request(nbytes)}")
            rec.facts[f"reserved_{'on' if on else 'off'}_bytes"] = rec.reserved()
            del buffer
    return rec.result()


def summary_frame(runs: list[StepRun]) -> pd.DataFrame:
    """One row per measured fact of each run: step, fact, value, and the value in MiB for bytes."""
    rows = [
        {"step": run.key, "fact": name, "value": value,
         "MiB": value / MiB if name.endswith("_bytes") else None, "device": run.device_name}
        for run in runs
        for name, value in run.facts.items()
    ]
    return pd.DataFrame(rows, columns=["step", "fact", "value", "MiB", "device"])
