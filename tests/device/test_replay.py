"""The replay on generated snapshots: every case a real recording has (expandable segments, several
streams, frees deferred on events, a history that starts mid-run, OOM, max_split_size, power-of-two
rounding, old formats), checked against the truth the generating run kept, and a tampered recording
that must diverge where it was tampered."""

from __future__ import annotations

import copy

import pytest

from kvlab.device.caching_allocator import AllocatorConfig, CachingAllocatorModel, round_size
from kvlab.device.events import EventRecorder
from kvlab.device.replay.fidelity import replay_snapshot
from kvlab.device.replay.gen import generate
from kvlab.device.replay.report import CHECKS
from kvlab.device.snapshot import read_snapshot
from kvlab.units import GiB, KiB, MiB

ALL_TRUE = dict.fromkeys(CHECKS, True)
CASES = {
    "plain": dict(),
    "expandable": dict(config=AllocatorConfig(expandable_segments=True), empty_cache_every=400),
    "streams": dict(streams=(0, 7, 94_000_000_000)),
    "expandable-streams": dict(config=AllocatorConfig(expandable_segments=True), streams=(0, 5),
                               empty_cache_every=500),
    "deferred": dict(deferred_fraction=0.3, empty_cache_every=350),
    "mid-run": dict(drop_first=1500),
    "mid-run-deferred": dict(deferred_fraction=0.3, drop_first=1777),
    "mid-run-expandable": dict(config=AllocatorConfig(expandable_segments=True), drop_first=1500, empty_cache_every=300),
    "mid-run-max-split": dict(config=AllocatorConfig(max_split_size_bytes=64 * MiB), drop_first=1501),
    "oom": dict(total_bytes=3 * GiB, live_bytes=6 * GiB, large_share=0.3),
    # near the device's limit the allocator releases on its own before retrying a cudaMalloc: all cached
    # segments, only oversize ones (max_split_size), or free pages including a partial mapping (expandable)
    "oom-streams": dict(total_bytes=3 * GiB, live_bytes=6 * GiB, large_share=0.3, streams=(0, 3)),
    "oom-max-split": dict(config=AllocatorConfig(max_split_size_bytes=64 * MiB), total_bytes=3 * GiB,
                          live_bytes=6 * GiB, large_share=0.3),
    "oom-expandable": dict(config=AllocatorConfig(expandable_segments=True), total_bytes=3 * GiB,
                           live_bytes=6 * GiB, large_share=0.3, streams=(0, 3)),
    "max-split": dict(config=AllocatorConfig(max_split_size_bytes=64 * MiB), empty_cache_every=500),
    "roundup-power2": dict(config=AllocatorConfig(roundup_power2_divisions=4)),
}
CHECKED = ("alloc", "free_requested", "free_completed")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", CASES)
def test_generated_snapshots_replay_exactly(case, seed):
    made = generate(2500, seed=seed, **CASES[case])
    result = replay_snapshot(made.snapshot, check_invariants=seed == 0)
    assert result.checks == ALL_TRUE, result.text()
    counts = result.event_counts
    # the case really has what it is named for
    if "expandable" in case:
        assert counts["segment_map"] and counts["segment_unmap"] and not counts["segment_alloc"]
    if "streams" in case:
        assert len({e["stream"] for e in result.trace if e["action"] == "alloc"}) > 1
    if "deferred" in case:
        gaps = [e["action"] for e in result.trace]
        assert any(a == "free_requested" and b != "free_completed" for a, b in zip(gaps, gaps[1:]))
    if case.startswith("oom"):
        assert counts["oom"] > 0 and result.recorded_ooms == result.modelled_ooms == counts["oom"]
        own = [e["action"] for e in result.trace]  # a release followed by a new segment or an oom
        assert any(a in ("segment_free", "segment_unmap") and b in ("segment_alloc", "segment_map", "oom")
                   for a, b in zip(own, own[1:]))
    if "mid-run" in case:
        assert result.seed.segments and result.seed.blocks
    # reserved and allocated bytes after every alloc and free are the generating run's (the truth is kept
    # per call, so events inside one call are skipped; allocated: torch's count, a deferred free already
    # gone, unsplit tails of blocks that predate the history included except the few the trace leaves
    # ambiguous)
    at = [i for i, e in enumerate(result.trace) if e["action"] in CHECKED]
    assert [result.modelled_reserved[i] for i in at] == [made.reserved[i] for i in at]
    assert [result.recorded_reserved[i] for i in at] == [made.reserved[i] for i in at]
    off = [(i, m, t) for i, (e, m, t) in enumerate(zip(result.trace, result.modelled_allocated, made.allocated))
           if e["action"] in CHECKED and m != t]
    assert not off or result.seed.ambiguous_blocks, off[:3]
    assert all(0 < t - m <= result.seed.ambiguous_blocks * MiB for _, m, t in off)


def move_block(trace: list, k: int, by: int) -> None:
    """Tamper with a recording consistently: the block allocated at event ``k`` went ``by`` bytes further, its frees
    too (a free of an address nothing was allocated at is a contradiction the reader refuses)."""
    addr = trace[k]["addr"]
    for entry in trace[k:]:
        if entry["addr"] == addr and entry["action"] in ("alloc", "free_requested", "free_completed"):
            if entry["action"] == "alloc" and entry is not trace[k]:
                break
            entry["addr"] += by


def test_a_tampered_recording_diverges_where_it_was_tampered():
    made = generate(1500, seed=3)
    raw = copy.deepcopy(made.snapshot)
    trace = raw["device_traces"][0]
    k = next(i for i, e in enumerate(trace) if i > 600 and e["action"] == "alloc" and e["size"] > 2 * MiB)
    move_block(trace, k, 512)
    result = replay_snapshot(raw)
    assert result.checks["block_addresses_equal"] is False and not result.exact
    first = result.first_divergence
    assert (first.index, first.kind, first.recorded, first.modelled) == (k, "block_address", trace[k]["addr"],
                                                                        trace[k]["addr"] - 512)
    context = result.context(first)
    assert sum(line.startswith("→ ") for line in context) == 1 and f"[{k}] alloc" in context[4]
    text = result.text()
    assert "DIVERGES" in text and f"event {k}: block_address" in text


def test_a_missing_segment_free_is_a_divergence():
    made = generate(2000, seed=4, empty_cache_every=300)
    raw = copy.deepcopy(made.snapshot)
    trace = raw["device_traces"][0]
    k = next(i for i, e in enumerate(trace) if e["action"] == trace[i + 1]["action"] == "segment_free")
    dropped = trace.pop(k)  # the recording says empty_cache kept this (free) segment
    result = replay_snapshot(raw)
    first = result.first_divergence
    assert result.checks["segment_frees_equal"] is False and (first.index, first.kind) == (k, "segment_free")
    assert ("segment_free", dropped["addr"], dropped["size"]) in first.modelled
    assert ("segment_free", dropped["addr"], dropped["size"]) not in first.recorded


def test_an_unsplit_tail_older_than_the_history_is_counted():
    """A 20 MiB segment holds three 5 MiB blocks; a 4.5 MiB request then takes the last 5 MiB whole (a
    0.5 MiB rest is not split off in the large pool). The history starts after that, and frees it: the
    old backward replay counted 4.5 MiB for it (round_size of the request), torch counts 5 MiB."""
    recorder = EventRecorder()
    model = CachingAllocatorModel(80 * GiB, recorder=recorder)
    blocks = [model.malloc(5 * MiB) for _ in range(3)]
    last = model.malloc(4 * MiB + 512 * KiB)
    assert last.size == 5 * MiB and model.memory_allocated() == 20 * MiB
    cut = len(recorder.events)
    model.free(last)
    model.free(blocks[1])
    blocks.append(model.malloc(7 * MiB))
    raw = model.snapshot()
    raw["device_traces"][0] = raw["device_traces"][0][cut:]
    snap = read_snapshot(raw)
    assert snap.replay().initial_allocated_bytes == 20 * MiB  # was 20 MiB - 512 KiB
    assert snap.timeline()["allocated_bytes"].tolist()[:2] == [20 * MiB, 15 * MiB]
    result = replay_snapshot(snap)
    assert result.exact and result.seed.allocated_bytes == 20 * MiB
    assert [b.tail_bytes for b in result.seed.blocks] == [0, 0, 0, 512 * KiB]
    assert result.modelled_allocated[:3] == [15 * MiB, 15 * MiB, 10 * MiB]  # free_requested drops it (torch)


@pytest.mark.parametrize("seed", range(3))
def test_snapshot_replay_counts_unsplit_tails_of_blocks_older_than_the_history(seed):
    """The same on a generated run: the tails are counted except where the trace leaves them ambiguous
    (then at most 1 MiB per ambiguous block is missing)."""
    made = generate(3000, seed=seed, drop_first=2000, large_share=0.05)
    snap = read_snapshot(made.snapshot)
    result = replay_snapshot(snap)
    blocks = result.seed.blocks
    tails = sum(b.tail_bytes for b in blocks)
    assert tails > 0  # the case is really there
    naive = sum(round_size(b.requested) if b.inferred else b.size for b in blocks)
    assert naive == sum(b.size for b in blocks) - tails  # what the old replay counted
    timeline = snap.replay()
    # Snapshot.replay counts a block until its free completes; the generating run's truth (torch's
    # memory_allocated) drops it when the free is requested
    expected = made.initial_allocated + sum(b.size for b in blocks if b.pending)
    ambiguous = result.seed.ambiguous_blocks
    assert 0 <= expected - timeline.initial_allocated_bytes <= ambiguous * MiB
    if not ambiguous:
        assert timeline.initial_allocated_bytes == expected


def test_old_formats_and_both_pending_spellings():
    for spelling in ("active_pending_free", "active_awaiting_free"):
        made = generate(1200, seed=5, with_time=False, with_settings=False, pending_spelling=spelling,
                        deferred_fraction=0.4)
        assert "time_us" not in made.snapshot["device_traces"][0][0]
        states = {b["state"] for s in made.snapshot["segments"] for b in s["blocks"]}
        assert spelling in states
        result = replay_snapshot(made.snapshot)
        assert result.checks == ALL_TRUE
        assert any("no allocator_settings" in note and "defaults" in note for note in result.notes)
    # torch 2.0 blocks: no address, no requested_size, a history list instead
    made = generate(800, seed=6)
    raw = copy.deepcopy(made.snapshot)
    for seg in raw["segments"]:
        for block in seg["blocks"]:
            requested = block.pop("requested_size")
            del block["address"], block["frames"]
            block["history"] = [{"addr": 0, "real_size": requested, "frames": []}]
    assert replay_snapshot(raw).checks == ALL_TRUE


def test_recorded_settings_are_applied():
    made = generate(1500, seed=7, config=AllocatorConfig(max_split_size_bytes=64 * MiB), empty_cache_every=300)
    assert made.snapshot["allocator_settings"]["max_split_size"] == 64 * MiB
    assert replay_snapshot(made.snapshot).settings.max_split_size_bytes == 64 * MiB
    wrong = replay_snapshot(made.snapshot, config=AllocatorConfig())
    assert not wrong.exact  # the settings matter here, so applying them is what made it exact


def test_multi_device_and_private_pools():
    dev0, dev1 = generate(600, seed=8), generate(700, seed=9, device_index=1)
    raw = {**dev1.snapshot, "segments": dev0.snapshot["segments"] + dev1.snapshot["segments"],
           "device_traces": [dev0.snapshot["device_traces"][0], dev1.snapshot["device_traces"][1]]}
    first, second = replay_snapshot(raw), replay_snapshot(raw, device=1)
    assert (first.device, second.device) == (0, 1) and first.exact and second.exact
    assert second.events_replayed == len(dev1.snapshot["device_traces"][1])
    assert any("devices with data: [0, 1]" in note for note in first.notes)
    with pytest.raises(ValueError, match="no device 5 in this snapshot"):
        replay_snapshot(raw, device=5)
    # a CUDA-graph private pool: its segment and the events on it are left out, said so, the rest replays
    pooled = copy.deepcopy(dev0.snapshot)
    seg = next(s for s in pooled["segments"] if s["segment_type"] == "large")
    seg["segment_pool_id"] = (1, 2)
    result = replay_snapshot(pooled)
    note = next(n for n in result.notes if "private pools are not modelled" in n)
    assert f"{seg['total_size']:,} B" in note
    assert result.events_replayed < len(dev0.snapshot["device_traces"][0])


def test_a_segment_list_has_no_history():
    made = generate(500, seed=10)
    snap = read_snapshot(made.snapshot["segments"])  # what torch.cuda.memory_snapshot() returns
    assert snap.format == "segment_list" and not snap.has_history
    result = replay_snapshot(snap)
    assert result.events_replayed == 0 and not result.exact
    assert set(result.checks.values()) == {None}
    assert result.final["recorded_reserved_bytes"] == result.final["modelled_reserved_bytes"] > 0
    assert "no history" in result.text() and result.to_json()["fidelity"]["exact"] is None


def test_a_model_that_breaks_stops_the_replay_with_a_report():
    """When the model cannot take an event (its state drifted from the recording's), the replay stops there
    and says so; what was replayed stays consistent and the report still renders."""
    from kvlab.errors import InvariantError

    class BreaksAt50(CachingAllocatorModel):
        calls = 0

        def malloc(self, size, stream=0):
            BreaksAt50.calls += 1
            if BreaksAt50.calls == 50:
                raise InvariantError("a deliberately broken rule", call=50)
            return super().malloc(size, stream)

    made = generate(600, seed=15)
    result = replay_snapshot(made.snapshot, model_factory=BreaksAt50)
    k = [i for i, e in enumerate(made.snapshot["device_traces"][0]) if e["action"] == "alloc"][49]
    first = result.first_divergence
    assert (first.index, first.kind) == (k, "stopped") and "a deliberately broken rule" in first.modelled
    assert result.events_replayed == k and len(result.timeline()) == k and not result.exact
    assert result.checks["final_segments_equal"] is False
    assert any(f"the replay stopped at event {k} of" in note for note in result.notes)
    assert "DIVERGES" in result.text() and result.to_json()["fidelity"]["first_divergence"]["kind"] == "stopped"
