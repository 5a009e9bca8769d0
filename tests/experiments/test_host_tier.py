"""Notebook 07's experiments on a real two-tier tree (kvlab.experiments.host_tier): what one pressure event demotes
and destroys under each write policy and host size, the write policies side by side, and the write_back leaf."""

from __future__ import annotations

import pytest

from kvlab.experiments import host_tier as ht


@pytest.fixture(scope="module")
def events():
    return ht.pressure_events()


def fates(event) -> dict[str, str]:
    return dict(zip(event.fates["name"], event.fates["fate"]))


def test_a_backed_up_node_is_demoted_not_destroyed(events):
    e = events[("write_through", ht.EVENT_HOST_RATIO, "shortfall")]
    f = fates(e)
    assert f["conversation 1"] == f["conversation 2"] == ht.DEMOTED  # both were on host too: nothing is lost
    assert e.destroyed == () and e.evict.destroyed_tokens == 0
    assert e.evict.demoted_tokens == e.evict.evicted_tokens == 200 + 250
    row = e.fates.set_index("name").loc["conversation 1"]
    assert (row["before"], row["after"]) == ("both", "host")
    assert e.written_bytes == 0  # a demotion copies nothing


def test_under_write_back_the_unbacked_leaf_is_written_first_and_the_eviction_waits(events):
    e = events[("write_back", ht.EVENT_HOST_RATIO, "shortfall")]
    f = fates(e)
    assert f["conversation 1"] == f["conversation 2"] == ht.WRITTEN_BACK
    assert e.evict.written_back_tokens == e.evict.demoted_tokens == 450 and e.evict.destroyed_tokens == 0
    assert e.written_bytes == 450 * ht.SIZE_PER_TOKEN_BYTES
    assert e.stall_s > 0  # write_back eviction blocks on its copies
    leaf = ht.write_back_leaf_eviction(False, 300, 1000)
    assert (leaf.outcome, leaf.written_tokens) == (ht.WRITE_THEN_DEMOTE, 300)


def test_full_eviction_destroys_what_shortfall_keeps_only_where_there_is_no_host_copy(events):
    for policy, ratio in ht.EVENT_SCENARIOS:
        fix, bug = (events[(policy, ratio, m)] for m in ("shortfall", "full"))
        assert (fix.evict.requested_tokens, bug.evict.requested_tokens) == (300, 600)
        assert (fix.evict.evicted_tokens, bug.evict.evicted_tokens) == (450, 850)  # conversation 4 too
    destroyed_by_bug_only = {
        (p, r): set(events[(p, r, "full")].destroyed) - set(events[(p, r, "shortfall")].destroyed)
        for p, r in ht.EVENT_SCENARIOS}
    assert destroyed_by_bug_only == {
        ("write_through", 0.5): {"conversation 4"},  # the host pool was full when it was inserted
        ("write_through_selective", 0.5): {"conversation 4"},  # hit once: never backed up
        ("write_back", 0.5): set(),  # written first: the bug costs a bigger write, nothing is lost
        ("write_back", 0.2): {"conversation 4"},  # the write-back does not fit: host full too
    }
    assert fates(events[("write_back", 0.2, "full")])["conversation 4"] == ht.HOST_FULL
    assert fates(events[("write_through", 0.5, "full")])["conversation 4"] == ht.NOT_BACKED_UP
    wb_fix, wb_bug = (events[("write_back", 0.5, m)] for m in ("shortfall", "full"))
    assert wb_bug.written_bytes - wb_fix.written_bytes == 400 * ht.SIZE_PER_TOKEN_BYTES
    sel = events[("write_through_selective", 0.5, "shortfall")]
    assert sel.destroyed == ("conversation 2",)  # hit once, so even the fix destroys it


def test_the_event_table_is_the_events(events):
    frame = ht.events_frame(events)
    assert len(frame) == 2 * len(ht.EVENT_SCENARIOS)
    bug = frame[(frame["write policy"] == "write_through") & (frame["eviction"] == "full (the bug)")].iloc[0]
    assert (bug["destroyed"], bug["conversations destroyed"], bug["host pool (tokens)"]) == (400, "conversation 4",
                                                                                             2049)


@pytest.mark.parametrize("case, outcome, host_evicted", [
    ((True, 300, 0, 0), ht.DEMOTE, 0),
    ((False, 300, 100, 0), ht.DESTROY, 0),
    ((False, 300, 100, 250), ht.WRITE_THEN_DEMOTE, 250),  # a host-only leaf is evicted to make room
    ((False, 300, 100, 150), ht.DESTROY, 150),  # evicted for nothing: still no room
    ((False, 300, 0, 0), ht.DESTROY, 0),
])
def test_write_back_leaf_eviction_on_a_real_tree(case, outcome, host_evicted):
    leaf = ht.write_back_leaf_eviction(*case)
    assert (leaf.outcome, leaf.host_evicted_tokens) == (outcome, host_evicted)


def test_write_back_leaf_eviction_names_bad_input():
    with pytest.raises(ValueError, match="node_tokens must be >= 1"):
        ht.write_back_leaf_eviction(False, 0, 10)
    with pytest.raises(ValueError, match="host_free_tokens must be an int >= 0, got -1"):
        ht.write_back_leaf_eviction(False, 10, -1)


@pytest.fixture(scope="module")
def runs():
    return ht.policy_runs()


def test_the_token_account_closes_in_every_run(runs):
    for run in runs.values():
        assert run.device_hit_tokens + run.loaded_back_tokens + run.computed_tokens == run.prompt_tokens
        assert run.loaded_back_tokens <= run.host_hit_tokens
        assert run.demoted_tokens + run.destroyed_tokens == run.evicted_tokens


def test_write_policies_side_by_side(runs):
    wt, sel, wb = (runs[(p, "shortfall")] for p in ht.POLICIES)
    assert wt.destroyed_tokens == wb.destroyed_tokens == 0 < sel.destroyed_tokens  # selective: hit-once is lost
    assert sel.written_to_host_tokens < wb.written_to_host_tokens < wt.written_to_host_tokens
    assert wt.hit_rate == wb.hit_rate > sel.hit_rate
    assert wt.host_hit_tokens > 0 and wt.hit_rate > wt.device_hit_rate


def test_with_a_large_host_pool_full_eviction_costs_no_hits_only_copies(runs):
    for policy in ht.POLICIES:
        fix, bug = runs[(policy, "shortfall")], runs[(policy, "full")]
        assert bug.hit_rate == fix.hit_rate
        assert bug.evicted_tokens > fix.evicted_tokens
    assert runs[("write_back", "full")].written_to_host_tokens > runs[("write_back", "shortfall")].written_to_host_tokens


def test_policy_frame_shows_the_runs(runs):
    frame = ht.policy_frame(runs, "shortfall")
    assert list(frame.columns) == list(ht.POLICIES)
    assert frame.loc["written to host", "write_back"] == f"{runs[('write_back', 'shortfall')].written_to_host_tokens:,}"
    assert frame.loc["hit rate (device + loaded back)", "write_through"] == \
        f"{runs[('write_through', 'shortfall')].hit_rate:.2%}"


def test_host_tier_demo_loads_back_demotes_and_resets():
    demo = ht.HostTierDemo(write_policy="write_through", seed=0)  # host pool: twice the device pool (the default)
    for _ in range(30):
        demo.next_request()
    assert any(s.loaded_back_tokens for s in demo.history)  # a host hit was loaded back
    step = demo.pressure_event()
    assert step.evict.shortfall_tokens == 256 and step.evict.demoted_tokens > 0
    residencies = {n.residency for n in demo.cache.nodes() if n is not demo.cache.root_node}
    assert residencies == {"both", "host"}  # write_through: every node on the device also has a host copy
    assert "demoted to host" in step.text()
    demo.write_policy = "write_back"
    demo.reset()
    assert demo.requests_run == 0 and demo.cache.write_policy == "write_back"
    with pytest.raises(ValueError, match="write_policy must be one of"):
        ht.HostTierDemo(write_policy="write_around")
