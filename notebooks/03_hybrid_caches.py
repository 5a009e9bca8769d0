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
# # 03 · Hybrid caches: sliding-window pools and recurrent states
#
# Hybrid models mix full-attention layers with layers that keep less per token:
#
# - **Sliding-window attention (SWA)** layers read only the last `sliding_window_size` tokens. SGLang keeps two KV
#   pools (`SWATokenToKVPoolAllocator`) and a `SWARadixCache` whose nodes can lose their SWA KV but keep their full
#   KV: an *SWA tombstone*.
# - **Mamba / linear-attention** layers keep one fixed-size recurrent state per sequence. `MambaRadixCache` stores a
#   state slot next to a node's KV indices. A state summarises the *whole* prefix, so a prefix can be resumed only
#   where a snapshot exists.
#
# Both trees here are kvlab's (`kvlab.mem_cache`), checked op for op against SGLang 0.5.16's own classes
# (`tests/mem_cache/test_hybrid_differential.py`).

# %%
from kvlab.experiments import hybrid_caches
from kvlab.labs import hybrid_caches as lab
from kvlab.mem_cache.tree_view import SPANS
from kvlab.viz import hybrid_plots
from kvlab.viz.tree_widget import RadixTreeWidget

# %% [markdown]
# ## 1 · SWA: one shortfall per pool
# Three running requests share a 12-token prefix. Each holds the full lock on its whole path but the SWA lock only
# over the last window (4 tokens, its own tail). Another allocation needs 12 slots: the full pool has room, the
# smaller SWA pool does not. `evict_from_tree_cache` computes a shortfall **per pool** — in every SGLang version,
# this arm was never buggy — and the tree frees SWA KV only: it tombstones the shared prefix, whose full KV the
# running requests still need.

# %%
cache, event = hybrid_caches.swa_walkthrough()
print(f"need {event.need_tokens}: full available {event.full_available} -> shortfall {event.full_shortfall}; "
      f"SWA available {event.swa_available} -> shortfall {event.swa_shortfall}")
print(f"freed: full {event.full_evicted}, SWA {event.swa_evicted}; tombstones: {event.tombstones}")
print(event.pretty_after)

# %%
hybrid_plots.swa_pool_bars(event)

# %% [markdown]
# After the requests finish, a new request with the same prefix can only reuse it if the SWA layers have their
# window: the match stops before the tombstone unless `sliding_window_size` un-tombstoned tokens follow it.

# %%
m = cache.match_prefix(list(cache.root_node.children.values())[0].key.tolist() + [100, 101, 102, 103, 104, 105])
print("hit after the tombstone:", m.device_prefix_len, "tokens (18 cached; the 6-token tail >= window 4)")

# %% [markdown]
# ## 2 · Mamba: why over-eviction can cost more
# SGLang <= 0.5.16 asked the tree for the whole `num_tokens` whenever the pool was short (*full (the bug)*); the
# fix asks for the shortfall (*shortfall (the fix)*). Notebook 02 shows that on a plain radix tree this mostly
# changes *when* prefixes are evicted, not how many, and often costs no hit at all. On a Mamba tree, states are
# scarce (here 16 slots for 12 chat sessions), so inner turns lose their states first (tombstones); when a leaf
# then goes, its tombstone ancestors become leaves and go too — the whole conversation must be re-prefilled,
# because no snapshot remains to resume from.
#
# Same seeded multi-turn workload, same 1,200-token KV pool, both trees, both modes:

# %%
df = hybrid_caches.eviction_mode_comparison()
hybrid_caches.comparison_table(df)

# %%
hybrid_plots.eviction_cost_bars(df)

# %%
radix_extra = int(df.query("cache == 'radix' and mode == 'full'")["extra_prefill_tokens"].iloc[0])
mamba_extra = int(df.query("cache == 'mamba' and mode == 'full'")["extra_prefill_tokens"].iloc[0])
print(f"full eviction recomputes {radix_extra:,} extra prefill tokens on the plain radix tree, "
      f"{mamba_extra:,} on the Mamba tree")

# %% [markdown]
# One pool, one seed: notebook 02 (section 3) runs this comparison over pool sizes and five seeds. There the Mamba
# tree loses as much as the plain tree or more at every pool size, but by a point or two at most, and nothing
# once the pool holds most of the conversations.

# %% [markdown]
# ## 3 · Exercise: where may a Mamba hit resume?
# `match_prefix` walks the tree as far as the KV matches. Write `resume_point(path)`: given the matched edges from
# the root, `[(tokens_on_edge, has_state), ...]`, return how many tokens the request may reuse. (The stub returns
# every matched KV token, the plain radix answer.) Then run `check`.

# %%
def resume_point(path):
    return sum(tokens for tokens, _ in path)


# %%
lab.resume.check(resume_point)

# %%
lab.resume.solution

# %% [markdown]
# ## 4 · The Mamba tree, live
# The exercise's tree as kvlab's radix tree widget (width = tokens through a node; hover for key, lock and access
# time). Each node is labelled with where it lies in the sequence and whether it holds a recurrent state
# (`· state`) or not (`· no state`: a Mamba tombstone); the table below it is the same tree at the same moment.
# The shared stem (the first node under the root) is a tombstone: its KV is cached, but a request can only resume
# from a node *with* a state, so a hit that ends there is worth nothing.

# %%
tree_cache, _queries = hybrid_caches.resume_scenario()
before_view = RadixTreeWidget(tree_cache, names=SPANS, title="Mamba radix cache (the exercise's tree)")
before_view.widget

# %%
hybrid_caches.state_table(tree_cache)

# %% [markdown]
# Now ask the cache for one more state slot (`evict(0, mamba_num=1)`: no KV needed, one state). The least recently
# used state is a leaf's, and a leaf without its state is useless, so the whole leaf goes, KV included. This runs
# on a second copy of the tree (same seed), so the widget and table above keep showing the moment before.

# %%
after_cache, freed = hybrid_caches.state_eviction()
after_view = RadixTreeWidget(after_cache, names=SPANS, title="The same tree after evict(0, mamba_num=1)")
print(f"states freed {freed.mamba_num_evicted}, KV tokens freed with them {freed.evicted_tokens}")
after_view.widget

# %%
hybrid_caches.state_table(after_cache)
