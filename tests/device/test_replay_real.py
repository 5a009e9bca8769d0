"""The replay against snapshots recorded on real NVIDIA GPUs by people outside this project
(../shared/real-data/README.md): every fidelity check holds, and a model with one wrong rule fails them,
so the checks cannot pass vacuously."""

from __future__ import annotations

import pytest

from kvlab.device.caching_allocator import MIN_BLOCK_BYTES, SMALL_SIZE_BYTES, CachingAllocatorModel
from kvlab.device.replay.fidelity import replay_snapshot
from kvlab.device.replay.report import CHECKS
from kvlab.device.replay.whatif import replay_with_what_ifs
from kvlab.device.snapshot import read_snapshot
from tests.shared_data import SKIP_REASON, real_snapshots

REAL = real_snapshots()
pytestmark = pytest.mark.skipif(not REAL, reason=SKIP_REASON)


def _by_name(fragment: str):
    return next(p for p in REAL if fragment in p.name)


@pytest.fixture(scope="module")
def snapshots():
    return {p.name: read_snapshot(p) for p in REAL}


def _counts(raw):
    trace = raw["device_traces"][0]
    actions = ("alloc", "free_completed", "segment_alloc", "segment_free")
    return {a: sum(e["action"] == a for e in trace) for a in actions}


def test_the_three_recordings_are_there():
    assert len(REAL) == 3, REAL


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name.split("__")[0])
def test_every_fidelity_check_holds(path, snapshots):
    snap = snapshots[path.name]
    result = replay_snapshot(snap)
    assert result.checks == dict.fromkeys(CHECKS, True), result.text()
    assert result.exact and result.first_divergence is None
    trace = snap.raw["device_traces"][0]
    assert result.events_replayed == len(trace)
    # the totals the checks compared, walked from the raw pickle here
    segments = snap.raw["segments"]
    live = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    assert result.final["modelled_reserved_bytes"] == sum(s["total_size"] for s in segments)
    assert result.final["modelled_allocated_bytes"] == live == sum(s["allocated_size"] for s in segments)
    assert result.recorded_cuda_mallocs == _counts(snap.raw)["segment_alloc"]
    # every recorded alloc address reproduced: the model's own block for each, checked independently
    assert result.model.memory_reserved() == result.modelled_reserved[-1] == result.recorded_reserved[-1]


def test_readme_figures(snapshots):
    """The counts ../shared/real-data/README.md states, walked from the files (so the table below is right)."""
    octree = snapshots[_by_name("octree").name]
    assert _counts(octree.raw) == {"alloc": 782, "free_completed": 777, "segment_alloc": 22, "segment_free": 17}
    assert len(octree.raw["device_traces"][0]) == 2375
    decomfl = snapshots[_by_name("DeComFL").name]
    assert _counts(decomfl.raw) == {"alloc": 7946, "free_completed": 7549, "segment_alloc": 61, "segment_free": 0}


def test_the_mid_run_recording_is_seeded_from_its_segments(snapshots):
    """The octree history starts mid-run: one 2 MiB small segment already holding 75 live blocks."""
    result = replay_snapshot(snapshots[_by_name("octree").name])
    assert len(result.seed.segments) == 1 and result.seed.segments[0].size == 2 * 1024 * 1024
    assert len(result.seed.blocks) == 75 and result.seed.ambiguous_blocks == 0
    assert result.to_json()["history"] == "starts mid-run" and result.exact


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name.split("__")[0])
def test_what_if_expandable_segments(path, snapshots):
    result, what_ifs = replay_with_what_ifs(snapshots[path.name], capacity="24GiB")
    baseline, expandable = what_ifs
    assert expandable.config.expandable_segments and not baseline.config.expandable_segments
    # the baseline is the recorded stream under the recorded settings: the recording's own peak
    assert baseline.peak_reserved_bytes == result.recorded_peak_reserved_bytes
    assert baseline.cuda_malloc_calls == result.recorded_cuda_mallocs
    for w in what_ifs:
        assert w.peak_reserved_bytes >= max(w.allocated) > 0
        # a run whose peak fits never runs out; one that does not fit may still fit by releasing its cache
        if w.peak_reserved_bytes <= 24 * 2**30:
            assert w.oom_at_capacity is False
        assert (w.oom_event is not None) is w.oom_at_capacity


# ---- the mutation test: a wrong rule must fail the checks ----------------------------------------------


class FirstFit(CachingAllocatorModel):
    """Wrong: takes the lowest-address cached block that fits instead of the smallest."""

    def get_free_block(self, pool, stream, size):
        fits = [b for b in pool.blocks.values() if b.stream == stream and b.size >= size]
        if not fits:
            return None
        block = min(fits, key=lambda b: b.addr)
        if size < self.config.effective_max_split_size_bytes <= block.size:
            return None
        pool.erase(block)
        return block


class SplitAbove2MiB(CachingAllocatorModel):
    """Wrong: the large pool keeps a remainder of up to 2 MiB inside the block (torch: 1 MiB)."""

    def should_split(self, block, size):
        if block.pool == "small" or self.config.expandable_segments:
            return block.size - size >= MIN_BLOCK_BYTES
        return size < self.config.effective_max_split_size_bytes and block.size - size > 2 * SMALL_SIZE_BYTES


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name.split("__")[0])
def test_first_fit_fails_the_checks_on_every_recording(path, snapshots):
    result = replay_snapshot(snapshots[path.name], model_factory=FirstFit)
    assert not result.exact
    assert result.checks["block_addresses_equal"] is False and result.checks["final_segments_equal"] is False
    assert result.first_divergence.kind in ("block_address", "segment_alloc")


def test_a_wrong_split_threshold_fails_the_checks(snapshots):
    """The 1 MiB rule decides the layout in two of the three recordings (the third never meets a
    remainder between 1 and 2 MiB): the wrong threshold leaves a different final state there."""
    failed = {}
    for name, snap in snapshots.items():
        result = replay_snapshot(snap, model_factory=SplitAbove2MiB)
        failed[name.split("__")[0]] = not result.exact
        if not result.exact:
            assert result.checks["final_segments_equal"] is False
            assert result.checks["final_allocated_equal"] is False
    assert failed == {"HugePandaCoder": False, "ZidongLiu": True, "silmont2000": True}


def test_readme_table_states_the_replayed_figures(snapshots):
    """README's `kvlab replay` table quotes what the replay and the expandable what-if compute here."""
    from tests.conftest import REPO_ROOT

    rows = [r for r in (REPO_ROOT / "README.md").read_text().splitlines() if "| exact (8/8) |" in r]
    assert len(rows) == 3
    for name, snap in snapshots.items():
        owner = name.split("__")[0]
        row = next(r for r in rows if r.startswith(f"| {owner}/"))
        result, (baseline, expandable) = replay_with_what_ifs(snap)
        assert result.exact
        peak, what_if = result.recorded_peak_reserved_bytes, expandable.peak_reserved_bytes
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"{result.events_replayed:,}"
        assert cells[3] == f"{peak / 2**30:.2f} GiB"
        change = f"{(what_if - peak) / peak:+.1%}".replace("-", "−")
        assert cells[4] == f"{what_if / 2**30:.2f} GiB ({change})"
        assert cells[5] == f"{result.recorded_cuda_mallocs} → {expandable.cuda_malloc_calls}"
