"""What-ifs on a history that starts mid-run (the trace is a ring buffer): the blocks live at its first event
are freed inside it, and every what-if takes those frees (``kvlab replay`` raised KeyError on them before).
Under the recorded settings the what-if starts from the exact state at the first event; under other settings
the row says its starting state is an estimate. A stream the model cannot take ends the row with a caveat,
never an exception."""

from __future__ import annotations

import pytest

from kvlab.device.caching_allocator import AllocatorConfig
from kvlab.device.replay.gen import generate
from kvlab.device.replay.report import OP_ALLOC, OP_FREE, OP_FREE_REQUESTED
from kvlab.device.replay.whatif import replay_with_what_ifs, run_what_if
from kvlab.units import GiB, MiB

WHAT_IFS = ["expandable_segments=True", "max_split_size_mb=128", "roundup_power2_divisions=4",
            "expandable_segments=False"]
MID_RUN = {
    "plain": dict(drop_first=1500),
    "deferred": dict(drop_first=1777, deferred_fraction=0.3),
    "expandable": dict(drop_first=1500, config=AllocatorConfig(expandable_segments=True), empty_cache_every=300),
    "max-split": dict(drop_first=1501, config=AllocatorConfig(max_split_size_bytes=64 * MiB)),
    "streams-oom": dict(drop_first=900, streams=(0, 3), total_bytes=3 * GiB, live_bytes=6 * GiB, large_share=0.3),
}


def _freed_before_history(made) -> int:
    """Frees in the kept trace of blocks allocated before it: what crashed the what-ifs."""
    trace = made.snapshot["device_traces"][-1]
    allocated = set()
    count = 0
    for e in trace:
        if e["action"] == "alloc":
            allocated.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in allocated:
            count += 1
        elif e["action"] == "free_completed":
            allocated.discard(e["addr"])
    return count


@pytest.mark.parametrize("case", MID_RUN)
def test_every_what_if_runs_on_a_mid_run_history(case):
    made = generate(2000, seed=5, **MID_RUN[case])
    assert _freed_before_history(made) > 0  # the case frees blocks older than its history
    result, runs = replay_with_what_ifs(made.snapshot, what_ifs=WHAT_IFS, capacity="2GiB")
    assert result.exact, result.text()
    recorded = result.settings
    assert [w.label for w in runs] == ["as recorded (modelled)", *WHAT_IFS]
    for w in runs:
        same = w.config == recorded
        # under the recorded settings the start is the recorded state: exact; otherwise an estimate, said so
        assert w.exact == same, (w.label, w.caveats)
        assert all("starts mid-run" in c for c in w.caveats), w.caveats
        assert w.steps[0] == -1 and len(w.steps) == len(w.reserved) == len(w.allocated)
        assert w.oom_at_capacity is not None
        row = w.to_json()
        assert row["exact"] == same and row["caveats"] == w.caveats
    baseline = runs[0]
    # the exact start reproduces the recording's reserved bytes, peak and final
    assert baseline.peak_reserved_bytes == max(made.initial_reserved, *made.reserved)
    assert baseline.final_reserved_bytes == made.reserved[-1]
    assert baseline.reserved[0] == made.initial_reserved
    text = result.text(runs)
    assert "estimate [1]" in text and "\n  [1] the history starts mid-run" in text


def test_a_stream_the_model_cannot_take_ends_the_row_with_a_caveat():
    config = AllocatorConfig()
    ops = [(OP_ALLOC, 0x1000, 4 * MiB, 0, 0), (OP_FREE, 0x9999, 1), (OP_FREE_REQUESTED, 0x7777, 2),
           (OP_ALLOC, 0x2000, -5, 0, 3), (OP_ALLOC, 0x3000, MiB, 0, 4)]
    w = run_what_if(ops, config, label="broken", capacity=1 * GiB)
    assert not w.exact
    assert any(c.startswith("the model could not take the stream at event 3 (ValueError: malloc size") for c in
               w.caveats), w.caveats
    assert w.steps == [0, 1, 2] and w.peak_reserved_bytes == 20 * MiB
    ok = run_what_if(ops[:3], config, label="unknown frees")
    assert ok.caveats == ["2 frees name a block this run does not hold (left out)"]
