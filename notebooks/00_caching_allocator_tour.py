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
# # 00 · A tour of PyTorch's CUDA caching allocator
#
# Every `torch.empty(..., device="cuda")` goes through PyTorch's **caching allocator**
# (`c10/cuda/CUDACachingAllocator.cpp`). It asks the driver for big *segments* (`cudaMalloc`), cuts them into
# *blocks* for tensors, and when a tensor dies it keeps the block cached for the next request instead of giving it
# back. Three numbers describe it:
#
# * `torch.cuda.memory_allocated()` — bytes of live blocks (each rounded up, see step 1);
# * `torch.cuda.memory_reserved()` — bytes of all segments, live or cached;
# * `torch.cuda.mem_get_info()[0]` — what the driver still has free (what SGLang measures to size its KV pool).
#
# Six short lab steps each isolate one rule. In each you **predict** a number, run a tiny allocation script, look
# at the allocator's state after every action (segments as bars, blocks coloured *live* / *pending free* / *free*,
# sizes on hover, like PyTorch's [memory_viz](https://pytorch.org/memory_viz) "Allocator State History"), and
# `check()` your prediction against kvlab's model. Drag the slider under each figure to step through the script;
# the timeline below the map shows allocated, reserved and cached-but-free bytes after each allocator event.
#
# On a machine with a GPU, `DEVICE = "auto"` runs every script on the real `torch.cuda` allocator and the checks
# also say whether the GPU agreed with the model; elsewhere it runs on kvlab's CPU model of the allocator
# (`kvlab.device.caching_allocator`, which mirrors torch's code under torch's names).

# %% tags=["parameters"]
DEVICE = "auto"  # "auto": the real GPU when there is one, else "sim:h200" (kvlab's model of the allocator)

# %%
import time

from kvlab.device import resolve_device_name
from kvlab.experiments.allocator_tour import summary_frame
from kvlab.labs import allocator_tour as tour
from kvlab.units import MiB  # noqa: F401 (for your predictions, e.g. 2 * MiB)
from kvlab.viz.allocator_map import state_history

_started = time.perf_counter()
print(f"running the tour on {resolve_device_name(DEVICE)}; checks compare with {tour.MODEL_DEVICE}")

# %% [markdown]
# ## 1 · Every request is rounded up to 512 bytes
#
# `round_size`: a request below 512 B becomes 512 B; anything else is rounded up to a multiple of 512 B. The
# script asks for **1 B, 512 B, 513 B, 1000 B and 4097 B** and keeps them all alive.
# Requests up to 1 MiB come from the *small pool*, which cuts 2 MiB segments.
#
# **Predict** `memory_allocated()` and `memory_reserved()` after the five requests, in bytes (`MiB` is imported).

# %%
predicted_allocated_bytes = None  # e.g. 1 + 512 + 513 + 1000 + 4097 ?
predicted_reserved_bytes = None

# %%
rounding_run = tour.rounding.run(DEVICE)
state_history(rounding_run)

# %% [markdown]
# The map is zoomed to the first 8 KiB of the 2 MiB segment (double-click it to see the whole segment). The same
# blocks as a table: what each tensor asked for (`requested_size`) and the block it got (`size`).

# %%
rounding_run.blocks_frame()

# %%
tour.rounding.check(rounding_run, predicted_allocated_bytes=predicted_allocated_bytes,
                    predicted_reserved_bytes=predicted_reserved_bytes)

# %%
tour.rounding.solution

# %% [markdown]
# ## 2 · Small and large pools
#
# After rounding, a block of **at most 1 MiB** comes from the small pool (2 MiB segments); anything bigger comes
# from the large pool, whose segment size is `get_allocation_size`: **20 MiB** for requests under 10 MiB (so
# several share one segment), otherwise the request **rounded up to 2 MiB**. A request first looks for a cached
# free block in its own pool (best fit); only when none is big enough does the allocator `cudaMalloc` a new one.
#
# The script: `a` = 1 MiB, `b` = 1 MiB + 1 B, `c` = 300 KiB, `d` = 25 MiB, all kept alive.
# **Predict** how many small and large segments there are at the end, and the reserved bytes.

# %%
predicted_small_segments = None
predicted_large_segments = None
predicted_reserved_bytes = None

# %%
pools_run = tour.pools.run(DEVICE)
state_history(pools_run)

# %%
tour.pools.check(pools_run, predicted_small_segments=predicted_small_segments,
                 predicted_large_segments=predicted_large_segments,
                 predicted_reserved_bytes=predicted_reserved_bytes)

# %%
tour.pools.solution

# %% [markdown]
# ## 3 · Splitting, and why one live block pins its segment
#
# A request smaller than the free block it takes **splits** it (`should_split`: in the large pool when more than
# 1 MiB would remain): the front becomes the new block, the rest stays cached. When a block is freed it merges
# with free neighbours *in the same segment*. `empty_cache()` gives a segment back to the driver only when it is
# **entirely** free: one live block anywhere pins all of it.
#
# The script: `big` = 8 MiB (opens a 20 MiB segment), `pin` = 2 MiB (split from the rest), `del big`,
# `empty_cache()`; then `del pin`, `empty_cache()`. The figure opens at the state after the first
# `empty_cache()`. **Predict** the reserved bytes there, and the largest free (cached) block.

# %%
predicted_reserved_bytes = None
predicted_largest_free_block_bytes = None

# %%
splitting_run = tour.splitting.run(DEVICE)
state_history(splitting_run)

# %%
tour.splitting.check(splitting_run, predicted_reserved_bytes=predicted_reserved_bytes,
                     predicted_largest_free_block_bytes=predicted_largest_free_block_bytes)

# %%
tour.splitting.solution

# %% [markdown]
# ## 4 · Fragmentation: the same bytes in another order
#
# The same three tensors — 2 MiB, 4 MiB and 14 MiB, 20 MiB in all — are allocated in **ascending** order on an
# empty allocator, then in **descending** order on another empty one. Both end with 20 MiB allocated. Does the
# allocator reserve the same? (Remember: 2 and 4 MiB are under 10 MiB; 14 MiB is not, and a request always tries
# the cached free blocks first.)
#
# **Predict** the reserved bytes at the end of each order.

# %%
predicted_reserved_ascending_bytes = None
predicted_reserved_descending_bytes = None

# %%
fragmentation_run = tour.fragmentation.run(DEVICE)
state_history(fragmentation_run)

# %%
tour.fragmentation.check(fragmentation_run, predicted_reserved_ascending_bytes=predicted_reserved_ascending_bytes,
                         predicted_reserved_descending_bytes=predicted_reserved_descending_bytes)

# %%
tour.fragmentation.solution

# %% [markdown]
# ## 5 · `empty_cache()` before and after `gc.collect()`
#
# A tensor's block is freed when its **storage** dies, i.e. when the last reference goes. Python frees most
# objects at once by reference counting, but objects in a **reference cycle** (here a loader's scratch object that
# points at itself, `scratch.myself = scratch`) live on after `del` until the cyclic garbage collector runs. While
# they live, their block is *allocated*, so `empty_cache()` cannot release its segment. This is how a serving
# engine that measures free memory without `gc.collect()` first sees less than there is.
#
# The script (automatic collection paused so only the explicit call collects): `scratch =
# LoaderScratch(40 MiB tensor)`, `del scratch`, `empty_cache()`, `gc.collect()`, `empty_cache()`. Nothing is
# faked: the cycle is a real Python object graph and the `gc.collect()` is the interpreter's.
# **Predict** the reserved bytes after the first `empty_cache()` and after the last one.

# %%
predicted_reserved_before_gc_bytes = None
predicted_reserved_after_gc_bytes = None

# %%
gc_run = tour.gc_cycle.run(DEVICE)
state_history(gc_run)

# %%
tour.gc_cycle.check(gc_run, predicted_reserved_before_gc_bytes=predicted_reserved_before_gc_bytes,
                    predicted_reserved_after_gc_bytes=predicted_reserved_after_gc_bytes)

# %%
tour.gc_cycle.solution

# %% [markdown]
# ## 6 · Expandable segments off and on
#
# `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` changes how segments are made: one segment per pool reserves
# a large virtual address range and **maps physical pages on demand** (2 MiB small, 20 MiB large); a free block
# can grow into the unmapped space after it, and blocks merge across the whole segment.
#
# The script: a buffer that grows — 30 MiB, then 32 MiB, then 34 MiB, each freed before the next is allocated (a
# batch that gets a little longer every step) — once with expandable segments **off** and once **on**, each on a
# fresh allocator. **Predict** the reserved bytes at the end of each.

# %%
predicted_reserved_off_bytes = None
predicted_reserved_on_bytes = None

# %%
expandable_run = tour.expandable.run(DEVICE)
state_history(expandable_run)

# %%
tour.expandable.check(expandable_run, predicted_reserved_off_bytes=predicted_reserved_off_bytes,
                      predicted_reserved_on_bytes=predicted_reserved_on_bytes)

# %%
tour.expandable.solution

# %% [markdown]
# Expandable segments also take the order out of step 4: with them on, both orders map one 20 MiB page.

# %%
tour.fragmentation.run(DEVICE, expandable_segments=True).facts_frame()

# %% [markdown]
# ## Summary
#
# Every number the six steps measured, on the device this notebook ran on.

# %%
runs = [rounding_run, pools_run, splitting_run, fragmentation_run, gc_run, expandable_run]
summary_frame(runs)

# %%
print(f"notebook 00 ran in {time.perf_counter() - _started:.1f} s on {resolve_device_name(DEVICE)}")
