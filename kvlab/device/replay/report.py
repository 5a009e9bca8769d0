"""The fidelity report of a snapshot replay: model vs recording, event by event and at the end.

Checks (each a boolean in :attr:`ReplayResult.checks`):

- ``segment_allocs_equal``: every ``segment_alloc``/``segment_map`` the model made has the recorded
  address and size, and the model made no other;
- ``block_addresses_equal``: every allocation got the recorded block address;
- ``segment_frees_equal``: every ``empty_cache`` released the recorded segments (or pages), no more;
- ``ooms_equal``: the model ran out of memory at every recorded ``oom`` event;
- ``reserved_over_time_equal``: reserved bytes equal after every alloc and free event;
- ``final_segments_equal``: the final segments, their blocks and which blocks are live equal ``segments``;
- ``final_reserved_equal`` / ``final_allocated_equal``: torch's ``memory_reserved()`` and
  ``memory_allocated()`` at the end.

Allocated bytes over time are the model's: the trace records requests, not block sizes, so no recording
says them; with every check above true they are torch's numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvlab.device.caching_allocator import AllocatorConfig, CachingAllocatorModel
from kvlab.device.replay.seed import PENDING_STATES, Seed, segment_blocks
from kvlab.units import fmt_bytes


class WhatIfRow(Protocol):
    """What the report shows of a what-if (:class:`kvlab.device.replay.whatif.WhatIf` is one): the report
    sits below the what-ifs and does not import them."""

    label: str
    peak_reserved_bytes: int
    final_reserved_bytes: int
    peak_fragmentation_bytes: int
    cuda_malloc_calls: int
    oom_at_capacity: bool | None
    oom_event: int | None
    caveats: list[str]

    @property
    def exact(self) -> bool: ...

    def to_json(self) -> dict: ...

OP_ALLOC, OP_FREE_REQUESTED, OP_FREE, OP_EMPTY = range(4)  # the compiled stream's op codes
CHECKS = ("segment_allocs_equal", "block_addresses_equal", "segment_frees_equal", "ooms_equal",
          "reserved_over_time_equal", "final_segments_equal", "final_reserved_equal", "final_allocated_equal")
_CHECK_OF = {"segment_alloc": "segment_allocs_equal", "block_address": "block_addresses_equal",
             "alloc": "block_addresses_equal", "segment_free": "segment_frees_equal", "oom": "ooms_equal",
             "reserved": "reserved_over_time_equal", "final_segments": "final_segments_equal",
             "final_reserved": "final_reserved_equal", "final_allocated": "final_allocated_equal",
             "stopped": "final_segments_equal"}
KEPT_DIVERGENCES = 20


@dataclass(frozen=True)
class Divergence:
    index: int  # the device trace's event index (len(trace) for the final state)
    kind: str
    recorded: Any
    modelled: Any

    def describe(self) -> str:
        def shown(v):
            return f"{v:#x}" if isinstance(v, int) and v > 1 << 32 else (f"{v:,}" if isinstance(v, int) else str(v))
        return f"event {self.index}: {self.kind}: recorded {shown(self.recorded)}, modelled {shown(self.modelled)}"


def _event_line(i: int, e: dict) -> str:
    addr = e.get("addr", e.get("device_free", 0))
    return f"[{i}] {e['action']:<15} {addr:#x} {e['size']:>14,} B  stream {e.get('stream', 0)}"


@dataclass
class ReplayResult:
    source: str
    device: int
    settings: AllocatorConfig
    seed: Seed
    notes: list[str]
    trace: list[dict] = field(repr=False)
    has_history: bool = True
    divergences: list[Divergence] = field(default_factory=list)
    divergence_counts: Counter = field(default_factory=Counter)
    recorded_reserved: list[int] = field(default_factory=list, repr=False)
    modelled_reserved: list[int] = field(default_factory=list, repr=False)
    modelled_allocated: list[int] = field(default_factory=list, repr=False)
    recorded_cuda_mallocs: int = 0
    recorded_ooms: int = 0
    modelled_ooms: int = 0
    ops: list[tuple] = field(default_factory=list, repr=False)
    model: CachingAllocatorModel | None = field(default=None, repr=False)
    final: dict = field(default_factory=dict)

    def diverge(self, d: Divergence) -> None:
        self.divergence_counts[d.kind] += 1
        if len(self.divergences) < KEPT_DIVERGENCES:
            self.divergences.append(d)

    def finish(self, model, segments: list, pending: dict, ops: list) -> None:
        self.model, self.ops = model, ops
        reserved, allocated, layout = recorded_final(segments)
        snap = model.snapshot()
        mine = sorted((s["address"], s["total_size"], tuple(
            (b["address"], b["size"], b["state"] != "inactive") for b in s["blocks"])) for s in snap["segments"])
        n = len(self.trace)
        if mine != layout:
            first = next((r, m) for r, m in zip(layout + [None] * len(mine), mine + [None] * len(layout)) if r != m)
            self.diverge(Divergence(n, "final_segments", _seg(first[0]), _seg(first[1])))
        allocated_now = model.memory_allocated() - sum(pending.values())
        if model.memory_reserved() != reserved:
            self.diverge(Divergence(n, "final_reserved", reserved, model.memory_reserved()))
        if allocated_now != allocated:
            self.diverge(Divergence(n, "final_allocated", allocated, allocated_now))
        self.final = {"recorded_reserved_bytes": reserved, "recorded_allocated_bytes": allocated,
                      "modelled_reserved_bytes": model.memory_reserved(), "modelled_allocated_bytes": allocated_now}

    # ---- the verdict ---------------------------------------------------------------------------
    @property
    def events_replayed(self) -> int:
        return len(self.trace)

    @property
    def checks(self) -> dict[str, bool | None]:
        """Each check's verdict; all None when there is no history to check against."""
        failed = {_CHECK_OF[kind] for kind in self.divergence_counts}
        return {c: (c not in failed if self.has_history else None) for c in CHECKS}

    @property
    def exact(self) -> bool:
        return self.has_history and not self.divergence_counts

    @property
    def first_divergence(self) -> Divergence | None:
        return min(self.divergences, key=lambda d: d.index) if self.divergences else None

    def context(self, d: Divergence, before: int = 4, after: int = 2) -> list[str]:
        lo, hi = max(0, d.index - before), min(len(self.trace), d.index + after + 1)
        return [("→ " if i == d.index else "  ") + _event_line(i, self.trace[i]) for i in range(lo, hi)]

    @property
    def recorded_peak_reserved_bytes(self) -> int:
        return max([self.seed.reserved_bytes, self.final.get("recorded_reserved_bytes", 0), *self.recorded_reserved])

    @property
    def peak_event(self) -> int:
        """The first event after which the modelled reserved bytes are highest (-1: none replayed)."""
        res = self.modelled_reserved
        return res.index(max(res)) if res else -1

    def banner(self) -> str:
        """One line of Markdown: the verdict."""
        if not self.has_history:
            return (f"**No history** in `{self.source}`: segment map and fragmentation only (record with "
                    "`torch.cuda.memory._record_memory_history()` to replay it).")
        if self.exact:
            return (f"**Exact.** kvlab's allocator model replays all {self.events_replayed:,} events of "
                    f"`{self.source}` (device {self.device}) and reproduces every segment, block address, release "
                    "and the final reserved and allocated bytes: all 8 checks hold.")
        first = self.first_divergence
        failed = [name for name, ok in self.checks.items() if not ok]
        return (f"**Diverges** from `{self.source}` at {first.describe()}; {len(failed)} of 8 checks fail "
                f"({', '.join(failed)}).")

    @property
    def event_counts(self) -> Counter:
        return Counter(e["action"] for e in self.trace)

    def timeline(self):
        """One row per event: recorded and modelled reserved bytes, modelled allocated bytes, and whether
        a divergence was found at that event (among the first kept)."""
        import pandas as pd

        at = {d.index for d in self.divergences}
        trace = self.trace
        return pd.DataFrame({
            "step": range(len(trace)), "action": [e["action"] for e in trace],
            "addr": [e.get("addr", e.get("device_free", 0)) for e in trace], "size": [e["size"] for e in trace],
            "recorded_reserved_bytes": self.recorded_reserved, "modelled_reserved_bytes": self.modelled_reserved,
            "modelled_allocated_bytes": self.modelled_allocated, "diverged": [i in at for i in range(len(trace))],
        })

    # ---- output ----------------------------------------------------------------------------------
    def to_json(self, what_ifs: Sequence[WhatIfRow] = ()) -> dict:
        first = self.first_divergence
        return {
            "source": self.source, "device": self.device, "events_replayed": self.events_replayed,
            "history": "none (a segment list or an empty trace: segment map and fragmentation only)"
            if not self.has_history else ("starts mid-run" if self.seed.segments else "starts from an empty allocator"),
            "fidelity": {
                **self.checks, "exact": self.exact if self.has_history else None,
                "first_divergence": None if first is None else {
                    "index": first.index, "kind": first.kind, "recorded": str(first.recorded),
                    "modelled": str(first.modelled), "context": self.context(first)},
                "divergences": dict(self.divergence_counts),
            },
            "recorded": {"peak_reserved_bytes": self.recorded_peak_reserved_bytes,
                         "final_reserved_bytes": self.final.get("recorded_reserved_bytes"),
                         "final_allocated_bytes": self.final.get("recorded_allocated_bytes"),
                         "cuda_malloc_calls": self.recorded_cuda_mallocs, "ooms": self.recorded_ooms},
            "seed": {"segments": len(self.seed.segments), "live_blocks": len(self.seed.blocks),
                     "reserved_bytes": self.seed.reserved_bytes, "allocated_bytes": self.seed.allocated_bytes,
                     "unsplit_tail_bytes": sum(b.tail_bytes for b in self.seed.blocks),
                     "ambiguous_blocks": self.seed.ambiguous_blocks},
            "what_if": [w.to_json() for w in what_ifs],
            "notes": self.notes,
        }

    def text(self, what_ifs: Sequence[WhatIfRow] = ()) -> str:
        counts = self.event_counts
        lines = [f"replay · {self.source} · device {self.device} · {self.events_replayed:,} events "
                 f"({', '.join(f'{counts[a]:,} {a}' for a in sorted(counts))})"]
        if not self.has_history:
            lines.append("  no history in this snapshot: segment map and fragmentation only (record with "
                         "torch.cuda.memory._record_memory_history() and _dump_snapshot() to replay)")
        elif self.exact:
            lines.append("  EXACT: the model reproduces every segment allocation and address, every block address, "
                         "every release, and the final reserved and allocated bytes")
        else:
            first = self.first_divergence
            lines.append(f"  DIVERGES: {sum(self.divergence_counts.values()):,} differences "
                         f"({', '.join(f'{n:,} {k}' for k, n in sorted(self.divergence_counts.items()))}); "
                         f"first at {first.describe()}")
            lines += ["    " + line for line in self.context(first)]
        if self.has_history:
            lines += [f"  {name:<26} {'yes' if ok else 'NO'}" for name, ok in self.checks.items()]
        f = self.final
        lines.append(f"  recorded: peak reserved {fmt_bytes(self.recorded_peak_reserved_bytes)}, final reserved "
                     f"{fmt_bytes(f.get('recorded_reserved_bytes', 0))}, allocated "
                     f"{fmt_bytes(f.get('recorded_allocated_bytes', 0))} (cached: reserved but unallocated "
                     f"{fmt_bytes(f.get('recorded_reserved_bytes', 0) - f.get('recorded_allocated_bytes', 0))}), "
                     f"{self.recorded_cuda_mallocs:,} cudaMalloc calls; modelled peak allocated "
                     f"{fmt_bytes(max(self.modelled_allocated, default=self.seed.allocated_bytes))}")
        if what_ifs:
            head = ("what-if", "peak reserved", "final reserved", "peak cached", "cudaMallocs", "OOM at capacity",
                    "answer")
            caveats: list[str] = []  # numbered once each, in order of first use
            rows = []
            def mark(caveat: str) -> str:
                if caveat not in caveats:
                    caveats.append(caveat)
                return f"[{caveats.index(caveat) + 1}]"

            for w in what_ifs:
                marks = [mark(caveat) for caveat in w.caveats]
                oom = "—" if w.oom_at_capacity is None else (f"yes, at event {w.oom_event}" if w.oom_at_capacity
                                                            else "no")
                if w.oom_at_capacity is False and w.capacity_bytes and w.peak_reserved_bytes > w.capacity_bytes:
                    oom += " " + mark(RETRY_CAVEAT.format(capacity=fmt_bytes(w.capacity_bytes)))
                rows.append((w.label, fmt_bytes(w.peak_reserved_bytes), fmt_bytes(w.final_reserved_bytes),
                             fmt_bytes(w.peak_fragmentation_bytes), f"{w.cuda_malloc_calls:,}", oom,
                             "exact" if w.exact else "estimate " + "".join(marks)))
            widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
            for row in [head, *rows]:
                lines.append("  " + "  ".join(c.ljust(w) if i in (0, len(row) - 1) else c.rjust(w)
                                              for i, (c, w) in enumerate(zip(row, widths))).rstrip())
            lines += [f"  [{k}] {caveat}" for k, caveat in enumerate(caveats, 1)]
            lines.append(f"  {CACHED_WORDS}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


CACHED_WORDS = ("peak cached = reserved − allocated: free blocks the allocator keeps for reuse; only the part no "
                "request can use (too small, or in a segment a live block pins) is fragmentation")
RETRY_CAVEAT = ("peak reserved is above the {capacity} capacity without a limit; at the capacity a failed cudaMalloc "
                "makes the allocator free its cached blocks and retry, and that was enough: no OOM")


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


def _seg(row) -> str:
    if row is None:
        return "no segment"
    addr, size, blocks = row
    return f"segment {addr:#x} of {size:,} B with {len(blocks)} blocks ({sum(live for _, _, live in blocks)} live)"
