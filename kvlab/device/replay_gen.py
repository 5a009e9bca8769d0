"""Generated ``_dump_snapshot`` dicts for testing and timing the replay (tests/device/test_replay*.py,
benchmarks/bench_replay.py).

A seeded random program allocates and frees tensors of mixed sizes (small pool, 1-10 MiB, and large) on
one or more streams through :class:`~kvlab.device.caching_allocator.CachingAllocatorModel` with a
recorder that writes torch's trace entries. Options make the cases a real recording has: frees deferred
on CUDA events (``free_requested`` now, ``free_completed`` some steps later; the block stays unusable
meanwhile), ``empty_cache`` calls, a device small enough to run out of memory (``oom`` entries), expandable
segments, a history that starts mid-run (the first events dropped, as a wrapped ring buffer does), and the
older file formats (no ``time_us``, no ``allocator_settings``, the documented pending-state spelling).

:class:`Generated` also keeps the truth: the generating model's allocated (torch's count, pending frees
excluded) and reserved bytes after every event of the kept trace, and before its first event.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvlab.device.caching_allocator import AllocatorConfig, CachingAllocatorModel, OutOfMemoryError
from kvlab.units import GiB, MiB


class _TraceRecorder:
    def __init__(self, with_time: bool) -> None:
        self.entries: list[dict] = []
        self.with_time = with_time
        self.skip_free_requested = False

    def record(self, action, addr, size, *, stream=0, **_):
        if action == "free_requested" and self.skip_free_requested:
            return
        entry = {"action": action, "device_free" if action == "oom" else "addr": addr, "size": size,
                 "stream": stream, "frames": []}
        if self.with_time:
            entry["time_us"] = 1_700_000_000_000_000 + len(self.entries)
        self.entries.append(entry)


@dataclass
class Generated:
    snapshot: dict
    allocated: list[int] = field(repr=False)  # after each kept event (torch's count: pending excluded)
    reserved: list[int] = field(repr=False)
    initial_allocated: int = 0  # before the first kept event
    initial_reserved: int = 0


def _size(rng: random.Random, large_share: float) -> int:
    r = rng.random()
    if r < 1 - large_share - 0.3:
        return rng.randint(1, 1 * MiB)  # small pool
    if r < 1 - large_share:
        return rng.randint(1 * MiB + 1, 10 * MiB)  # 20 MiB segments, split and unsplit tails
    return rng.randint(10 * MiB, 300 * MiB)


_DEFAULT_CONFIG = AllocatorConfig()  # frozen: safe to share as a default


def generate(n_events: int, *, seed: int = 0, config: AllocatorConfig = _DEFAULT_CONFIG, streams=(0,),
             deferred_fraction: float = 0.0, empty_cache_every: int = 0, total_bytes: int = 80 * GiB,
             live_bytes: int = 8 * GiB, large_share: float = 0.1, drop_first: int = 0, with_time: bool = True,
             with_settings: bool = True, pending_spelling: str = "active_pending_free",
             device_index: int = 0) -> Generated:
    """A snapshot whose kept trace has at least ``n_events`` entries (after dropping ``drop_first``)."""
    rng = random.Random(seed)
    recorder = _TraceRecorder(with_time)
    model = CachingAllocatorModel(total_bytes, config=config, recorder=recorder, device_index=device_index)
    live: list = []
    deferred: list[tuple[int, object]] = []  # (due step, block)
    pending_bytes, allocated, reserved, step = 0, [], [], 0

    def mark():
        while len(allocated) < len(recorder.entries):
            allocated.append(model.memory_allocated() - pending_bytes)
            reserved.append(model.memory_reserved())

    def complete(due: int) -> None:  # CUDA events done: the deferred frees finish now
        nonlocal pending_bytes
        while deferred and deferred[0][0] <= due:
            block = deferred.pop(0)[1]
            pending_bytes -= block.size  # before free(): merging grows the freed block object
            recorder.skip_free_requested = True
            model.free(block)
            recorder.skip_free_requested = False
            mark()

    while len(recorder.entries) < n_events + drop_first:
        step += 1
        complete(step)
        if empty_cache_every and step % empty_cache_every == 0:
            complete(1 << 62)  # torch's empty_cache synchronizes and completes every pending free first
            model.empty_cache()
        elif live and (model.memory_allocated() > live_bytes or rng.random() < 0.48):
            block = live.pop(rng.randrange(len(live)))
            if rng.random() < deferred_fraction:
                recorder.record("free_requested", block.addr, block.requested_size, stream=block.stream)
                pending_bytes += block.size
                deferred.append((step + rng.randint(1, 6), block))
                deferred.sort(key=lambda d: d[0])
            else:
                model.free(block)
        else:
            try:
                live.append(model.malloc(_size(rng, large_share), rng.choice(streams)))
            except OutOfMemoryError:
                mark()
                for _ in range(min(len(live), 3)):
                    model.free(live.pop(rng.randrange(len(live))))
                    mark()
        mark()
    model.recorder = None
    snap = model.snapshot()
    pending = {block.addr for _, block in deferred}
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            if block["address"] in pending:
                block["state"] = pending_spelling
                seg["allocated_size"] -= block["size"]
    snap["device_traces"] = [[] for _ in range(device_index)] + [recorder.entries[drop_first:]]
    if not with_settings:
        del snap["allocator_settings"]
    before = drop_first - 1
    return Generated(snap, allocated[drop_first:], reserved[drop_first:],
                     allocated[before] if before >= 0 else 0, reserved[before] if before >= 0 else 0)

