"""The allocator model's state as a ``torch.cuda.memory._snapshot()`` dict.

Two upstream steps, kept apart here as there: ``DeviceCachingAllocator::snapshot`` in
``c10/cuda/CUDACachingAllocator.cpp`` lists the segments, one per contiguous mapped range of an
expandable segment (:meth:`SnapshotExport.snapshot`'s loop), and ``torch/csrc/cuda/memory_snapshot.cpp::
_memory_snapshot_pickled`` turns them into dicts (its ``segmentInfoToDict`` is :func:`_segment_info`,
``traceEntryToDict`` is :func:`_trace`, and the ``allocator_settings`` entry is
:func:`_allocator_settings`). :mod:`kvlab.device.snapshot` reads the result back like a real
``_dump_snapshot`` pickle.

Where kvlab differs on purpose: no stack frames (every ``frames`` list is empty), no CUDA graph
pools (``segment_pool_id`` is always ``(0, 0)``) and no pending frees (``active_size`` equals
``allocated_size``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvlab.device.caching_allocator.blocks import Block, Segment
    from kvlab.device.caching_allocator.config import AllocatorConfig
    from kvlab.device.events import EventRecorder


class SnapshotExport:
    """The ``snapshot`` method of :class:`~kvlab.device.caching_allocator.CachingAllocatorModel` (a mixin); it
    reads only the allocator's public ``segments``, ``device_index``, ``recorder`` and ``config``."""

    segments: list[Segment]
    device_index: int
    recorder: EventRecorder | None
    config: AllocatorConfig

    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()``: segments (one per contiguous mapped range, as torch
        reports expandable segments), this device's trace from the recorder, and the settings."""
        segments = []
        for segment in self.segments:
            run: list[Block] = []
            for block in segment.iter_all_blocks():
                if block.mapped:
                    run.append(block)
                elif run:
                    segments.append(_segment_info(self.device_index, segment, run))
                    run = []
            if run:
                segments.append(_segment_info(self.device_index, segment, run))
        return {
            "segments": segments,
            "device_traces": [_trace(self.recorder, self.device_index)],
            "allocator_settings": _allocator_settings(self.config),
            "external_annotations": [],
        }


def _trace(recorder: EventRecorder | None, device_index: int) -> list[dict]:
    trace = []
    if recorder is not None:
        for event in recorder.events:
            if event.device != device_index:
                continue
            entry = {"action": event.action}
            entry["device_free" if event.action == "oom" else "addr"] = event.addr
            entry.update(size=event.size, stream=event.stream, time_us=event.time_us, frames=[])
            trace.append(entry)
    return trace


def _allocator_settings(config: AllocatorConfig) -> dict:
    return {
        "PYTORCH_CUDA_ALLOC_CONF": config.to_env(),
        "max_split_size": config.max_split_size_bytes or -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": config.expandable_segments,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "roundup_power2_divisions": {str(1 << i): config.roundup_power2_divisions or 0 for i in range(16)},
    }


def _segment_info(device_index: int, segment: Segment, run: list[Block]) -> dict:
    blocks = [
        {
            "address": b.addr,
            "size": b.size,
            "requested_size": b.requested_size,
            "state": "active_allocated" if b.allocated else "inactive",
            "frames": [],
        }
        for b in run
    ]
    allocated = sum(b.size for b in run if b.allocated)
    return {
        "device": device_index,
        "address": run[0].addr,
        "total_size": sum(b.size for b in run),
        "allocated_size": allocated,
        "active_size": allocated,  # no pending frees without CUDA events
        "requested_size": sum(b.requested_size for b in run if b.allocated),
        "stream": segment.stream,
        "segment_type": segment.pool,
        "segment_pool_id": (0, 0),
        "is_expandable": segment.is_expandable,
        "frames": [],
        "blocks": blocks,
    }
