"""What-ifs: the recorded alloc/free stream replayed under other allocator settings.

The stream is what the fidelity replay compiled (``ReplayResult.ops``): every ``malloc`` with its request
and stream, every free (deferred ones stay unusable until their ``free_completed``), and an
``empty_cache`` wherever the recording released segments. Under other settings the program would have
asked for the same tensors in the same order, so replaying that stream through a model with the new
settings answers: peak and final reserved bytes, fragmentation (reserved − allocated) over time, how
many cudaMalloc calls (torch's ``num_device_alloc``: segment allocations and, with expandable segments,
page mappings), and whether it would have run out on a device of ``capacity`` bytes (the driver's
total; the CUDA context and other processes are not subtracted).

When the history starts mid-run, the blocks live at its first event are part of every what-if's starting
state (the trace frees them): under the recorded settings the model adopts the segments exactly as the
fidelity replay rebuilt them; under other settings those blocks are allocated first, in address order
(their real order is not recorded), and the row's :attr:`WhatIf.caveats` say the start is an estimate.
A row is never an exception: whatever the model cannot take ends the run there, and its caveats say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from kvlab.device.caching_allocator import AllocatorConfig, CachingAllocatorModel, OutOfMemoryError
from kvlab.device.replay.fidelity import replay_snapshot
from kvlab.device.replay.report import OP_ALLOC, OP_FREE, OP_FREE_REQUESTED, ReplayResult
from kvlab.device.replay.seed import Seed
from kvlab.device.replay.settings import parse_size, parse_what_if, settings_json
from kvlab.device.snapshot import Snapshot
from kvlab.errors import InvariantError, KvlabError

UNLIMITED_BYTES = 1 << 50

@dataclass
class WhatIf:
    label: str
    config: AllocatorConfig
    peak_reserved_bytes: int = 0
    final_reserved_bytes: int = 0
    final_allocated_bytes: int = 0
    cuda_malloc_calls: int = 0
    peak_fragmentation_bytes: int = 0
    capacity_bytes: int | None = None
    oom_at_capacity: bool | None = None
    oom_event: int | None = None  # trace index of the first allocation that would not fit (-1: before the trace)
    oom_message: str | None = None
    # why this row is not an exact answer (empty: exact): a guessed starting state, a stream cut short, ...
    caveats: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list, repr=False)  # trace index of each point (-1: the seed)
    reserved: list[int] = field(default_factory=list, repr=False)
    allocated: list[int] = field(default_factory=list, repr=False)

    @property
    def exact(self) -> bool:
        """The row follows from the recorded stream with nothing guessed (see :attr:`caveats`)."""
        return not self.caveats

    def to_json(self) -> dict:
        return {"label": self.label, "settings": settings_json(self.config),
                "peak_reserved_bytes": self.peak_reserved_bytes, "final_reserved_bytes": self.final_reserved_bytes,
                "final_allocated_bytes": self.final_allocated_bytes, "cuda_malloc_calls": self.cuda_malloc_calls,
                "peak_fragmentation_bytes": self.peak_fragmentation_bytes, "capacity_bytes": self.capacity_bytes,
                "oom_at_capacity": self.oom_at_capacity, "oom_event": self.oom_event, "exact": self.exact,
                "caveats": list(self.caveats)}

    def frame(self):
        import pandas as pd

        return pd.DataFrame({"step": self.steps, "reserved_bytes": self.reserved, "allocated_bytes": self.allocated,
                             "fragmentation_bytes": [r - a for r, a in zip(self.reserved, self.allocated)]})


class StreamStopped(Exception):
    """The model could not take one op of the stream (not an OOM): ``op_index`` and the cause."""

    def __init__(self, op_index: int, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.op_index = op_index


class _Driver:
    """Drives a model with the compiled stream, keeping which recorded address holds which model block
    across calls (the seed's blocks are freed inside the history)."""

    def __init__(self, model: CachingAllocatorModel, what: WhatIf | None) -> None:
        self.model, self.what = model, what
        self.blocks: dict[int, Any] = {}
        self.pending: dict[int, int] = {}
        self.pending_bytes = 0
        self.unknown_frees = 0

    def adopt(self, start: Seed) -> None:
        """Start from the state at the first event exactly: the seed's segments and blocks as they were."""
        for seg in start.segments:
            adopted = self.model.adopt_segment(seg.addr, seg.pool, seg.stream, seg.layout,
                                               is_expandable=seg.is_expandable)
            for block, sb in zip(adopted, seg.blocks):
                self.blocks[sb.addr] = block
                if sb.pending:
                    self.pending[sb.addr] = block.size
                    self.pending_bytes += block.size
        self.point(-1)

    def point(self, step: int) -> None:
        if self.what is not None:
            self.what.steps.append(step)
            self.what.reserved.append(self.model.memory_reserved())
            self.what.allocated.append(self.model.memory_allocated() - self.pending_bytes)

    def run(self, ops: list[tuple], first: int = 0) -> None:
        """Run ``ops[first:]``; an OOM is re-raised with ``.op_index``, anything else the model refuses
        raises :class:`StreamStopped`."""
        model, blocks, pending = self.model, self.blocks, self.pending
        for k in range(first, len(ops)):
            op = ops[k]
            code = op[0]
            try:
                if code == OP_ALLOC:
                    blocks[op[1]] = model.malloc(op[2], op[3])
                elif code == OP_FREE:
                    block = blocks.pop(op[1], None)
                    if block is None:
                        self.unknown_frees += 1
                    else:
                        self.pending_bytes -= pending.pop(op[1], 0)
                        model.free(block)
                elif code == OP_FREE_REQUESTED:
                    block = blocks.get(op[1])
                    if block is None:
                        self.unknown_frees += 1
                    else:
                        pending[op[1]] = block.size
                        self.pending_bytes += block.size
                else:
                    model.empty_cache()
            except OutOfMemoryError as exc:
                exc.op_index = k  # type: ignore[attr-defined]
                raise
            except (KvlabError, InvariantError, ValueError, KeyError, TypeError) as exc:
                raise StreamStopped(k, exc) from exc
            if self.what is not None:
                self.point(op[-1])


def _first_traced(ops: list[tuple]) -> int:
    """Index of the first op of the trace itself (the ops before it allocate the seed's blocks)."""
    return next((k for k, op in enumerate(ops) if op[-1] >= 0), len(ops))


def _start(model: CachingAllocatorModel, ops: list[tuple], what: WhatIf | None, start: Seed | None) -> _Driver:
    """A driver whose model holds the state at the first event: ``start``'s segments adopted as they
    were, or (no ``start``) the seed's blocks allocated in address order under the model's settings."""
    driver = _Driver(model, what)
    if start is not None:
        try:
            driver.adopt(start)
        except (KvlabError, InvariantError, ValueError) as exc:
            raise StreamStopped(0, exc) from exc
    else:
        driver.run(ops[:_first_traced(ops)])
    return driver


def run_what_if(ops: list[tuple], config: AllocatorConfig, *, label: str, capacity: int | None = None,
                start: Seed | None = None, caveats: list[str] | tuple[str, ...] = ()) -> WhatIf:
    """Replay ``ops`` under ``config``: peak/final reserved, fragmentation, cudaMalloc calls; with
    ``capacity``, also whether (and where) a device of that many bytes would have run out.

    A history that starts mid-run begins with ops (step -1) that allocate the blocks live at its first
    event. With ``start`` (the seed, for the recorded settings) the model instead adopts the segments as
    they were, which is exact; without it those blocks are allocated in address order under ``config``
    (their real order and the frees before the history are unknown) and the row says it is an estimate.
    Never raises for the stream's sake: an op the model cannot take ends the run there, and the row's
    :attr:`WhatIf.caveats` say where and why."""
    what = WhatIf(label, config, capacity_bytes=capacity, caveats=list(caveats))
    traced = _first_traced(ops)
    seeded = sum(op[0] == OP_ALLOC for op in ops[:traced])
    if seeded and start is None:
        what.caveats.append(f"the history starts mid-run: the {seeded} blocks live at its first event were "
                            "allocated in address order under these settings (their real order and what was freed "
                            "before the history are not recorded), so the starting state is an estimate")
    model = CachingAllocatorModel(UNLIMITED_BYTES, config=config)
    before = 0
    try:
        driver = _start(model, ops, what, start)
        before = model.memory_stats()["num_device_alloc"]
        driver.run(ops, traced)
    except (StreamStopped, OutOfMemoryError) as exc:
        k = exc.op_index  # type: ignore[attr-defined]
        step = ops[k][-1] if k < len(ops) else -1
        what.caveats.append(f"the model could not take the stream at event {step} ({exc}): the numbers cover the "
                            "events before it")
        driver = None
    if driver is not None and driver.unknown_frees:
        what.caveats.append(f"{driver.unknown_frees} frees name a block this run does not hold (left out)")
    what.peak_reserved_bytes = max(what.reserved, default=0)
    what.final_reserved_bytes = model.memory_reserved()
    what.final_allocated_bytes = what.allocated[-1] if what.allocated else 0
    what.cuda_malloc_calls = model.memory_stats()["num_device_alloc"] - before  # inside the history only
    what.peak_fragmentation_bytes = max((r - a for r, a in zip(what.reserved, what.allocated)), default=0)
    if capacity is not None:
        # No cudaMalloc failed without a limit: if the peak fits, the capacity run is the same run.
        what.oom_at_capacity = False
        if what.peak_reserved_bytes > capacity:
            _at_capacity(what, ops, config, capacity, start)
    return what


def _at_capacity(what: WhatIf, ops: list[tuple], config: AllocatorConfig, capacity: int, start: Seed | None) -> None:
    if start is not None and start.reserved_bytes > capacity:
        what.oom_at_capacity, what.oom_event = True, -1
        what.oom_message = (f"the state at the first event already reserves {start.reserved_bytes:,} B, more than "
                            f"the capacity of {capacity:,} B")
        return
    try:
        driver = _start(CachingAllocatorModel(capacity, config=config), ops, None, start)
        driver.run(ops, _first_traced(ops))
    except OutOfMemoryError as exc:
        what.oom_at_capacity, what.oom_event = True, ops[exc.op_index][-1]  # type: ignore[attr-defined]
        what.oom_message = str(exc)
    except StreamStopped as exc:
        what.oom_at_capacity = None
        what.caveats.append(f"at the capacity the model could not take the stream at event {ops[exc.op_index][-1]} "
                            f"({exc}): whether it runs out is not known")


DEFAULT_WHAT_IFS = ("expandable_segments=True",)


def replay_with_what_ifs(path: str | os.PathLike | Snapshot, device: int | None = None, what_ifs=None,
                         capacity: int | str | None = None, device_memory: int | str | None = None):
    """What ``kvlab replay`` runs: the fidelity replay, then the recorded stream under the recorded
    settings (the model's baseline) and under each what-if (``KEY=VALUE[,...]``; default
    ``expandable_segments=True``). Returns ``(ReplayResult, [WhatIf, ...])``; no what-ifs without history."""
    capacity = parse_size(capacity) if isinstance(capacity, str) else capacity
    device_memory = parse_size(device_memory) if isinstance(device_memory, str) else device_memory
    for text in what_ifs or ():  # a bad what-if is named before the replay runs (its values do not need the settings)
        parse_what_if(text, AllocatorConfig())
    result = replay_snapshot(path, device, device_memory=device_memory)
    configs = [(text, parse_what_if(text, result.settings)) for text in (what_ifs or DEFAULT_WHAT_IFS)]
    if not result.has_history:
        result.notes.append("what-ifs need a trace: none run")
        return result, []
    caveats = what_if_caveats(result)
    start = result.seed if result.seed.segments else None
    runs = [run_what_if(result.ops, result.settings, label="as recorded (modelled)", capacity=capacity, start=start,
                        caveats=caveats)]
    runs += [run_what_if(result.ops, config, label=text, capacity=capacity, caveats=caveats,
                         start=start if config == result.settings else None) for text, config in configs]
    if result.seed.segments:
        result.notes.append(f"the history starts mid-run: the what-ifs under the recorded settings start from the "
                            f"state at its first event ({len(result.seed.blocks)} live blocks in "
                            f"{len(result.seed.segments)} segments); the others allocate those blocks first, in "
                            "address order, under their own settings")
    return result, runs


def what_if_caveats(result: ReplayResult) -> list[str]:
    """What every what-if of ``result`` inherits from the fidelity replay: a stream cut short, blocks
    whose frees were left out."""
    caveats = []
    if "stopped" in result.divergence_counts:
        caveats.append(f"the fidelity replay stopped at event {len(result.trace):,}: the stream ends there")
    if result.seed.orphans:
        caveats.append(f"{len(result.seed.orphans)} blocks live at the first event lie in no segment kvlab could "
                       "rebuild: they and their frees are left out")
    return caveats
