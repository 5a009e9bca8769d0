"""One Mooncake trace record (a JSONL line: ``timestamp``, ``input_length``, ``output_length``, ``hash_ids``), the
error a bad one raises, and a trace's shape (:func:`trace_stats`). The format is described in
``kvlab.workloads.mooncake``, which reads and writes it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvlab.errors import KvlabError

MOONCAKE_BLOCK_SIZE = 512  # tokens per hash id in the published traces


class TraceFormatError(KvlabError, ValueError):
    """A trace line (or record) that is not a valid Mooncake record, or a trace file with no record at all;
    the message starts ``<where>: `` (``trace.jsonl:7`` for a file line, ``trace.jsonl`` for the whole file,
    ``records[3]`` for an in-memory record)."""

    def __init__(self, where: str, message: str, field: str | None = None):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.field = field


@dataclass(frozen=True)
class MooncakeRecord:
    """One trace line. ``timestamp_ms`` is the JSON ``timestamp``; the other names are the JSON keys."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple

    def to_dict(self) -> dict:
        return {"timestamp": self.timestamp_ms, "input_length": self.input_length,
                "output_length": self.output_length, "hash_ids": list(self.hash_ids)}

    def to_json(self) -> str:
        """The line as the published traces spell it (``json.dumps`` defaults: ``", "`` and ``": "``)."""
        return json.dumps(self.to_dict())


def check_block_size(block_size: Any) -> None:
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1 (tokens per hash id), got {block_size!r}")


# ---------------------------------------------------------------------------------------------------------
# describing


class TraceStats(NamedTuple):
    """Shape of a trace. ``ideal_hit_rate``: prompt tokens an infinite prefix cache with page size
    ``block_size`` would hit if it cached every prompt (whole blocks only, longest cached prefix), over all
    prompt tokens: the ceiling for ``kvlab simulate --trace ... --page-size 512``."""

    num_requests: int
    duration_s: float
    mean_input_len: float
    max_input_len: int
    mean_output_len: float
    unique_blocks: int
    total_blocks: int
    ideal_hit_rate: float


def trace_stats(records: Sequence[MooncakeRecord], *, block_size: int = MOONCAKE_BLOCK_SIZE) -> TraceStats:
    recs = sorted(records, key=lambda r: r.timestamp_ms)
    n = len(recs)
    if n == 0:
        return TraceStats(0, 0.0, 0.0, 0, 0.0, 0, 0, 0.0)
    trie: dict = {}  # (parent node, hash id) -> node: the full blocks cached so far, as prefix paths
    hit = total = 0
    for r in recs:
        node, matching = -1, True
        for _j, h in enumerate(r.hash_ids[: r.input_length // block_size]):
            child = trie.get((node, h))
            if child is None:
                matching = False
                child = trie[(node, h)] = len(trie)
            elif matching:
                hit += block_size
            node = child
        total += r.input_length
    return TraceStats(
        num_requests=n,
        duration_s=(recs[-1].timestamp_ms - recs[0].timestamp_ms) / 1000,
        mean_input_len=total / n,
        max_input_len=max(r.input_length for r in recs),
        mean_output_len=sum(r.output_length for r in recs) / n,
        unique_blocks=len({h for r in recs for h in r.hash_ids}),
        total_blocks=sum(len(r.hash_ids) for r in recs),
        ideal_hit_rate=hit / total,
    )
