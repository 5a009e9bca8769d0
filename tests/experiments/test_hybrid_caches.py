"""kvlab.experiments.hybrid_caches: the SWA walkthrough, the eviction-mode comparison, the exercise's tree
(its check: tests/test_exercises.py)."""

import pytest

from kvlab.experiments import hybrid_caches as h


def test_swa_walkthrough_frees_swa_only_by_tombstoning():
    _, ev = h.swa_walkthrough()
    assert ev.full_shortfall == 0 and ev.swa_shortfall > 0
    assert ev.full_evicted == 0 and ev.swa_evicted >= ev.swa_shortfall and ev.tombstones == 1


def test_full_eviction_costs_more_on_mamba_than_on_radix():
    df = h.eviction_mode_comparison().set_index(["cache", "mode"])
    radix = df.loc[("radix", "full"), "extra_prefill_tokens"]
    mamba = df.loc[("mamba", "full"), "extra_prefill_tokens"]
    assert mamba > radix >= 0
    assert df.loc[("mamba", "full"), "hit_rate"] < df.loc[("mamba", "shortfall"), "hit_rate"]
    assert (df["failed"] == 0).all() and df.loc[("mamba", "full"), "states_lost"] > 0


def test_runs_keep_invariants_and_reject_bad_input():
    seqs = h.multi_turn_workload(num_sessions=4, turns=3)
    for kind in ("radix", "mamba"):
        h.run_workload(kind, "full", seqs, pool_tokens=200, mamba_states=4, check=True)
    with pytest.raises(ValueError, match="kind"):
        h.run_workload("swa", "full", seqs)
    with pytest.raises(ValueError, match="mode"):
        h.run_workload("radix", "half", seqs)


def test_state_frame_marks_tombstones_and_follows_eviction():
    cache, _ = h.resume_scenario()
    frame = h.state_frame(cache).set_index("id")
    nodes = {n.id: n for n in cache.nodes()}
    assert set(frame.index) == set(nodes)
    for node_id, row in frame.iterrows():
        assert bool(row["has_state"]) == (nodes[node_id].mamba_value is not None)
    stem = next(iter(cache.root_node.children.values()))
    assert not frame.loc[stem.id, "has_state"] and stem.children  # the evicted state left a tombstone inside
    before = int(frame["has_state"].sum())
    freed = cache.evict(0, mamba_num=1)
    after = h.state_frame(cache)
    assert int(after["has_state"].sum()) == before - freed.mamba_num_evicted == before - 1
    cache.check_invariants()


def test_state_eviction_is_a_tree_of_its_own_so_before_and_after_stay_apart():
    """Notebook 03 shows a widget and a table of the tree before, then of the tree after the state eviction:
    each pair must show one moment, and the 'after' eviction must not change what 'before' shows."""
    from kvlab.mem_cache.tree_view import SPANS
    from kvlab.viz.tree_widget import RadixTreeWidget

    before, _ = h.resume_scenario()
    before_view = RadixTreeWidget(before, names=SPANS)
    before_table = h.state_table(before)
    after, freed = h.state_eviction()
    after_view = RadixTreeWidget(after, names=SPANS)
    assert after is not before and freed.mamba_num_evicted == 1 and freed.evicted_tokens > 0
    assert list(before_view.figure.data[0].ids) == [str(i) for i in before_table.index]
    assert list(h.state_table(before).index) == list(before_table.index)  # untouched by the eviction
    after_table = h.state_table(after)
    assert list(after_view.figure.data[0].ids) == [str(i) for i in after_table.index]
    assert len(after_table) == len(before_table) - 1
    assert list(before_view.figure.data[0].labels) == list(before_table["where in the sequence"])
    assert "tokens 1–8 · no state" in set(before_table["where in the sequence"])


def test_tables_are_in_words_and_human_units():
    df = h.eviction_mode_comparison()
    table = h.comparison_table(df)
    assert list(table["eviction"]) == ["full (the bug)", "shortfall (the fix)"] * 2  # issue 35: bug | fix
    assert list(table["tree"]) == ["plain radix tree"] * 2 + ["Mamba radix tree"] * 2
    mamba_full = df[(df["cache"] == "mamba") & (df["mode"] == "full")].iloc[0]
    assert table.iloc[2]["hit rate"] == f"{mamba_full['hit_rate']:.2%}"
    assert table.iloc[2]["extra prefill of full eviction"] == (
        f"{int(mamba_full['extra_prefill_tokens']):,} ({mamba_full['extra_prefill_pct']:.2f} %)")
    cache, _ = h.resume_scenario()
    states = h.state_table(cache)
    assert list(states.columns) == ["parent", "where in the sequence", "tokens", "status", "recurrent state",
                                    "state slot"]
    assert states.index.name == "node"
