"""The keys torch's snapshot writers have used, so a key kvlab does not know is *said*, not silently skipped.

``torch/csrc/cuda/memory_snapshot.cpp`` (torch 2.0 to 2.13) writes these; torch 2.0/2.1 blocks carried
``history`` ({addr, real_size, frames}) instead of ``requested_size`` and ``frames``, trace entries got
``time_us`` in 2.1, ``compile_context`` and ``user_metadata`` later, ``pool_id`` later still. A key outside
these lists warns (:class:`SnapshotKeyWarning`, one warning per file naming every unknown key and where it
was found) and is otherwise ignored: a newer torch may add fields, and reading the file must not fail for it.
"""

from __future__ import annotations

import reprlib
import warnings
from collections.abc import Mapping
from typing import Any

from kvlab.safe_text import printable

TOP_KEYS = frozenset({"segments", "device_traces", "allocator_settings", "external_annotations"})
SEGMENT_KEYS = frozenset({
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
    "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks",
})
BLOCK_KEYS = frozenset({"address", "size", "requested_size", "state", "frames", "history"})
TRACE_KEYS = frozenset({
    "action", "addr", "device_free", "size", "stream", "time_us", "frames", "compile_context", "user_metadata",
    "pool_id",
})
SETTINGS_KEYS = frozenset({
    "PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold", "expandable_segments",
    "pinned_num_register_threads", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
    "pinned_use_background_threads", "roundup_power2_divisions", "graph_capture_record_stream_reuse",
    "max_non_split_rounding_size", "last_allocator_settings",
})


class SnapshotKeyWarning(UserWarning):
    """A snapshot carries a key kvlab does not know; the key is ignored."""


def _dict_keys(items: Any) -> set:
    """The union of the keys of the dicts in ``items`` (non-dicts are the validator's business)."""
    keys: set = set()
    for item in items if isinstance(items, list) else ():
        if isinstance(item, Mapping):
            keys.update(item)
    return keys


def unknown_keys(raw: Mapping[str, Any]) -> dict[str, list[str]]:
    """``{where: sorted unknown keys}`` for a snapshot dict (where: ``top level``, ``segments[]``, ...)."""
    found: dict[str, set] = {"top level": set(raw) - TOP_KEYS}
    segments = raw.get("segments")
    found["segments[]"] = _dict_keys(segments) - SEGMENT_KEYS
    blocks: set = set()
    for seg in segments if isinstance(segments, list) else ():
        if isinstance(seg, Mapping):
            blocks |= _dict_keys(seg.get("blocks"))
    found["segments[].blocks[]"] = blocks - BLOCK_KEYS
    trace_keys: set = set()
    traces = raw.get("device_traces")
    for trace in traces if isinstance(traces, list) else ():
        if isinstance(trace, list) and trace and all(type(e) is dict for e in trace):
            trace_keys |= set().union(*trace)  # one C-level pass; a million entries take ~0.1 s
        else:
            trace_keys |= _dict_keys(trace)
    found["device_traces[][]"] = trace_keys - TRACE_KEYS
    settings = raw.get("allocator_settings")
    found["allocator_settings"] = set(settings) - SETTINGS_KEYS if isinstance(settings, Mapping) else set()
    return {where: sorted(map(_key_text, keys)) for where, keys in found.items() if keys}


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 60, 60


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to 3 levels of nesting and about 60 characters a string: a value nested a million deep
    is shown, never a RecursionError."""
    return _SHORT.repr(value)


def _key_text(key: Any) -> str:
    """A key as the warning shows it: a str as it is, anything else (a tuple nested a million deep) cut short."""
    return key if isinstance(key, str) else short_repr(key)


def warn_unknown_keys(raw: Mapping[str, Any], source: str) -> dict[str, list[str]]:
    """Warn once naming every unknown key of ``raw`` and where it sits; returns them."""
    found = unknown_keys(raw)
    if found:
        listed = "; ".join(f"{where}: {', '.join(map(printable, keys))}" for where, keys in found.items())
        warnings.warn(f"{source}: ignoring keys kvlab does not know ({listed}); a newer torch may write them",
                      SnapshotKeyWarning, stacklevel=3)
    return found
