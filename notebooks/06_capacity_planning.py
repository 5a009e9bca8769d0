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
# # 06 · Capacity planning: how big a KV pool, and where the eviction bug costs
#
# Two questions about a serving fleet and its traffic:
#
# 1. **How big a KV pool?** The prefix-cache hit rate climbs with the pool until the pool holds everything the
#    traffic comes back to. Past that point more memory buys nothing.
# 2. **Where does finding 2 cost?** SGLang ≤ 0.5.16 evicts the whole request's worth of tokens when the
#    allocator is short (`num_tokens`); ≥ 0.5.17 evicts only the shortfall (`num_tokens − available`). Notebook 02
#    showed one setting where the old rule costs hit rate. Here we map where it costs and where it does not.
#
# Both answers come from one **sweep**: kvlab's scheduler model run on a Mooncake-format trace at every pool size ×
# max running requests × eviction mode. Each point is a whole `kvlab simulate` run. `kvlab sweep` runs the same
# grid from a shell, on this machine's cores or on a Ray cluster (section 4).
#
# Point the parameters at your own trace. With the defaults the notebook uses the trace shipped in `data/`, and the
# grid (36 points) runs in a few seconds on two cores. A full-size trace works too: the 12,031 requests of a
# Mooncake-conversation-shaped trace (`python benchmarks/make_mooncake_trace.py --preset conversation`) ran the same
# 36 points in 51 s on two cores (2-5 s a point). Set `OUT` to keep the rows: a rerun skips the points already there.

# %% tags=["parameters"]
TRACE_PATH = None  # your Mooncake-format JSONL trace; None: data/traces/mooncake_small.jsonl
NUM_REQUESTS = None  # run only the first N arrivals of the trace (None: all)
POOL_PAGES = None  # KV pool sizes in pages, e.g. [80, 160, 320]; None: NUM_POINTS log-spaced sizes
NUM_POINTS = 6  # how many default pool sizes, from one request's worth to every distinct block cached
MAX_RUNNING = [4, 16, 256]  # the regime map's other axis: how many requests the server runs at once
PAGE_SIZE = 512  # tokens per KV page (Mooncake hash ids are 512-token blocks)
ENGINE = "local"  # "local": a process pool on this machine; "ray": a Ray cluster (pip install 'kvlab[ray]')
WORKERS = None  # local processes (None: one per core)
RAY_ADDRESS = None  # with ENGINE = "ray": a cluster to join, e.g. "ray://head-node:10001"; None starts one here
OUT = None  # e.g. "capacity.csv": keep the rows; a rerun skips the points already there
HOST_RATIOS = [1, 4]  # section 5: host pools (SGLang's --hicache-ratio) beside each device pool; [] skips it
HOST_WRITE_POLICY = "write_through"  # --hicache-write-policy for section 5

# %%
from kvlab.experiments import capacity
from kvlab.viz.capacity_plots import CapacityPanel, hit_rate_by_host

# %% [markdown]
# ## 1 · The sweep
# Every point runs the same requests through the scheduler model (radix cache, paged allocator, admission, decode,
# retraction) with one pool size, one max running and one eviction mode. The default pool sizes run from the
# smallest pool that holds the longest request to one that caches every distinct block of the trace.

# %%
result = capacity.run(TRACE_PATH, pool_pages=POOL_PAGES, num_points=NUM_POINTS, max_running=MAX_RUNNING,
                      page_size=PAGE_SIZE, num_requests=NUM_REQUESTS, engine=ENGINE, workers=WORKERS,
                      ray_address=RAY_ADDRESS, out=OUT)
print(f"{result.trace.name}: {result.num_requests} requests; pool sizes {list(result.pool_pages)} pages of "
      f"{result.page_size} tokens; max running {list(result.max_running)}")
print(result.sweep.cost())

# %% [markdown]
# ## 2 · Hit rate against pool size, and 3 · the regime map
# The upper figure is the planner's curve at one max running (pick another in the menu): both eviction modes, and
# the dotted ceiling of an infinite cache. Pick the pool where the curve flattens. Its lower panel shows the tokens
# the old rule evicted earlier than needed.
#
# The map below it shows the hit-rate **points lost** to full eviction (shortfall − full) at every pool size and max
# running. Red cells are where the bug costs and white cells are where it costs nothing. A blue cell would be where
# it happened to help. Each table under a figure holds the numbers the figure draws.

# %%
panel = CapacityPanel(result)
panel.widget

# %% [markdown]
# Reading the map: over-eviction throws away cached prefixes *earlier than needed*. That costs a hit only when
# one of them is asked for again before the fix would have evicted it anyway. In a small pool every allocation is
# short and the cache turns over fast, so early evictions land on prefixes that come back: the bug costs there.
# Once the pool holds what the trace reuses, the same evictions hit cold leaves, and the loss is zero even though
# the old rule still evicts hundreds of thousands of tokens for nothing. Your trace decides where that line falls.

# %%
loss = result.loss_points()
worst = loss.max().max()
print(f"full eviction (the bug) loses at most {worst:.2f} points of hit rate (fix − bug {worst:+.2f}); "
      "settings with no cost: "
      f"{int((loss.abs() < capacity.COST_FREE_POINTS).sum().sum())} of {loss.size}")
assert (result.curve().query("mode == 'shortfall'")["over_evicted_tokens"] == 0).all()  # the fix never over-evicts

# %% [markdown]
# ## 4 · What the sweep cost, and running it on a Ray cluster
# The line under section 1 gives the sweep's cost: points, seconds and points per minute. Points are independent,
# so the cost divides by the number of cores. The same grid from a shell, with rows written to a CSV (or `.parquet`)
# as they finish. Running the same command again after an interruption skips the points already written:

# %%
print(result.cli())

# %% [markdown]
# To run it on a **Ray cluster**, install the extra on the machine you run from and on the cluster
# (`pip install 'kvlab[ray]'`, the same kvlab version everywhere). Then set the parameters at the top:
# `ENGINE = "ray"` and `RAY_ADDRESS = "ray://head-node:10001"` (or `"auto"` on a cluster node). With
# `RAY_ADDRESS = None`, `ENGINE = "ray"` starts a local Ray cluster on this machine. Each point is one Ray task, and a
# task whose worker dies is retried. From a shell, add `--engine ray --ray-address ray://head-node:10001` to the
# command above. The code line is the same call with two arguments changed:
#
# ```python
# result = capacity.run(TRACE_PATH, max_running=MAX_RUNNING, engine="ray", ray_address="ray://head-node:10001")
# ```

# %% [markdown]
# ## 5 · A host tier as one more axis
# SGLang's hierarchical cache (`--enable-hierarchical-cache`, notebook 07) keeps what the device pool evicts in a
# host-memory pool, `--hicache-ratio` times the device pool, and loads it back on a hit. The same pools again at
# max running 16 (or the largest you swept), each with host pools of `HOST_RATIOS` times the device pool: grey is
# the device-only sweep above, solid the fix, dashed the bug. Host memory is cheaper than GPU memory; where a
# curve with a host tier reaches the device-only curve's plateau at a smaller device pool, the host pool buys what
# more GPU memory would.

# %%
host = capacity.host_axis(result, HOST_RATIOS, write_policy=HOST_WRITE_POLICY) if HOST_RATIOS else None
hit_rate_by_host(host) if host else None

# %% [markdown]
# The hit-rate points each host pool adds over the device-only server (the fix), per device pool; then one point of
# the axis as a command:

# %%
if host:
    print(host.gain_points().to_string())
    print("\n" + host.cli(result.pool_pages[0], max(HOST_RATIOS)))
