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


def _final_snapshot(model: CachingAllocatorModel, trace: list, deferred: list[tuple[int, object]],
                    pending_spelling: str, device_index: int, with_settings: bool) -> dict:
    """The model's snapshot at the end, its deferred frees shown pending and ``trace`` as the device's trace."""
    model.recorder = None
    snap = model.snapshot()
    pending = {block.addr for _, block in deferred}
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            if block["address"] in pending:
                block["state"] = pending_spelling
                seg["allocated_size"] -= block["size"]
    snap["device_traces"] = [[] for _ in range(device_index)] + [trace]
    if not with_settings:
        del snap["allocator_settings"]
    return snap


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
    snap = _final_snapshot(model, recorder.entries[drop_first:], deferred, pending_spelling, device_index,
                           with_settings)
    before = drop_first - 1
    return Generated(snap, allocated[drop_first:], reserved[drop_first:],
                     allocated[before] if before >= 0 else 0, reserved[before] if before >= 0 else 0)



# ---- a corpus that looks like the wild ----------------------------------------------------------------

FORMATS = ("torch2.6", "no_time", "no_settings", "awaiting_spelling", "no_block_addresses", "torch2.0_history",
           "oom_free_in_addr")


@dataclass
class Case:
    """One generated snapshot of the corpus, the options that made it, and what its truth guarantees."""

    seed: int
    options: dict
    format: str
    made: Generated
    device_bytes: int  # the generating device's total memory
    near_limit: bool
    exact_expected: bool  # the fidelity replay must be exact (see :func:`exactness`)
    why_not: str = ""  # when not expected: which option leaves the replay without what it needs

    @property
    def snapshot(self) -> dict:
        return self.made.snapshot


def exactness(options: dict, fmt: str, near_limit: bool) -> tuple[bool, str]:
    """Whether the replay must reproduce a case exactly, from the generator's own options, and if not why.

    Exact by construction: every option of :func:`generate` (streams, deferred frees, ``empty_cache``, OOMs,
    ``max_split_size``, ``roundup_power2_divisions``, expandable segments, a history that starts mid-run) and
    every format variant, except:

    - a snapshot without ``allocator_settings`` whose run used other settings than torch's defaults (the
      replay cannot know them; torch < 2.5 did not record them), except expandable segments alone (the
      segments say so);
    - expandable segments with a history that starts mid-run: which segment (and pool) a range mapped
      before the history and unmapped inside it belonged to is not recorded, and is guessed from its
      neighbours and the device's size; near the device's limit a segment may also fill its address space
      (benchmarks/count_replay_expandable.py measures that case; the long corpus run found two such cases
      away from the limit diverging too);
    - a history that starts mid-run whose older blocks' unsplit tails the trace leaves ambiguous is exact
      only as far as the allocator's choices reveal them: those cases are not promised either (large pool,
      not expandable, mid-run).
    """
    config: AllocatorConfig = options["config"]
    if fmt == "no_settings" and config not in (AllocatorConfig(), AllocatorConfig(expandable_segments=True)):
        return False, "allocator_settings dropped from a run with non-default settings"
    mid_run = options["drop_first"] > 0
    if config.expandable_segments and mid_run:
        return False, "expandable segments with a mid-run history" + (", near the device's limit" if near_limit else "")
    if mid_run and not config.expandable_segments:
        return False, "mid-run history: older blocks' unsplit tails may be ambiguous"
    return True, ""


def _reformat(snap: dict, fmt: str) -> None:
    """Rewrite a torch 2.6-style snapshot dict in place into one of the older (or partial) formats."""
    traces = snap["device_traces"]
    if fmt in ("no_time", "torch2.0_history"):
        for trace in traces:
            for e in trace:
                e.pop("time_us", None)
    if fmt in ("no_settings", "torch2.0_history"):
        snap.pop("allocator_settings", None)
    if fmt == "no_block_addresses":
        for seg in snap["segments"]:
            for block in seg["blocks"]:
                block.pop("address", None)
    if fmt == "torch2.0_history":
        for seg in snap["segments"]:
            seg.pop("is_expandable", None)
            for block in seg["blocks"]:
                addr, requested = block.pop("address", seg["address"]), block.pop("requested_size", 0)
                if block["state"] != "inactive":
                    block["history"] = [{"addr": addr, "real_size": requested, "frames": []}]
    if fmt == "oom_free_in_addr":
        for trace in traces:
            for e in trace:
                if e["action"] == "oom":
                    e["addr"] = e.pop("device_free")


def random_case(seed: int) -> Case:
    """A snapshot as a user might bring one: random settings, streams, deferred frees, ``empty_cache``
    runs, a device small enough to run out (OOMs), a history that starts mid-run (a wrapped ring buffer
    whose trace frees older blocks, unsplit tails included), and one of :data:`FORMATS`."""
    rng = random.Random(seed)
    expandable = rng.random() < 0.35
    max_split = rng.choice([None, None, None, 64 * MiB, 128 * MiB]) if not expandable or rng.random() < 0.3 else None
    divisions = rng.choice([None, None, None, None, 2, 4, 8])
    config = AllocatorConfig(expandable_segments=expandable, max_split_size_bytes=max_split,
                             roundup_power2_divisions=divisions)
    near_limit = rng.random() < 0.35
    device_bytes = rng.choice([2, 3, 4]) * GiB if near_limit else 80 * GiB
    fmt = rng.choice(FORMATS)
    if fmt == "oom_free_in_addr" and not near_limit:
        fmt = "torch2.6"
    if fmt == "torch2.0_history" and (expandable or divisions or max_split):
        fmt = "no_time"  # torch 2.0 had none of these settings
    options = dict(
        config=config,
        streams=rng.choice([(0,), (0,), (0, 7), (0, 3, 94_000_000_000)]),
        deferred_fraction=rng.choice([0.0, 0.0, 0.15, 0.4]),
        empty_cache_every=rng.choice([0, 0, 150, 400]),
        total_bytes=device_bytes,
        live_bytes=2 * device_bytes if near_limit else rng.choice([2, 8]) * GiB,
        large_share=0.3 if near_limit else rng.choice([0.05, 0.1, 0.2]),
        drop_first=rng.choice([0, 0, rng.randint(200, 1500), rng.randint(200, 1500)]),
        pending_spelling="active_awaiting_free" if fmt == "awaiting_spelling" else "active_pending_free",
        device_index=1 if rng.random() < 0.1 else 0,
    )
    made = generate(rng.randint(100, 800), seed=seed, **options)
    _reformat(made.snapshot, fmt)
    exact, why = exactness(options, fmt, near_limit)
    return Case(seed, options, fmt, made, device_bytes, near_limit, exact, why)
