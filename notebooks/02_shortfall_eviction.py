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
# # 02 · Evicting the cache: only the shortfall
#
# When SGLang's KV allocator may be short of `num_tokens` slots (every prefill allocation, every decode round
# under memory pressure), it calls `evict_from_tree_cache(tree_cache, num_tokens)` to free cached prefixes from
# the radix tree. Up to SGLang 0.5.16 its standard arm read
#
# ```python
# if allocator.available_size() < num_tokens:
#     tree_cache.evict(EvictParams(num_tokens=num_tokens))
# ```
#
# — it asked the tree for **all** `num_tokens`, although `available` slots were already free. The fix (0.5.17)
# asks for the shortfall:
#
# $$\text{evict} = \text{num\_tokens} - \text{available}$$
#
# In kvlab this rule is one line of one function, `kvlab/mem_cache/shortfall.py::tokens_to_evict`, and every
# engine behind this notebook's numbers runs it (the page engine, the token-level tree, the host tier's load-back).
#
# Below, **shortfall (the fix)** and **full (the bug)** are the two modes of kvlab's real radix cache and
# allocators (SGLang's names and rules) under a model of SGLang's scheduler, on the same seeded workloads.
#
# **Words used here**
#
# - A **pressure event** is one call that finds fewer than `num_tokens` free slots and so asks the tree to evict.
# - Its **shortfall** is what was truly missing: `num_tokens − available`.
# - **Over-eviction** (full mode only) is what one pressure event evicts *beyond its shortfall* because the
#   tree was asked for all of `num_tokens`. Those prefixes are evicted **earlier than needed** — not
#   necessarily *lost*: the pool is full of cache in both modes, so the fix evicts the same least-recently-used
#   prefixes at its next pressure events. Over-eviction costs a cache hit only when one of those prefixes is
#   asked for again in between.
# - **Overshoot** (both modes): the tree frees whole leaves, so the last leaf can free more than was asked.
#
# So the bug changes **when** cached prefixes are destroyed much more than **how many**. Whether that costs hit
# rate depends on the regime; section 3 maps where it does and where it is negligible.

# %%
import pandas as pd

from kvlab.experiments import eviction_regimes, shortfall_eviction
from kvlab.viz import eviction_plots

# %% [markdown]
# ## 1 · One pressure event
# Six cached conversations share a 1,024-token system prompt. A new allocation needs 600 slots; 300 are free.
# The shortfall is 300 — the bug asks the tree for 600.

# %%
events = {mode: shortfall_eviction.pressure_event(mode) for mode in shortfall_eviction.MODES}
shortfall_eviction.events_frame(events)

# %% [markdown]
# The trees as icicles, root on the left, all three at the scale of the tree before the event: a node is as tall
# as the cached sequences through it. What an eviction destroyed stays in place, grey and hatched, so the tree that is left is
# drawn at its true size. Full eviction destroyed one more conversation than it had to.

# %%
eviction_plots.radix_icicles_before_after(
    events["full"].frame_before, [events["full"].frame_after, events["shortfall"].frame_after],
    ["before the event", "after full eviction (the bug)", "after shortfall eviction (the fix)"])

# %%
extra = set(events["full"].destroyed) - set(events["shortfall"].destroyed)
print("destroyed only by full eviction:", sorted(extra))
assert extra and events["shortfall"].evict.over_evicted_tokens == 0

# %% [markdown]
# ## 2 · A whole workload where the bug shows
# SGLang bench_serving's *generated-shared-prefix* workload with many small groups — 64 system prompts of 512
# tokens, 8 short questions each, 512 requests at once — through a pool of 32,768 tokens in 128-token pages
# (`shortfall_eviction.PANEL_DEFAULTS`). Same requests, same order, same scheduler; only the eviction differs.
#
# The table shows the bug's column, the fix's, then the difference **fix − bug** (every kvlab table, the report
# and `kvlab simulate --compare` use this order and sign). Its first rows are an account that closes in each
# column: prompt tokens served from the cache + prompt tokens prefilled at first admission = the workload's prompt
# tokens; add what was prefilled *again* after a retraction (a retracted request recomputes its prompt and outputs
# so far, less what it matches then) and you have every token prefilled. The verdict below splits the bug's extra
# prefill along the same lines: cache hits it lost to early eviction, and re-prefill after retractions.

# %%
settings = shortfall_eviction.PANEL_DEFAULTS
comparison = shortfall_eviction.panel_comparison(settings)
comparison.summary_frame()

# %%
print(comparison.verdict())

# %% [markdown]
# ### Over-eviction is early eviction
# Both modes on the same axes, over the modelled server's time. Top: tokens evicted so far; dotted, what full
# eviction evicted *beyond the shortfall* of its pressure events. The dotted line climbs far above the gap
# between the two solid lines: most of what the bug evicts early, the fix evicts too, a little later. What is
# lost is only what was asked for again in between — here enough to show in the hit rate (bottom).

# %%
eviction_plots.cumulative_eviction(comparison.cumulative_frame())

# %% [markdown]
# ### Pressure events and overshoot
# The fix has **more** pressure events than the bug: each time it evicts only what is missing, so the pool is
# full again at once and the next allocation is short again; the bug evicts up to `available` more, and the
# slots it leaves free carry the next allocations for a while without evicting. For the same reason the fix has
# more **overshoot**: it asks for less each time, so the last whole leaf is a larger part of each request, and it
# asks more often. The bug's price shows in the last rows: averaged over time it keeps more slots free and
# fewer tokens cached.

# %%
comparison.pressure_summary()

# %% [markdown]
# Why this regime: with 128-token pages SGLang's decode step asks, every round, for a page per running request
# (about fifty here, so over 6,000 tokens), while few of them open a page. At such a pressure event thousands of
# slots are free already, and the bug evicts as many again on top — from a cache that, beside the running
# requests, holds only about nine of the 64 system prompts (the last row of the table above, in tokens). In this
# workload a system prompt evicted early is often asked for again before the fix would have evicted it.

# %% [markdown]
# ## 3 · Where the bug costs hit rate, and where it does not
# Each cell runs both modes once (seeded; about ten seconds in all, then remembered). Columns are pool sizes as a
# share of the workload's distinct prompt tokens — at 100 % the pool could cache every prompt once, were nothing
# running. The number is the hit rate lost to full eviction, in percentage points. The lower panel is notebook
# 03's workload replayed straight against a plain radix tree and a Mamba tree (recurrent states, 16 slots).

# %%
regimes = eviction_regimes.regime_sweep(processes=2)
hybrid = eviction_regimes.hybrid_sweep()
eviction_plots.regime_heatmap(pd.concat([regimes, hybrid], ignore_index=True))

# %%
worst = regimes.loc[regimes.groupby("regime", sort=False)["gap_points"].idxmax()]
for row in worst.itertuples():
    print(f"{row.regime}: full eviction loses at most {row.gap_points:.2f} points (pool {row.kv_tokens:,} tokens, "
          f"hit rate {row.hit_rate_full:.2%} → {row.hit_rate_shortfall:.2%}, bug → fix)")

# %% [markdown]
# How to read it:
#
# - **Large pools cost little or nothing.** Once the pool could hold every prompt (100 %) the difference is under
#   a point; at 150 % it is zero everywhere.
# - **With 1-token or 16-token pages the difference is negligible to small**: about a point at most, often zero.
#   Pressure events then have few free slots, so the bug over-evicts little at a time, and what it evicts early
#   the fix evicts soon after anyway.
# - **The Mooncake-shaped trace is negligible at every pool size.** It was measured at full size too: a
#   12,000-request trace with 4,000 pages of 512 tokens and 16 running requests
#   (`python benchmarks/make_mooncake_trace.py --out /tmp/mc12k.jsonl --num-requests 12000 --seed 0` then
#   `kvlab simulate --trace /tmp/mc12k.jsonl --kv-pages 4000 --max-running 16 --compare`) gives hit rates of
#   38.25 % (shortfall) and 38.24 % (full), 87,968,256 vs 87,983,616 tokens evicted — although full eviction
#   evicted 39,340,032 tokens earlier than needed, over 8,620 pressure events against the fix's 12,838.
# - **The bug is visible where pages are large and the pool holds part of a reused working set** (top row,
#   about half the prompts): up to about five points.
# - **On a Mamba tree** over-eviction costs as much as on a plain tree or more, at every pool size (lower panel,
#   checked below), though here by a point or two at most: a Mamba prefix can only be resumed where a recurrent
#   state was kept, and states are scarce, so losing a leaf can take its stateless ancestors with it. Notebook 03
#   shows one such run in detail.

# %%
mamba, plain = (hybrid[hybrid["regime"] == name].set_index("share")["gap_points"]
                for name in ("chat replay, Mamba tree", "chat replay, plain radix tree"))
assert (mamba >= plain).all()
eviction_regimes.gap_table(hybrid)

# %% [markdown]
# ## 4 · Try it live
# Toggle the mode, change the pool size, the workload or the radix-cache eviction policy. Section 2's regime is
# `shortfall_eviction.PANEL_DEFAULTS`; most other settings show the small or zero differences of section 3.

# %% tags=["dashboard"]
from kvlab.viz.widgets import ShortfallPanel

panel = ShortfallPanel()
panel.widget

# %% [markdown]
# ## 5 · Watch the tree as requests run
# A small radix cache (4,096 KV slots) serving chat turns: eight conversations behind two system prompts, each
# turn's prompt is its conversation so far. **next request** runs one turn (the running request's path is locked,
# red); **pressure event** is a batch of other requests that needs 256 slots more than are free. In a live notebook
# (JupyterLab, Voila or `kvlab app 02`), switch the eviction to *full (the bug)* and run a pressure event again: the
# tree loses far more than 256 tokens. (A static page shows the tree after the first six requests.)

# %%
from kvlab.viz.tree_widget import TreeDemoPanel

tree_panel = TreeDemoPanel(start_requests=6, seed=0)
tree_panel.widget

# %% [markdown]
# ## 6 · Exercise: evict only the shortfall
# `my_shortfall(num_tokens, available)` says how many tokens to ask the radix tree for, when an allocation needs
# `num_tokens` slots and `available` are free. As given it is SGLang 0.5.16's standard arm, line for line: ask
# for everything when short, nothing otherwise. Fix it, then run the check: it makes four allocations on a real
# `RadixCache` (the tree of section 1) evicting what your function asks for, and compares the tokens evicted with
# SGLang ≥ 0.5.17. Two of the four are not short at all; there 0.5.16 is already right.

# %%
def my_shortfall(num_tokens, available):
    if available < num_tokens:  # SGLang 0.5.16: allocator.available_size() < num_tokens
        return num_tokens  # tree_cache.evict(EvictParams(num_tokens=num_tokens))
    return 0


# %%
from kvlab.labs import shortfall_eviction as lab

lab.shortfall.check(my_shortfall)

# %% [markdown]
# The reference solution is below when solutions are on: `KVLAB_SOLUTIONS=1 jupyter lab`, or
# `kvlab app 02 --solutions` for a workshop.

# %%
lab.shortfall.solution
