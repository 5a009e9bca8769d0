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
# When SGLang's KV allocator may be short of `num_tokens` slots (every decode round under memory pressure, every
# prefill allocation), it calls `evict_from_tree_cache(tree_cache, num_tokens)` to free cached prefixes from the
# radix tree. Up to SGLang 0.5.16 its standard arm asked the tree for **all** `num_tokens` whenever
# `available < num_tokens` — although `available` slots were already free. Each pressure event destroyed up to
# `available` tokens of cached prefixes for nothing. The fix (0.5.17) evicts the shortfall:
#
# $$\text{evict} = \text{num\_tokens} - \text{available}$$
#
# This notebook runs kvlab's real radix cache and allocators (SGLang's names and rules) under a model of SGLang's
# scheduler, in both modes, on the same seeded workload.

# %%
import pandas as pd

from kvlab.experiments import shortfall_eviction
from kvlab.viz import plots

# %% [markdown]
# ## 1 · One pressure event
# Six cached conversations share a 1,024-token system prompt. A new allocation needs 600 slots; 300 are free.
# The shortfall is 300 — the bug asks the tree for 600.

# %%
events = {mode: shortfall_eviction.pressure_event(mode) for mode in ("shortfall", "full")}
pd.DataFrame({mode: {"free slots before": e.available_before, "shortfall": e.evict.shortfall_tokens,
                     "asked of the tree": e.evict.requested_tokens, "evicted": e.evict.evicted_tokens,
                     "over-evicted (the bug)": e.evict.over_evicted_tokens,
                     "leaf overshoot": e.evict.overshoot_tokens, "prefixes destroyed": len(e.destroyed)}
              for mode, e in events.items()})

# %%
for mode, e in events.items():
    print(f"--- {mode}: destroyed {', '.join(e.destroyed)}")
    print(e.tree_after)
print("--- before the event")
print(events["shortfall"].tree_before)

# %% [markdown]
# The same trees drawn as icicles: width is the tokens of the cached sequences through a node; green leaves are
# evictable, blue nodes are shared prefixes. Full eviction removed one more conversation than it had to.

# %%
plots.radix_icicles_side_by_side(
    [events["shortfall"].frame_before, events["shortfall"].frame_after, events["full"].frame_after],
    ["before the event", "after shortfall eviction", "after full eviction"])

# %%
extra = set(events["full"].destroyed) - set(events["shortfall"].destroyed)
print("destroyed only by full eviction:", sorted(extra))
assert extra and events["shortfall"].evict.over_evicted_tokens == 0

# %% [markdown]
# ## 2 · A whole workload
# SGLang bench_serving's *generated-shared-prefix* workload (16 groups × 8 prompts here, so it runs in seconds),
# through a 20,000-token KV pool. Same requests, same order, same scheduler; only the eviction amount differs.

# %%
requests = shortfall_eviction.load_requests(
    workload="generated-shared-prefix", seed=0, overrides=dict(num_groups=16, prompts_per_group=8, output_len=128))
comparison = shortfall_eviction.compare(requests, kv_tokens=20_000)
totals = comparison.totals_frame()
totals.loc[["hit_rate", "cached_prompt_tokens", "prefill_tokens_computed", "evicted_tokens", "over_evicted_tokens",
            "pressure_events", "retractions", "output_tokens_per_s"]]

# %%
fix, bug = comparison.shortfall.totals(), comparison.full.totals()
print(f"hit rate: shortfall {fix['hit_rate']:.2%} vs full {bug['hit_rate']:.2%}; "
      f"full eviction recomputed {bug['prefill_tokens_computed'] - fix['prefill_tokens_computed']:,} more prefill tokens")
assert bug["over_evicted_tokens"] > 0 and bug["hit_rate"] < fix["hit_rate"]

# %%
plots.sim_timelines_side_by_side(comparison.shortfall.steps_frame(), comparison.full.steps_frame(),
                                 ("shortfall (fix)", "full (bug)"))

# %% [markdown]
# ## 3 · Try it live
# Toggle the mode, change the pool size, the workload or the radix-cache eviction policy.

# %%
from kvlab.viz.widgets import ShortfallPanel

panel = ShortfallPanel()
panel.widget

# %% [markdown]
# ## 4 · Watch the tree as requests run
# A small radix cache (4,096 KV slots) serving chat turns: eight conversations behind two system prompts, each
# turn's prompt is its conversation so far. **next request** runs one turn (the running request's path is locked,
# red); **pressure event** is a batch of other requests that needs 256 slots more than are free. Switch the
# eviction to *full (bug)* and press **pressure event** again: the tree loses far more than 256 tokens.

# %%
from kvlab.viz.tree_widget import TreeDemoPanel

tree_panel = TreeDemoPanel(start_requests=6, seed=0)
tree_panel.widget

# %% [markdown]
# ## 5 · Exercise: evict only the shortfall
# `my_shortfall(num_tokens, available)` says how many tokens to ask the radix tree for, when an allocation needs
# `num_tokens` slots and `available` are free. As given it is SGLang 0.5.16's line. Fix it, then run the check:
# it makes four allocations on a real `RadixCache` (the tree of section 1) evicting what your function asks for,
# and compares the tokens evicted with SGLang ≥ 0.5.17.

# %%
def my_shortfall(num_tokens, available):
    return num_tokens


# %%
from kvlab import exercises

exercises.check_shortfall(my_shortfall)

# %% [markdown]
# The solution is hidden unless the notebook runs with `KVLAB_SOLUTIONS=1` (e.g. `KVLAB_SOLUTIONS=1 jupyter lab`).

# %%
exercises.SHORTFALL_SOLUTION
