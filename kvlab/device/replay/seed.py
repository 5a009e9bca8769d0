"""The allocator's state at the first event of a recorded history, rebuilt exactly from ``segments``.

A snapshot's trace is a ring buffer: it may begin after segments were made and blocks handed out.
Undoing the trace backwards from the final ``segments`` gives, at the first event, every segment that
existed and the address of every live block. The size of a live block is in ``segments`` when it is
still live at the end; a block freed inside the history left only its *request* in the trace.

Its size follows from torch's split rule (docs/semantics.md#picking-and-splitting-a-block): the allocator
carves ``round_size(request)`` off the front of a cached block and keeps the rest as a free block, except in
the large pool when the rest would be 1 MiB or less (``should_split``), where it hands out the whole block.
So in a non-expandable large segment every block, free or live, is larger than 1 MiB, and a live block whose
rounded request ends 1 MiB or less before the next boundary (the next live block, or the segment's end)
holds that tail too: no free block could sit there. Summing ``round_size`` alone undercounts those tails
(the old ``Snapshot.replay`` did). A block in a segment of ``max_split_size`` or more is never split: it is
the whole segment. Small-pool and expandable blocks split at 512 B, so their size is always the rounded
request. When more than 1 MiB of free space follows (the neighbour after an unsplit block was freed later),
the trace may still tell: allocations are carved from the front of a free block, so an allocation at ``Y``
while the block is live, with ``Y`` at most 1 MiB past its rounded end, means the block ends at ``Y`` (no
large-pool block fits in between). Without such evidence the block is taken as split and counted in
:attr:`Seed.ambiguous_blocks`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvlab.device.caching_allocator import (
    LARGE_BUFFER_BYTES,
    SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
    AllocatorConfig,
    round_size,
)
from kvlab.units import div_ceil

UNBOUNDED_SPACE_BYTES = 1 << 46  # an expandable segment's address space when the device's size is unknown
PENDING_STATES = frozenset({"active_pending_free", "active_awaiting_free"})


def segment_blocks(seg: Mapping[str, Any]) -> Iterator[tuple[int, int, int, str]]:
    """``(address, size, requested_size, state)`` of a segment's blocks in address order. Old snapshots
    without block addresses get them by summing sizes from the segment start, and those without
    ``requested_size`` take it from ``history[0].real_size`` (torch 2.0), as memory_viz does."""
    addr = seg["address"]
    for block in seg["blocks"]:
        addr = block.get("address", addr)
        requested = block.get("requested_size")
        if requested is None:
            history = block.get("history") or [{}]
            requested = history[0].get("real_size", block["size"]) if isinstance(history[0], Mapping) else 0
        yield addr, block["size"], requested, block["state"]
        addr += block["size"]


@dataclass
class SeedBlock:
    addr: int
    size: int
    requested: int
    stream: int
    pending: bool  # its free was requested before the history began and completes inside it
    inferred: bool = False  # freed inside the history: size inferred from its request and neighbours
    tail_bytes: int = 0  # bytes it holds beyond round_size(request): an unsplit tail


@dataclass
class SeedSegment:
    addr: int
    size: int  # bytes mapped (reserved) at the start
    pool: str
    stream: int
    is_expandable: bool
    space_bytes: int = 0  # address space: ``size`` for a cudaMalloc segment
    ranges: list[list[int]] = field(default_factory=list)  # mapped [start, end) ranges at the start
    blocks: list[SeedBlock] = field(default_factory=list)
    layout: list[tuple[int, int, str]] = field(default_factory=list)  # (size, requested, state) tiles


@dataclass
class Seed:
    segments: list[SeedSegment]
    orphans: list[SeedBlock]  # live at the start but inside no known segment
    ambiguous_blocks: int
    notes: list[str]

    @property
    def blocks(self) -> list[SeedBlock]:
        return [b for s in self.segments for b in s.blocks]

    @property
    def reserved_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def allocated_bytes(self) -> int:
        """torch's ``memory_allocated()`` at the start: live blocks, pending frees excluded."""
        return sum(b.size for b in self.blocks if not b.pending)

    @property
    def block_sizes(self) -> dict[int, int]:
        return {b.addr: b.size for b in self.blocks}


def _subtract(ranges: list[list], addr: int, size: int) -> None:
    """Remove ``[addr, addr + size)`` from a list of ``[start, end, pool, stream]`` ranges."""
    end, out = addr + size, []
    for start, stop, pool, stream in ranges:
        if stop <= addr or start >= end:
            out.append([start, stop, pool, stream])
            continue
        if start < addr:
            out.append([start, addr, pool, stream])
        if stop > end:
            out.append([end, stop, pool, stream])
    ranges[:] = out


def _pool_of_range(start: int, stop: int, stream: int, known: list[list], trace: list[dict], space: int) -> str | None:
    """The pool of an expandable range the trace unmapped: a block allocated or freed inside it says
    (its request's pool), else the nearest range of known pool on the same stream below it (one
    segment's pages lie above its base) no more than a segment's address space ``space`` away."""
    for e in trace:
        if e["action"] in ("alloc", "free_completed") and start <= e["addr"] < stop:
            return "small" if round_size(e["size"]) <= SMALL_SIZE_BYTES else "large"
    if (stop - start) % LARGE_BUFFER_BYTES:  # a large segment maps whole 20 MiB pages
        return "small"
    below = [(k_start, pool) for k_start, _, pool, k_stream in known
             if k_stream == stream and k_start <= start < k_start + space]
    above = [(k_start, pool) for k_start, _, pool, k_stream in known
             if k_stream == stream and start < k_start < start + space]
    return max(below)[1] if below else (min(above)[1] if above else None)


def _space_bytes(device_bytes: int | None, page: int) -> int:
    """An expandable segment's address space: 1 1/8 of the device in whole pages (torch's
    ``ExpandableSegment``); unbounded when the device's size is unknown."""
    return div_ceil(device_bytes + device_bytes // 8, page) * page if device_bytes else UNBOUNDED_SPACE_BYTES


def _final_state(segments: list[Mapping]) -> tuple[dict[int, list], dict[int, tuple], list[list]]:
    """From the final segments: the live blocks (addr -> [size, requested, stream, pending]), the whole
    segments (addr -> (size, pool, stream)) and the expandable mapped ranges ([start, end, pool, stream])."""
    live: dict[int, list] = {}
    whole: dict[int, tuple[int, str, int]] = {}
    mapped: list[list] = []
    for seg in segments:
        if seg.get("is_expandable"):
            mapped.append([seg["address"], seg["address"] + seg["total_size"], seg["segment_type"], seg["stream"]])
        else:
            whole[seg["address"]] = (seg["total_size"], seg["segment_type"], seg["stream"])
        for addr, size, requested, state in segment_blocks(seg):
            if state != "inactive":
                live[addr] = [size, requested, seg["stream"], state in PENDING_STATES]
    return live, whole, mapped


def _rewind(trace: list[Mapping], live: dict[int, list], whole: dict[int, tuple], mapped: list[list]) -> int:
    """Undo the trace, last event first, on the final state; the number of allocs it does not explain."""
    unmatched = 0
    for e in reversed(trace):
        action = e["action"]
        if action == "alloc":
            unmatched += live.pop(e["addr"], None) is None
        elif action == "free_completed":
            live[e["addr"]] = [None, e["size"], e.get("stream", 0), True]
        elif action == "free_requested":
            entry = live.get(e["addr"])
            if entry is not None:
                entry[3] = False
        elif action == "segment_alloc":
            whole.pop(e["addr"], None)
        elif action == "segment_free":
            size = e["size"]
            whole[e["addr"]] = (size, "small" if size == SMALL_BUFFER_BYTES else "large", e.get("stream", 0))
        elif action == "segment_map":
            _subtract(mapped, e["addr"], e["size"])
        elif action == "segment_unmap":
            mapped.append([e["addr"], e["addr"] + e["size"], None, e.get("stream", 0)])
    return unmatched


def _place_blocks(live: dict[int, list], seed_segments: list[SeedSegment]) -> list[SeedBlock]:
    """Put each live block into the segment it lies in (sorted by address); return those in none."""
    starts = [s.addr for s in seed_segments]
    orphans = []
    for addr in sorted(live):
        size, requested, stream, pending = live[addr]
        block = SeedBlock(addr, size if size is not None else 0, requested, stream, pending, inferred=size is None)
        i = bisect_right(starts, addr) - 1
        seg = seed_segments[i] if i >= 0 else None
        if seg is not None and addr < seg.addr + seg.space_bytes:
            seg.blocks.append(block)
        else:
            orphans.append(block)
    return orphans


def infer_seed(segments: list[Mapping], trace: list[Mapping], config: AllocatorConfig, *,
               device_bytes: int | None = None, tails: Mapping[int, int] | None = None) -> Seed:
    """The state before ``trace[0]`` given the final ``segments`` of the same device (default pool).
    ``device_bytes`` is the device's total memory: an expandable segment's address space is 1 1/8 of it
    (rounded up to its pages, as torch's ``ExpandableSegment``); unknown (None), the last segment's space
    is taken as unbounded. ``tails`` gives the least tail of an otherwise ambiguous block (learned by
    kvlab.device.replay.fidelity)."""
    notes: list[str] = []
    live, whole, mapped = _final_state(segments)
    final_mapped = [list(r) for r in mapped]
    unmatched = _rewind(trace, live, whole, mapped)
    if unmatched:
        notes.append(f"{unmatched} alloc events name an address the final state does not explain")

    seed_segments = [SeedSegment(a, s, p, st, False, s, [[a, a + s]]) for a, (s, p, st) in whole.items()]
    seed_segments += _expandable_segments(mapped, final_mapped, trace, notes, device_bytes)
    seed_segments.sort(key=lambda s: s.addr)
    orphans = _place_blocks(live, seed_segments)
    if orphans:
        notes.append(f"{len(orphans)} blocks live at the start lie in no segment kvlab could rebuild; their frees "
                     "are skipped")
    ends = _evidence(trace, seed_segments, config)
    ambiguous = sum(_lay_out(seg, config, notes, ends, tails or {}) for seg in seed_segments)
    return Seed(seed_segments, orphans, ambiguous, notes)


def _evidence(trace: list[Mapping], segments: list[SeedSegment], config: AllocatorConfig) -> dict[int, int]:
    """``{block address: end}`` for inferred large-pool blocks whose end an allocation inside the trace
    pins down: an ``alloc`` at ``Y``, made while the block is still live, with
    ``rounded end < Y <= rounded end + 1 MiB``."""
    windows = sorted((b.addr + round_size(b.requested, config.roundup_power2_divisions), b.addr)
                     for s in segments if s.pool == "large" and not s.is_expandable for b in s.blocks if b.inferred)
    if not windows:
        return {}
    starts = [w[0] for w in windows]
    alive = {addr for _, addr in windows}
    ends: dict[int, int] = {}
    for e in trace:
        action = e["action"]
        if action == "free_completed" and e["addr"] in alive:
            alive.discard(e["addr"])  # freed: later allocations there say nothing about it
        elif action == "alloc":
            i = bisect_right(starts, e["addr"] - 1) - 1
            if i >= 0:
                rounded_end, addr = windows[i]
                if addr in alive and rounded_end < e["addr"] <= rounded_end + SMALL_SIZE_BYTES:
                    ends.setdefault(addr, e["addr"])
        if not alive:
            break
    return ends


def _map_owners(trace: list[dict]) -> list[tuple[int, tuple]]:
    """(address, (pool, stream)) of each ``segment_map`` in the trace: the pool of the allocation it precedes."""
    maps: list[tuple[int, tuple]] = []
    pending: list[int] = []
    for e in trace:
        if e["action"] == "segment_map":
            pending.append(e["addr"])
        elif e["action"] == "alloc" and pending:
            key = ("small" if round_size(e["size"]) <= SMALL_SIZE_BYTES else "large", e.get("stream", 0))
            maps += [(addr, key) for addr in pending]
            pending = []
    return maps


def _group_ranges(mapped: list[list], final: list[list], trace: list[dict], notes: list[str],
                  device_bytes: int | None) -> list[list]:
    """The mapped ranges in address order, consecutive ones of one (pool, stream) grouped: [key, ranges] each."""
    instances: list[list] = []  # [key, ranges]
    widest = _space_bytes(device_bytes, LARGE_BUFFER_BYTES)
    for start, stop, pool, stream in sorted(mapped):
        pool = pool or _pool_of_range(start, stop, stream, final, trace, widest)
        if pool is None:
            pool = "large"
            notes.append(f"expandable range {start:#x}+{stop - start} at the start: pool unknown, taken as large")
        if instances and instances[-1][0] == (pool, stream):
            ranges = instances[-1][1]
            if ranges[-1][1] == start:
                ranges[-1][1] = stop
            else:
                ranges.append([start, stop])
        else:
            instances.append([(pool, stream), [[start, stop]]])
    return instances


def _page_bytes(pool: str) -> int:
    """An expandable segment's page size in ``pool``."""
    return SMALL_BUFFER_BYTES if pool == "small" else LARGE_BUFFER_BYTES


def _split_off(ranges: list[list], base: int, end: int, page: int) -> list[list]:
    """Cut from ``ranges`` (a segment based at ``base``, its space ending at ``end``) the pages that belong to
    another segment of the same pool, and return them ([] if none)."""
    cut = next((j for j, (start, stop) in enumerate(ranges)
                if stop > end or (start - base) % page or (stop - base) % page), None)
    if cut is None:
        return []
    start, stop = ranges[cut]
    if (start - base) % page or start >= end:
        rest = ranges[cut:]
        del ranges[cut:]
    elif stop > end:  # a range running past the end: split it there
        rest = [[end, stop]] + ranges[cut + 1:]
        ranges[cut][1] = end
        del ranges[cut + 1:]
    else:  # ends inside a page: the pages after it start another segment
        rest = ranges[cut + 1:]
        del ranges[cut + 1:]
    return rest


def _segment_bases(instances: list[list], maps: list[tuple[int, tuple]], device_bytes: int | None) -> list[int]:
    """Each group's base address, splitting off (into ``instances``) the pages past a full segment's space."""
    bases = []
    k = 0
    while k < len(instances):  # instances may grow: a full segment's mapped pages run on into the next one's
        key, ranges = instances[k]
        page = _page_bytes(key[0])
        space = _space_bytes(device_bytes, page)
        floor = instances[k - 1][1][-1][1] if k else 0
        base = min([a for a, owner in maps if owner == key and floor <= a < ranges[0][0]] + [ranges[0][0]])
        if ranges[0][0] >= base + space or (ranges[0][0] - base) % page:  # that mapping is another segment's
            base = ranges[0][0]
        rest = _split_off(ranges, base, base + space, page)
        if rest:
            instances.insert(k + 1, [key, rest])
        bases.append(base)
        k += 1
    return bases


def _expandable_segments(mapped: list[list], final: list[list], trace: list[dict], notes: list[str],
                         device_bytes: int | None) -> list[SeedSegment]:
    """The mapped ranges at the start as expandable segments. Segments do not interleave, so consecutive
    ranges of one (pool, stream) in address order are one segment. It is based at the lowest address it
    maps at the start or inside the trace below that (a ``segment_map`` belongs to the pool of the
    allocation it precedes); its address space runs to the next segment's base, and is at most 1 1/8 of
    ``device_bytes`` (rounded up to whole pages; unknown: unbounded)."""
    instances = _group_ranges(mapped, final, trace, notes, device_bytes)
    bases = _segment_bases(instances, _map_owners(trace), device_bytes)
    out = []
    for k, (key, ranges) in enumerate(instances):
        base, page = bases[k], _page_bytes(key[0])
        space = _space_bytes(device_bytes, page)
        limit = min(bases[k + 1], base + space) if k + 1 < len(bases) else base + space
        end = base + (limit - base) // page * page
        out.append(SeedSegment(base, sum(b - a for a, b in ranges), key[0], key[1], True, end - base, ranges))
    return out


def _lay_out(seg: SeedSegment, config: AllocatorConfig, notes: list[str], ends: dict[int, int],
            tails: Mapping[int, int]) -> int:
    """Size the inferred blocks of ``seg`` and tile it into (size, requested, state) pieces; returns how
    many inferred blocks stay ambiguous (a possible tail followed by more than 1 MiB free)."""
    divisions = config.roundup_power2_divisions
    max_split = config.effective_max_split_size_bytes
    ranges, seg_end = seg.ranges, seg.addr + seg.space_bytes
    blocks, ambiguous = seg.blocks, 0
    for i, b in enumerate(blocks):
        boundary = next((stop for start, stop in ranges if start <= b.addr < stop), seg_end)
        if i + 1 < len(blocks):
            boundary = min(boundary, blocks[i + 1].addr)
        if not b.inferred:
            if b.addr + b.size > boundary:
                notes.append(f"live block {b.addr:#x}+{b.size} overlaps the next boundary {boundary:#x}")
            continue
        rounded = round_size(b.requested, divisions)
        gap = boundary - (b.addr + rounded)
        if seg.pool == "large" and not seg.is_expandable:
            if seg.size >= max_split or 0 < gap <= SMALL_SIZE_BYTES:
                rounded, gap = boundary - b.addr, 0
            elif b.addr in ends and ends[b.addr] <= boundary:
                rounded, gap = ends[b.addr] - b.addr, 0
            elif gap > SMALL_SIZE_BYTES:
                ambiguous += 1
                if b.addr in tails and gap - tails[b.addr] > SMALL_SIZE_BYTES:
                    rounded, gap = rounded + tails[b.addr], gap - tails[b.addr]
        if gap < 0:
            notes.append(f"block {b.addr:#x} (request {b.requested} B) does not fit before {boundary:#x}; clamped")
            rounded = boundary - b.addr
        b.tail_bytes = rounded - round_size(b.requested, divisions)
        b.size = rounded
    # tile: live blocks, free gaps inside mapped ranges, unmapped gaps between them
    tiles: list[tuple[int, int, str]] = []
    cursor = seg.addr
    marks = [(b.addr, b) for b in blocks]
    for start, stop in ranges:
        if start > cursor:
            tiles.append((start - cursor, 0, "unmapped"))
            cursor = start
        for addr, b in marks:
            if start <= addr < stop:
                if addr > cursor:
                    tiles.append((addr - cursor, 0, "free"))
                tiles.append((b.size, b.requested, "allocated"))
                cursor = addr + b.size
        if stop > cursor:
            tiles.append((stop - cursor, 0, "free"))
            cursor = stop
    if seg_end > cursor:
        tiles.append((seg_end - cursor, 0, "unmapped"))
    seg.layout = tiles
    return ambiguous
