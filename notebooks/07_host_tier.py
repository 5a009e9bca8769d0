# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · The host tier: SGLang's hierarchical KV cache (HiCache)
#
# Notebooks 02 and 03 have one KV tier: the GPU radix tree. SGLang has three, and engineers meet them on day one:
#
# | tier | what it holds | where it lives in SGLang (0.5.16, `python/sglang/srt/`) | flags | in kvlab |
# | --- | --- | --- | --- | --- |
# | **L1**, GPU | the radix tree's KV, in the device pool | `mem_cache/radix_cache.py::RadixCache`, or `mem_cache/hiradix_cache.py::HiRadixCache` with HiCache on; slots from `mem_cache/allocator.py`, KV in `mem_cache/memory_pool.py` | `--mem-fraction-static`, `--page-size` | `kvlab.mem_cache.radix_cache`, `kvlab.mem_cache.hicache.hiradix_cache` |
# | **L2**, host memory | copies of tree nodes in pinned host RAM | `mem_cache/memory_pool_host.py::HostKVCache` (`pool_host/`); copies by `managers/cache_controller.py::HiCacheController` (`write`, `load`, `evict_host`) | `--enable-hierarchical-cache`, `--hicache-ratio` / `--hicache-size`, `--hicache-write-policy` | `kvlab.mem_cache.hicache.memory_pool_host`, `cache_controller` |
# | **L3**, storage | pages by hash in a KV store or on disk | `mem_cache/hicache_storage.py::HiCacheStorage` (`HiCacheFile`), backends in `mem_cache/storage/` (`mooncake_store`, `hf3fs`, `nixl`, …); prefetch in `HiRadixCache.prefetch_from_storage` / `check_prefetch_progress` | `--hicache-storage-backend`, `--hicache-storage-prefetch-policy best_effort \| wait_complete \| timeout` | `kvlab.mem_cache.hicache.storage` (section 7) |
#
# A node of the two-tier tree is on the **device only**, on **both** tiers, or on the **host only**. A hit on a
# host-only node is **loaded back** (host → device) before the request runs; a node gets a host copy when it is
# **written** (device → host) — at once (`write_through`), on its second hit (`write_through_selective`) or only
# when it is evicted from the device (`write_back`). kvlab's `HiRadixCache` follows SGLang 0.5.16's rules and is
# checked against SGLang's own class (`tests/mem_cache/test_differential_hicache.py`; docs/semantics.md, "HiCache
# (host tier)"). Copies take time on a modelled clock: bytes over the host link's bandwidth, one figure for the
# whole notebook (printed below).
#
# **Finding 2 changes meaning here.** Up to 0.5.16 SGLang asked the tree to evict all `num_tokens` instead of the
# shortfall (notebook 02). With a host tier a device node that is backed up is *demoted* to host, not lost: the
# bug then costs copies (a load-back later, a write-back now) rather than recomputation — unless the host pool is
# full too.

# %%
from kvlab.experiments import host_tier, host_tier_sweep
from kvlab.viz import host_tier_plots

# %% [markdown]
# ## 1 · One pressure event with a host tier
# Notebook 02's tree: six conversations behind a 1,024-token system prompt, on a device pool of 4,096 tokens. They
# are served in the order 1, 2, 1, 3, 4, 3, 5, 6: conversations 1 and 3 are asked twice, so the least recently used
# order is 2, 1, 4, 3, 5, 6. Then an allocation needs 600 slots with 300 free: the shortfall is 300, the bug asks
# for 600. Four scenarios, one per row below:
#
# - `write_through` with a host pool of 2,049 tokens (`--hicache-ratio 0.5`): every node is written as it is
#   inserted, until the host pool is full — conversations 4, 5 and 6 found it full and were never backed up;
# - `write_through_selective`, same pool: only what was hit twice (the system prompt, conversations 1 and 3);
# - `write_back`, same pool: nothing is on host until eviction writes it;
# - `write_back` with a host pool of 820 tokens (`--hicache-ratio 0.2`): the write-backs do not all fit.

# %%
print(host_tier.host_link_text())
events = host_tier.pressure_events()
host_tier.events_table(events)

# %% [markdown]
# The trees as icicles, as in notebook 02, all at the scale of the tree before the event; colour is where a
# node's KV lives. What the event destroyed (gone from both tiers) stays in place, grey and hatched.

# %%
rows = []
for policy, ratio in host_tier.EVENT_SCENARIOS:
    first = events[(policy, ratio, "shortfall")]
    rows.append((host_tier.scenario_label(policy, ratio, first.host_tokens), first.frame_before,
                 [events[(policy, ratio, mode)].frame_after for mode in ("full", "shortfall")]))
host_tier_plots.host_tier_icicles(
    rows, ["before the event", "after full eviction (the bug)", "after shortfall eviction (the fix)"])

# %%
for (policy, _ratio, mode), e in sorted(events.items(), key=lambda kv: kv[0][2] == "shortfall"):
    print(f"{policy:24} host {e.host_tokens:>5,}  {mode:9}  demoted: {', '.join(e.demoted) or '-':32} "
          f"destroyed: {', '.join(e.destroyed) or '-'}")
bug, fix = events[("write_through", 0.5, "full")], events[("write_through", 0.5, "shortfall")]
assert set(fix.destroyed) == set() and bug.evict.destroyed_tokens == 400  # conversation 4: never backed up
wb_bug, wb_fix = events[("write_back", 0.5, "full")], events[("write_back", 0.5, "shortfall")]
assert not wb_bug.destroyed and wb_bug.written_bytes > wb_fix.written_bytes  # the bug's cost: a bigger write

# %% [markdown]
# What to read from it:
#
# - **A backed-up node is demoted, not destroyed** (orange). Under `write_through` both modes demote conversations
#   1 and 2; the bug also evicts conversation 4, which the host pool had no room to back up: that one is destroyed.
# - **Under `write_through_selective`** only nodes hit twice have a copy; conversation 2 (hit once) is destroyed
#   even by the fix.
# - **Under `write_back`** nothing is lost while the host pool has room: every victim is written first. The bug's
#   cost is the write of what it evicted too early (conversation 4: 400 tokens; the table's "MiB written to host")
#   — and the eviction waits for that copy.
# - **Once the host pool is full too** (last row), the bug destroys again: conversation 4's write-back does not fit
#   in 820 host tokens, so it is dropped from both tiers.

# %% [markdown]
# ## 2 · Write policies side by side, on the shipped trace
# The scheduler (`kvlab simulate`) with a host tier, once per write policy: the 200 requests of
# `data/traces/mooncake_small.jsonl`, 512-token pages, 16 running, a device pool of 157 pages (80,384 tokens: a
# sixteenth of what the trace's distinct prompts would need), host pools of once and twice the device pool
# (`--hicache-ratio 1` and `2`), shortfall eviction (section 4 compares the modes). Hit rate counts prompt tokens
# served from either tier: device hits plus tokens loaded back. What each policy does:
#
# - `write_through` copies every node to host as it is inserted, eviction or not;
# - `write_through_selective` copies a node on its second hit: what was hit once is not backed up, and is
#   destroyed when the device evicts it;
# - `write_back` copies a node only when the device evicts it (the eviction waits for the copy).
#
# Which policy gets the most hits is not a rule: it is read from the runs and printed under the figure.

# %%
policy_sweep = host_tier_sweep.host_sweep(kv_pages=[host_tier_sweep.CURVE_POOL_PAGES],
                                          host_ratios=host_tier_sweep.POLICY_HOST_RATIOS,
                                          policies=host_tier_sweep.POLICIES)
policies = host_tier_sweep.policy_numbers(policy_sweep)
host_tier_sweep.policy_table(policies)

# %%
host_tier_plots.policy_bars(policies)

# %%
print(host_tier_sweep.policy_verdict(policies))
for ratio in host_tier_sweep.POLICY_HOST_RATIOS:  # the verdict is the runs' own ranking
    ranking = host_tier_sweep.policy_ranking(policies, ratio)
    assert ranking[0][1] == policies[policies["host_ratio"] == ratio]["hit_rate"].max()

# %% [markdown]
# Why the order comes out so: a host pool under `write_through` holds a copy of everything the device holds, so
# until it is much larger than the device pool most of it duplicates the device, and what the device evicts
# finds little room; the other two policies spend host memory only on what has left the device (`write_back`) or
# was reused (`write_through_selective`). Every policy copies far more than it loads back: the table's GiB columns
# are the traffic each pays on the host link.

# %% [markdown]
# ## 3 · Hit rate against host size, per write policy
# The same trace and device pool, host pools of 1 to 8 times the device pool (`--hicache-ratio`; 0: no host tier),
# one line per write policy (shortfall eviction). Host size is in GiB of Llama-3-8B KV (128 KiB per token).

# %%
sizes = host_tier_sweep.host_sweep(kv_pages=[host_tier_sweep.CURVE_POOL_PAGES],
                                   host_ratios=host_tier_sweep.CURVE_HOST_RATIOS, policies=host_tier_sweep.POLICIES)
host_tier_plots.hit_rate_vs_host_size(host_tier_sweep.hit_rate_frame(sizes, host_tier_sweep.CURVE_POOL_PAGES))

# %%
curve = host_tier_sweep.curve_table(sizes)
curve

# %%
print(host_tier_sweep.host_gain_text(curve))
print("the same runs from a shell, e.g. the largest host pool under write_back:")
largest = host_tier_sweep.HostPoint(host_tier_sweep.CURVE_POOL_PAGES, max(host_tier_sweep.CURVE_HOST_RATIOS),
                                    "write_back", "shortfall")
print("kvlab simulate " + " ".join(largest.cli_args()) + " --json")
for policy in host_tier_sweep.POLICIES:  # more host memory never loses hits here
    assert curve[f"hit rate, {policy}"].is_monotonic_increasing

# %% [markdown]
# The policy decides what a small host pool is worth: under `write_through` it duplicates what the device already
# holds, so a host pool the size of the device pool adds little, while the same pool under `write_back` holds only
# what the device evicted. Once the host pool is several times the device pool, the duplicates no longer matter
# and the policies meet. A load-back is far cheaper than recomputing: copying a 512-token page of Llama-3-8B KV
# (64 MiB) over the host link takes about a millisecond.
#
# The README's HiCache line is the same kind of run, at a smaller device pool (100 pages) and a host pool four
# times its size, computed here:

# %%
print(host_tier_sweep.hicache_headline().text())

# %% [markdown]
# ## 4 · Finding 2 with a host tier
# Both eviction modes with HiCache on, over device pool × host ratio × write policy (the same trace; each cell two
# runs). The number is the hit rate lost to full eviction, in points; the first panel is the device-only server of
# notebooks 02 and 06.

# %%
regimes = host_tier_sweep.host_sweep(kv_pages=host_tier_sweep.REGIME_POOL_PAGES,
                                     host_ratios=(0.0, *host_tier_sweep.REGIME_HOST_RATIOS),
                                     policies=host_tier_sweep.POLICIES)
finding2 = host_tier_sweep.finding2_frame(regimes)
unique_pages = host_tier_sweep.unique_prompt_pages()
host_tier_plots.host_regime_heatmap(host_tier_sweep.regime_frame(finding2, unique_pages))

# %% [markdown]
# What over-eviction costs once a host tier is there, as every kvlab table shows a bug beside its fix: the bug's
# hit rate, the fix's, then **fix − bug** (positive where the fix has more): points of hit rate, prompt tokens
# served from a tier, GiB copied between host and device (both directions) and transfer seconds. A negative
# GiB or seconds difference is the bug's extra copying.

# %%
host_tier_sweep.finding2_table(finding2)

# %%
print(host_tier_sweep.finding2_verdict(finding2))

# %% [markdown]
# How to read it:
#
# - **Without a host tier** (first panel) the bug costs a few tenths of a point at these small pools (notebook 06
#   maps the rest of the pool sizes: from about an eighth of the trace's distinct prompts on, nothing).
# - **A host pool four times the device pool, written through, makes the bug free**: what full eviction evicts
#   early is demoted to host and loaded back when it is asked for, so both modes hit exactly the same tokens. The
#   bug's price there is copies only — the GiB and transfer seconds in the table (a negative fix − bug is the
#   bug's extra copying), which SGLang overlaps with compute (a load-back runs under the prefill, a write-through
#   never blocks it).
# - **Where the host tier is small or full too** (ratio 1, or `write_back` at the smallest pool), an early
#   eviction can still destroy what has no host copy — a node the full host pool could not back up, or a
#   write-back that does not fit — and the bug costs hits again, though less than without a host tier.
# - **`write_through_selective`** costs nothing in these cells: it backs up only what was hit twice, so the host
#   pool is not full of one-off prompts, and what the bug evicts early is the reused part that has a copy.

# %%
no_cost = finding2[(finding2["write_policy"] == "write_through") & (finding2["host_ratio"] == 4.0)]
assert (no_cost["gap_points"] == 0).all() and (no_cost["lost_hit_tokens"] == 0).all()  # really nothing
device_only = finding2[finding2["write_policy"] == host_tier_sweep.DEVICE_ONLY]
assert (device_only["gap_points"] > 0).all()  # ...where the device-only server loses hits at the same pools

# %% [markdown]
# ## 5 · Exercise: device eviction under `write_back`
# `my_write_back_evict(backed_up, node_tokens, host_free_tokens, host_evictable_tokens)` says what device
# eviction does to one unlocked device leaf under `write_back`: `"demote"` (it has a host copy: free its device
# slots, keep it on host), `"write then demote"` (copy it to host first) or `"destroy"` (gone from both tiers).
# `host_free_tokens` are free in the host pool; `host_evictable_tokens` sit in a host-only leaf that host eviction
# may free to make room. As given it is the write-through policies' rule. Fix it, then run the check: it builds
# each case on a real `HiRadixCache` under `write_back`, evicts the leaf and compares.

# %%
def my_write_back_evict(backed_up, node_tokens, host_free_tokens, host_evictable_tokens):
    if backed_up:
        return "demote"  # _evict_backuped: free the device slots, keep the host copy
    return "destroy"  # _evict_regular: what write_through does to a leaf without a host copy


# %%
from kvlab.labs import host_tier as lab

lab.write_back.check(my_write_back_evict)

# %% [markdown]
# The reference solution is below when solutions are on: `KVLAB_SOLUTIONS=1 jupyter lab`, or
# `kvlab app 07 --solutions` for a workshop.

# %%
lab.write_back.solution

# %% [markdown]
# ## 6 · Watch the two tiers as requests run
# A two-tier cache (4,096 device tokens, a host pool twice that: SGLang's default `--hicache-ratio 2`) serving chat
# turns. **next request** runs
# one turn (loading back what it finds on host); **pressure event** is a batch that needs 256 slots more than are
# free. Green nodes are on the device only, blue on both tiers, orange on host only; a red outline is a locked path.
# Switch the write policy: the same steps (the 30 requests and any pressure events) run again under it, so the
# trees compare on one history. A gold outline marks what the last step changed; under `write_back` the log says
# how many tokens a pressure event wrote to host before freeing them.

# %% tags=["dashboard"]
from kvlab.viz.tree_widget import HostTierPanel

host_panel = HostTierPanel(start_requests=30, seed=0)
host_panel.widget

# %% [markdown]
# ## 7 · The third tier and SGLang's multi-turn benchmark
# SGLang's `benchmark/hicache/bench_multiturn.py` as sglang#33984 ran it: 20 clients, 9 rounds, request 4,096
# tokens, output 1, round barrier, page 64 (`kvlab simulate --workload multiturn`), here with 4 requests in flight
# and a device pool of 122,880 tokens, far too small: the conversations grow to about 737k tokens. Host tier
# `--hicache-ratio 2`, storage a file store that holds everything (`--hicache-storage-backend file`, unbounded).
# Per round, where its hits came from: the device, the host (loaded back) or storage (read by a prefetch into host,
# then loaded back). The stack's top is the script's "Cache Hit Rate" (the table's "hit rate"); the dash is the
# no-eviction ideal. The table's tier columns are shares of the round's prompt tokens.

# %%
from kvlab.experiments import multiturn_tiers
from kvlab.viz import multiturn_plots

tiers = multiturn_tiers.tier_rounds(multiturn_tiers.run())
multiturn_plots.round_tier_bars(tiers)

# %%
print("kvlab simulate " + " ".join(multiturn_tiers.DEFAULT.cli_args()) + " --json")
multiturn_tiers.rounds_table(tiers)

# %% [markdown]
# ### 7.1 · "My SSD holds everything, yet the hit rate drops in the last rounds" (sglang#33984)
# Every setting below has storage that holds everything; only the prefetch policy and the host ratio change.

# %%
dropoff = multiturn_tiers.dropoff_frame()
print(multiturn_tiers.dropoff_text(dropoff))
dropoff

# %% [markdown]
# Why: once the conversations outgrow device + host, each round's history is found in storage, and a storage hit
# counts only if its prefetch has landed in host when the request is scheduled. `best_effort` (SGLang's default)
# schedules the request with whatever has landed and gives the rest up (the "prefetch gave up" tokens), so the
# rate falls below the ideal from the round where device + host stop holding the history — later with a larger
# `--hicache-ratio`. `wait_complete` (and `timeout`, whose deadline these prefetches meet) waits for every page:
# the rate stays on the ideal as long as the host pool has room for the prefetches themselves (at ratio 1 it does
# not). The wait goes into TTFT, yet the mean TTFT (last column) is lower than `best_effort`'s at every ratio here:
# reading 4,096 tokens of KV from storage is quicker than computing them again. Switch the controls: the bars, the
# table and the verdict follow.

# %%
ttft = dropoff.set_index(["host_ratio", "prefetch_policy"])["mean_ttft_s"]
assert all(ttft[(r, "wait_complete")] < ttft[(r, "best_effort")] for r in multiturn_tiers.HOST_RATIOS)

# %% tags=["dashboard"]
from kvlab.viz.multiturn_panel import MultiturnTierPanel

tier_panel = MultiturnTierPanel()
tier_panel.widget

# %% [markdown]
# ### 7.2 · Finding 2 across three tiers
# Both eviction modes at `--hicache-ratio 2`, `best_effort`: storage that holds everything, and a store of 18.6 GiB (`--hicache-storage-size 20`)
# (about a fifth of the benchmark's 90 GiB of KV at 128 KiB per token). Bug | fix | fix − bug (positive: the fix has more).

# %%
finding2_l3 = multiturn_tiers.finding2_frame()
multiturn_tiers.finding2_table(finding2_l3)

# %% [markdown]
# The same under `wait_complete`, where a request waits for its prefetch (the waits are in its TTFT):

# %%
finding2_wait = multiturn_tiers.finding2_frame(policy="wait_complete")
multiturn_tiers.finding2_table(finding2_wait)

# %%
print(multiturn_tiers.finding2_text(finding2_l3, finding2_wait))

# %% [markdown]
# Why the bug is free here: under `write_through` every node is copied to host as it is inserted (and on to
# storage as its host copy lands), so what full eviction frees early is demoted, not lost, and comes back the way
# the fix's evictions do; the bug's price is copies. A store too small for the benchmark loses its hits to its own
# eviction in both modes: it drops the least recently used pages, which are each conversation's first pages, and a
# prefetch matches a prompt page by page from the first, so what is left of a conversation is out of reach.

# %% [markdown]
# ### 7.3 · The published table beside kvlab's
# sglang#33984's "hicache ratio=2" table (https://github.com/sgl-project/sglang/issues/33984). The notebook writes
# it itself as a one-record table file from the published numbers (so it runs wherever the notebook runs: the
# curated `../shared/real-data` file is not shipped) and runs `kvlab simulate --compare-table` on it. The issue
# gives no device pool: kvlab assumes one that holds the benchmark, and says so in the figure.

# %%
published = multiturn_tiers.published_comparison()
print(f"kvlab simulate --compare-table {multiturn_tiers.TABLE_FILE}  "
      f"# the file: multiturn_tiers.write_published_table({multiturn_tiers.TABLE_FILE!r})")
multiturn_plots.rounds_vs_published(published)

# %%
for row in published.as_dict()["rounds"]:  # every round equal to the published rate, to 6 decimals
    assert row["simulated_cache_hit_rate"] == row["measured_cache_hit_rate"], row
