"""The allocator tour's six steps (notebook 00: kvlab.experiments' scripts, kvlab.labs' checks) on kvlab's
model, against numbers derived here.

Every expected number comes from :class:`RuleAllocator`, a deliberately naive re-statement of the rules
in docs/semantics.md#pytorch-cuda-caching-allocator (round to 512 B; small pool <= 1 MiB with 2 MiB
segments; 20 MiB segments below 10 MiB, else the request rounded to 2 MiB; best fit; split rules; merge
inside a segment; ``empty_cache`` frees whole free segments), written without looking at the model's
code, or from the page arithmetic of expandable segments. The scripts' *inputs* (request sizes) are read
from the module; nothing the model computes is copied.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest

from kvlab.experiments import allocator_tour as tour
from kvlab.labs import allocator_tour as lab
from kvlab.units import KiB, MiB

# ---- an independent oracle: the rules of docs/semantics.md, non-expandable, one stream ------------


def rule_round(n: int) -> int:
    return max(512, -(-n // 512) * 512)


def rule_pool(rounded: int) -> str:
    return "small" if rounded <= 1 * MiB else "large"


def rule_segment_bytes(rounded: int) -> int:
    if rounded <= 1 * MiB:
        return 2 * MiB
    if rounded < 10 * MiB:
        return 20 * MiB
    return -(-rounded // (2 * MiB)) * (2 * MiB)


class RuleAllocator:
    """Segments are lists of [offset, size, live] blocks, in address order."""

    def __init__(self) -> None:
        self.segments: list[dict] = []  # {"pool", "size", "blocks"}

    def malloc(self, n: int) -> tuple[int, int]:
        size = rule_round(n)
        pool = rule_pool(size)
        candidates = [(b[1], si, bi) for si, seg in enumerate(self.segments) if seg["pool"] == pool
                      for bi, b in enumerate(seg["blocks"]) if not b[2] and b[1] >= size]
        if candidates:
            _, si, bi = min(candidates)  # best fit, then lowest segment (= lowest address here)
        else:
            total = rule_segment_bytes(size)
            self.segments.append({"pool": pool, "size": total, "blocks": [[0, total, False]]})
            si, bi = len(self.segments) - 1, 0
        blocks = self.segments[si]["blocks"]
        offset, have, _ = blocks[bi]
        rest = have - size
        split = rest >= 512 if pool == "small" else rest > 1 * MiB
        if split:
            blocks[bi:bi + 1] = [[offset, size, True], [offset + size, rest, False]]
        else:
            blocks[bi][2] = True
        return si, offset

    def free(self, handle: tuple[int, int]) -> None:
        si, offset = handle
        blocks = self.segments[si]["blocks"]
        i = next(i for i, b in enumerate(blocks) if b[0] == offset)
        blocks[i][2] = False
        merged: list[list] = []
        for b in blocks:  # merge free neighbours inside this segment only
            if merged and not merged[-1][2] and not b[2]:
                merged[-1][1] += b[1]
            else:
                merged.append(list(b))
        self.segments[si]["blocks"] = merged

    def empty_cache(self) -> None:
        self.segments = [s for s in self.segments if any(b[2] for b in s["blocks"]) or len(s["blocks"]) > 1]

    # torch's numbers
    def allocated(self) -> int:
        return sum(b[1] for s in self.segments for b in s["blocks"] if b[2])

    def reserved(self) -> int:
        return sum(s["size"] for s in self.segments)

    def count(self, pool: str) -> int:
        return sum(s["pool"] == pool for s in self.segments)

    def largest_free(self) -> int:
        return max((b[1] for s in self.segments for b in s["blocks"] if not b[2]), default=0)


def test_oracle_agrees_with_semantics_worked_cases():
    """The oracle itself, on the rules as docs/semantics.md states them."""
    assert [rule_round(n) for n in (1, 511, 512, 513)] == [512, 512, 512, 1024]
    assert rule_segment_bytes(1 * MiB) == 2 * MiB and rule_segment_bytes(1 * MiB + 512) == 20 * MiB
    assert rule_segment_bytes(10 * MiB) == 10 * MiB and rule_segment_bytes(11 * MiB) == 12 * MiB
    oracle = RuleAllocator()
    a = oracle.malloc(8 * MiB)
    oracle.malloc(2 * MiB)
    oracle.free(a)
    oracle.empty_cache()
    assert oracle.reserved() == 20 * MiB and oracle.largest_free() == 10 * MiB


# ---- expected facts, derived -------------------------------------------------------------------


def expected_rounding() -> dict[str, int]:
    oracle = RuleAllocator()
    for n in tour.ROUNDING_REQUESTS_BYTES:
        oracle.malloc(n)
    return {"allocated_bytes": oracle.allocated(), "reserved_bytes": oracle.reserved()}


def expected_pools() -> dict[str, int]:
    oracle = RuleAllocator()
    for n in tour.POOLS_REQUESTS_BYTES.values():
        oracle.malloc(n)
    return {"small_segments": oracle.count("small"), "large_segments": oracle.count("large"),
            "reserved_bytes": oracle.reserved()}


def expected_splitting() -> dict[str, int]:
    oracle = RuleAllocator()
    big = oracle.malloc(tour.SPLIT_BIG_BYTES)
    pin = oracle.malloc(tour.SPLIT_PIN_BYTES)
    oracle.free(big)
    oracle.empty_cache()
    facts = {"reserved_bytes": oracle.reserved(), "largest_free_block_bytes": oracle.largest_free()}
    oracle.free(pin)
    oracle.empty_cache()
    facts["reserved_after_release_bytes"] = oracle.reserved()
    return facts


def expected_fragmentation() -> dict[str, int]:
    facts = {}
    for order, sizes in tour.FRAGMENTATION_ORDERS_BYTES.items():
        oracle = RuleAllocator()
        for n in sizes:
            oracle.malloc(n)
        facts[f"reserved_{order}_bytes"] = oracle.reserved()
        facts[f"allocated_{order}_bytes"] = oracle.allocated()
    return facts


def expected_gc_cycle() -> dict[str, int]:
    oracle = RuleAllocator()
    handle = oracle.malloc(tour.CYCLE_BYTES)
    oracle.empty_cache()  # the cycle still holds the tensor: its block is live
    before = {"allocated_before_gc_bytes": oracle.allocated(), "reserved_before_gc_bytes": oracle.reserved()}
    oracle.free(handle)  # gc.collect() breaks the cycle
    after_gc = oracle.allocated()
    oracle.empty_cache()
    return {**before, "allocated_after_gc_bytes": after_gc, "reserved_after_gc_bytes": oracle.reserved()}


def expected_expandable() -> dict[str, int]:
    oracle = RuleAllocator()
    for n in tour.GROWING_REQUESTS_BYTES:  # each buffer freed before the next one
        handle = oracle.malloc(n)
        oracle.free(handle)
    # Expandable: one segment maps 20 MiB large pages on demand; one buffer at a time from offset 0,
    # so the mapping only ever grows to cover the largest buffer.
    page = 20 * MiB
    on = max(-(-rule_round(n) // page) * page for n in tour.GROWING_REQUESTS_BYTES)
    return {"reserved_off_bytes": oracle.reserved(), "reserved_on_bytes": on}


EXPECTED = {
    "rounding": expected_rounding,
    "pools": expected_pools,
    "splitting": expected_splitting,
    "fragmentation": expected_fragmentation,
    "gc_cycle": expected_gc_cycle,
    "expandable": expected_expandable,
}


@pytest.fixture(scope="module")
def runs() -> dict[str, tour.StepRun]:
    return {key: step.run("sim:h200") for key, step in lab.STEPS.items()}


@pytest.mark.parametrize("key", list(EXPECTED))
def test_step_facts_follow_the_allocator_rules(key, runs):
    assert runs[key].facts == EXPECTED[key]()


def test_worked_numbers_as_the_notebook_explains_them(runs):
    """The same facts as plain arithmetic, the way the markdown and hints explain them."""
    assert runs["rounding"].facts["allocated_bytes"] == 512 + 512 + 1024 + 1024 + 4608
    assert runs["pools"].facts["reserved_bytes"] == (2 + 20 + 26) * MiB
    assert runs["splitting"].facts == {"reserved_bytes": 20 * MiB, "largest_free_block_bytes": 10 * MiB,
                                       "reserved_after_release_bytes": 0}
    frag = runs["fragmentation"].facts
    assert frag["allocated_ascending_bytes"] == frag["allocated_descending_bytes"] == 20 * MiB
    assert (frag["reserved_ascending_bytes"], frag["reserved_descending_bytes"]) == (20 * MiB, 34 * MiB)
    assert runs["expandable"].facts == {"reserved_off_bytes": 96 * MiB, "reserved_on_bytes": 40 * MiB}


def test_expandable_segments_take_the_order_out_of_fragmentation():
    facts = lab.fragmentation.run("sim:h200", expandable_segments=True).facts
    page = 20 * MiB
    total = sum(rule_round(n) for n in tour.FRAGMENTATION_ORDERS_BYTES["ascending"])
    assert facts["reserved_ascending_bytes"] == facts["reserved_descending_bytes"] == -(-total // page) * page


# ---- the gc step is a real cycle and a real gc.collect() --------------------------------------------


def test_gc_step_frees_only_through_the_real_collector(monkeypatch):
    """With gc.collect() made a no-op the cycle survives: the block stays allocated and pinned."""
    monkeypatch.setattr(tour.gc, "collect", lambda *args: 0)
    run = lab.gc_cycle.run("sim:h200")
    monkeypatch.undo()
    gc.collect()  # the leaked cycle from this run
    assert run.facts["allocated_after_gc_bytes"] == tour.CYCLE_BYTES
    assert run.facts["reserved_after_gc_bytes"] == rule_segment_bytes(tour.CYCLE_BYTES)


def test_gc_step_restores_automatic_collection():
    assert gc.isenabled()
    lab.gc_cycle.run("sim:h200")
    assert gc.isenabled()


def test_loader_scratch_is_a_reference_cycle():
    scratch = tour.LoaderScratch(buffer=None)
    assert scratch in gc.get_referents(scratch.__dict__)


# ---- states and timeline --------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(lab.STEPS))
def test_states_match_the_timeline_rows(key, runs):
    run = runs[key]
    assert run.states, key
    for state in run.states:
        row = run.timeline.iloc[state.timeline_index]
        assert row["action"] == "snapshot" and row["step"] == state.label
        assert (row["allocated_bytes"], row["reserved_bytes"]) == (state.allocated_bytes, state.reserved_bytes)
        snap_reserved = sum(seg["total_size"] for seg in state.snapshot["segments"])
        assert snap_reserved == state.reserved_bytes, state.label
    assert 0 <= run.focus_index < len(run.states)


def test_focus_is_the_state_the_facts_are_read_at(runs):
    split = runs["splitting"]
    assert split.states[split.focus_index].label == "empty_cache() (pin alive)"
    assert split.states[split.focus_index].reserved_bytes == split.facts["reserved_bytes"]
    gc_run = runs["gc_cycle"]
    assert gc_run.states[gc_run.focus_index].reserved_bytes == gc_run.facts["reserved_before_gc_bytes"]


def test_arms_run_on_fresh_allocators(runs):
    timeline = runs["expandable"].timeline
    assert list(dict.fromkeys(timeline["arm"])) == ["expandable off", "expandable on"]
    on = timeline[timeline["arm"] == "expandable on"]
    assert on["action"].iloc[0] == "segment_map"  # nothing cached from the "off" arm
    assert "segment_alloc" not in set(on["action"])


def test_runs_are_deterministic(runs):
    again = lab.splitting.run("sim:h200")
    assert again.facts == runs["splitting"].facts
    assert [s.snapshot["segments"] for s in again.states] == [s.snapshot["segments"] for s in runs["splitting"].states]
    assert again.timeline.equals(runs["splitting"].timeline)


def test_summary_frame_lists_every_fact(runs):
    frame = tour.summary_frame(list(runs.values()))
    assert len(frame) == sum(len(r.facts) for r in runs.values())
    row = frame[(frame["step"] == "pools") & (frame["fact"] == "reserved_bytes")].iloc[0]
    assert row["MiB"] == 48


# ---- check() --------------------------------------------------------------------------------------


def _right(key: str) -> dict[str, int]:
    facts = EXPECTED[key]()
    return {f"predicted_{name}": facts[name] for name in lab.STEPS[key].predictions}


@pytest.mark.parametrize("key", list(lab.STEPS))
def test_check_passes_the_right_prediction(key, runs):
    result = lab.STEPS[key].check(runs[key], **_right(key))
    assert result.ok, result.text()
    assert result.text().startswith("PASS")


@pytest.mark.parametrize("key", list(lab.STEPS))
def test_check_says_not_yet_with_a_hint_for_a_wrong_prediction(key, runs):
    step = lab.STEPS[key]
    predictions = _right(key)
    first = step.variables[0]
    predictions[first] += 512
    result = step.check(runs[key], **predictions)
    assert not result.ok and result.text().startswith("NOT YET")
    assert [line.label for line in result.wrong] == [lab._label(step.predictions[0])]
    assert result.wrong[0].hint == step.hints[step.predictions[0]] != ""


def test_check_without_predictions_is_not_yet_and_reveals_nothing(runs):
    result = lab.rounding.check(runs["rounding"], predicted_allocated_bytes=None)
    assert not result.ok
    assert "predicted_allocated_bytes" in result.note and "predicted_reserved_bytes" in result.note
    assert str(EXPECTED["rounding"]()["allocated_bytes"]) not in result.text().replace(",", "")
    assert "write your prediction" in result.text()


def test_check_rejects_unknown_names_and_non_numbers(runs):
    with pytest.raises(TypeError, match="predicted_alocated_bytes"):
        lab.rounding.check(predicted_alocated_bytes=1)
    result = lab.rounding.check(predicted_allocated_bytes="7680", predicted_reserved_bytes=2 * MiB)
    assert not result.ok and "must be a number" in result.text()


def test_check_reports_when_a_gpu_run_disagrees_with_the_model(runs):
    """A run from another device (here: the model's run relabelled, one fact changed) gets one more
    line comparing what it showed with the model."""
    shown = dataclasses.replace(runs["pools"], device_kind="cuda", device_name="cuda:0 (test)")
    assert lab.pools.check(shown, **_right("pools")).ok
    off = dataclasses.replace(shown, facts={**shown.facts, "reserved_bytes": shown.facts["reserved_bytes"] + 2 * MiB})
    result = lab.pools.check(off, **_right("pools"))
    assert not result.ok and result.wrong[0].label == "cuda:0 (test) agrees with the model"


def test_solution_hidden_by_default_and_correct_when_run(monkeypatch):
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    for key, step in lab.STEPS.items():
        assert "hidden" in repr(step.solution)
        namespace = {"MiB": MiB, "KiB": KiB}
        exec(step.solution_code, namespace)  # the shown solution is itself a right answer
        answers = {name: namespace[name] for name in step.variables}
        assert step.check(**answers).ok, key


# ---- on a real GPU (skipped without one) ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("key", list(lab.STEPS))
def test_cuda_run_agrees_with_the_model(key):
    """The same step on torch's own allocator gives the model's facts (check() says so too)."""
    run = lab.STEPS[key].run("cuda")
    assert run.device_kind == "cuda"
    assert run.facts == lab.STEPS[key].model_facts()
    assert lab.STEPS[key].check(run, **_right(key)).ok
