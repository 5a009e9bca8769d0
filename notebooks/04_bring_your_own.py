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
# # 04 · Bring your own: a memory snapshot and a trace
#
# The earlier notebooks ran kvlab's models on inputs kvlab made. This one reads **yours**:
#
# 1. a PyTorch memory snapshot, the pickle `torch.cuda.memory._dump_snapshot(path)` writes, drawn as an active-memory
#    timeline and a segment map (what `torch/cuda/_memory_viz.py` shows, as plotly figures you can keep);
# 2. the same snapshot replayed through kvlab's model of the caching allocator (`kvlab replay` on the command line):
#    how exactly the model reproduces your run, and what other allocator settings would have done with it;
# 3. a Mooncake-format request trace (`timestamp`, `input_length`, `output_length`, `hash_ids`), run through
#    kvlab's scheduler model at several KV pool sizes in both eviction modes: hit rate against pool size, the curve
#    a capacity planner wants.
#
# Point the parameters below at your own files (or run the notebook with papermill and override them). With the
# defaults it uses the files shipped in `data/` (see `data/README.md` for how kvlab made them).

# %% tags=["parameters"]
SNAPSHOT_PATH = None  # your torch.cuda.memory._dump_snapshot pickle; None: data/snapshots/example.pickle
TRACE_PATH = None  # your Mooncake-format JSONL trace; None: data/traces/mooncake_small.jsonl
NUM_REQUESTS = None  # run only the first N arrivals of the trace (None: all; the shipped 200 take ~1 s a point)
POOL_PAGES = None  # KV pool sizes in pages, e.g. [80, 160, 320]; None: NUM_POINTS log-spaced sizes
NUM_POINTS = 6  # how many default pool sizes, from one request's worth to every distinct block cached
PAGE_SIZE = 512  # tokens per KV page (Mooncake hash ids are 512-token blocks)
RECORD_ON_GPU = True  # on a CUDA machine, also record a fresh snapshot from a real run
WHAT_IFS = ["expandable_segments=True"]  # other PYTORCH_CUDA_ALLOC_CONF settings to replay the snapshot under
CAPACITY = None  # e.g. "24GiB": would each setting have run out of memory on a device that size?

# %%
from IPython.display import Markdown

from kvlab.device.replay.fidelity import state_at
from kvlab.device.replay.whatif import replay_with_what_ifs
from kvlab.device.snapshot import EXAMPLE_SNAPSHOT, SnapshotError, read_snapshot
from kvlab.experiments import pool_sweep
from kvlab.units import fmt_bytes
from kvlab.viz.replay_plots import recorded_vs_modelled, what_if_bars
from kvlab.viz.snapshot_plots import active_memory_timeline, segment_map
from kvlab.viz.sweep_plots import hit_rate_vs_pool
from kvlab.workloads.mooncake import TraceFormatError, load_trace, read_records, trace_stats

# %% [markdown]
# ## 1 · A memory snapshot
# A snapshot holds two things: `segments`, the allocator's state *now* (every cudaMalloc'd segment split into
# blocks, each live, pending free, or cached free), and `device_traces`, the recent history of allocator events.
# The history is a ring buffer (`_record_memory_history(max_entries=...)`), so it may start mid-run, after
# allocations that are still alive. kvlab's reader therefore starts from the final state and undoes the trace
# backwards, as memory_viz does; it accepts both spellings of the pending state (`active_pending_free`, written by
# the C++, and `active_awaiting_free`, used in torch's docs).

# %%
snapshot = read_snapshot(SNAPSHOT_PATH or EXAMPLE_SNAPSHOT)
blocks = snapshot.blocks_frame()
snapshot.summary().to_frame()

# %% [markdown]
# Allocated bytes (what tensors hold) and reserved bytes (what the allocator took from the driver) after each trace
# event. The gap between them is the allocator's cache; an `empty_cache()` is a step down of the orange line.

# %%
active_memory_timeline(snapshot)

# %% [markdown]
# The segment map: one bar per segment, split into its blocks at their offsets. Grey blocks are cached free: still
# reserved, ready for the next allocation that fits.

# %%
segment_map(snapshot)

# %% [markdown]
# A history that starts mid-run: keep only the last half of the events, as a wrapped ring buffer would. The replay
# still ends at the state in `segments` and gives the same totals as the full history at every event it kept; it
# just cannot show what happened before its first event.

# %%
traces = snapshot.raw.get("device_traces") or [[]]
trace = traces[0]
if len(trace) >= 2:
    cut = len(trace) // 2
    truncated = read_snapshot({**snapshot.raw, "device_traces": [trace[cut:], *traces[1:]]})
    cut_line = truncated.timeline().query("device == 0")["allocated_bytes"].tolist()
    full_line = snapshot.timeline().query("device == 0")["allocated_bytes"].tolist()
    assert cut_line == full_line[cut:]
    print(f"history cut to events {cut}..{len(trace) - 1}; allocated after event {cut}: "
          f"{fmt_bytes(cut_line[0])} from the cut history, {fmt_bytes(full_line[cut])} from the full one")
else:
    print(f"{snapshot.source} has {len(trace)} trace events on device 0: nothing to cut "
          "(was torch.cuda.memory._record_memory_history on when it was taken?)")

# %% [markdown]
# ### A fresh snapshot from a real run
# On a machine with a CUDA device, this records one: it turns on torch's allocation history, runs kvlab's tiny-model
# start-up on the GPU (weights from `data/tiny-llama`, a memory reading, then the KV pool SGLang's arithmetic sizes),
# dumps the snapshot with `torch.cuda.memory._dump_snapshot` and reads the file back like any other. These are the
# three calls to add to your own script:
#
# ```python
# torch.cuda.memory._record_memory_history(max_entries=100_000)
# ...  # your run
# torch.cuda.memory._dump_snapshot("my_snapshot.pickle")
# ```

# %%
import tempfile
from pathlib import Path

import torch

fresh = None
if RECORD_ON_GPU and torch.cuda.is_available():
    from kvlab.experiments import kv_pool_sizing

    fresh_path = Path(tempfile.gettempdir()) / "kvlab_fresh_snapshot.pickle"
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        startup = kv_pool_sizing.run("tiny-h100", device="cuda")
        torch.cuda.memory._dump_snapshot(str(fresh_path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    fresh = read_snapshot(fresh_path)
    print(f"recorded {len(fresh.events_frame())} events on {torch.cuda.get_device_name()} into {fresh_path}; "
          f"KV pool {startup.max_total_num_tokens:,} tokens; peak allocated {fmt_bytes(fresh.peak_allocated_bytes)}")
else:
    reason = "RECORD_ON_GPU is False" if not RECORD_ON_GPU else "no CUDA device here"
    print(f"{reason}: nothing recorded; the figures above use {snapshot.source}")

# %%
active_memory_timeline(fresh) if fresh is not None else None

# %%
segment_map(fresh) if fresh is not None else None

# %% [markdown]
# A file that is not a snapshot gets an error naming the file and what is wrong with it, not a traceback from deep
# inside pickle:

# %%
for bad in ["no_such_snapshot.pickle", pool_sweep.EXAMPLE_TRACE]:
    try:
        read_snapshot(bad)
    except (FileNotFoundError, SnapshotError) as exc:
        print(f"{type(exc).__name__}: {exc}")

# %% [markdown]
# ## 2 · Replay the snapshot: how faithful is the model, and what would other settings have done?
# kvlab drives its allocator model with the snapshot's trace, event by event: every allocation with the recorded
# request and stream, every free (deferred ones stay unusable until they complete), an `empty_cache` where the
# recording released segments. Each new segment gets the address the recorded driver returned, so block addresses
# compare one to one. The banner says whether the model reproduced the recording exactly (eight checks: segment
# allocations, block addresses, releases, OOMs, reserved bytes after every event, the final segments, final
# reserved and allocated bytes), or where it first differs.

# %%
replay, what_ifs = replay_with_what_ifs(snapshot, what_ifs=WHAT_IFS, capacity=CAPACITY)
Markdown(replay.banner())

# %%
print(replay.text(what_ifs))

# %% [markdown]
# Reserved memory as recorded (the trace's segment events, seeded from `segments`) and as the model replays it, with
# the model's allocated bytes: the recording says what the allocator reserved; only the model says how much of it
# the tensors held after each event (the trace records requests, not block sizes).

# %%
recorded_vs_modelled(replay)

# %% [markdown]
# The same allocations under other settings (`WHAT_IFS`): the first bar group is the recording, the next the model
# under the recorded settings (the baseline every what-if is computed like), then each what-if. Fragmentation is
# reserved minus allocated at its worst moment.

# %%
what_if_bars(replay, what_ifs)

# %% [markdown]
# The segment map at the moment the replay reserved the most: which blocks pinned which segments at the peak.

# %%
peak = state_at(snapshot, replay.peak_event)
print(f"{peak.source}: {len(peak.segments_frame())} segments, {fmt_bytes(peak.final_reserved_bytes)} reserved, "
      f"{fmt_bytes(peak.final_allocated_bytes)} allocated")
segment_map(peak)

# %% [markdown]
# ## 3 · Hit rate against KV pool size, from a trace
# Each point is one full run of kvlab's scheduler model (radix cache, paged allocator, admission, decode,
# retraction) on the same requests with a pool of that many pages; the two lines differ only in how much the
# allocator evicts from the radix tree when it is short (notebook 02): the shortfall (SGLang ≥ 0.5.17) or the whole
# request (≤ 0.5.16). The default sizes run from the smallest pool that can hold the longest request to one that
# caches every distinct block of the trace, past which no pool can do better.

# %%
trace_path = TRACE_PATH or pool_sweep.EXAMPLE_TRACE
records = read_records(trace_path)
requests = load_trace(trace_path)
if NUM_REQUESTS is not None:
    requests = requests[:NUM_REQUESTS]
    records = sorted(records, key=lambda r: r.timestamp_ms)[:NUM_REQUESTS]
stats = trace_stats(records)
pools = POOL_PAGES or pool_sweep.default_pool_pages(requests, PAGE_SIZE, NUM_POINTS)
print(f"{trace_path}: {len(requests)} requests, {stats.unique_blocks:,} distinct blocks; "
      f"ideal hit rate (infinite cache) {stats.ideal_hit_rate:.1%}; pool sizes {pools} pages")

# %%
sweep = pool_sweep.sweep(requests, pools, page_size=PAGE_SIZE)
sweep.pivot("hit_rate")

# %%
hit_rate_vs_pool(sweep.frame, ideal_hit_rate=stats.ideal_hit_rate)

# %% [markdown]
# Reading the curve: the hit rate climbs roughly with the log of the pool until the pool holds every distinct block
# the trace reuses; the dotted line is the ceiling, an infinite cache. Pick the pool where the curve flattens for
# your traffic. The lower panel is what the old eviction rule destroys for nothing. On the shipped trace it is a
# lot of tokens but little hit rate: most of what it over-evicts are the coldest LRU leaves, which this trace
# rarely comes back to. Traffic that returns to recently cached prefixes (notebook 02's shared-prefix workload)
# can lose more. Your trace decides which case you are in.

# %%
hit = sweep.pivot("hit_rate")
over = sweep.pivot("over_evicted_tokens")
pressured = over["full"] > 0
print(f"under pressure ({int(pressured.sum())} of {len(hit)} pool sizes), full eviction over-evicted "
      f"{int(over['full'].sum()):,} tokens and lost up to {(hit['shortfall'] - hit['full']).max():.1%} hit rate")
assert (over["shortfall"] == 0).all()  # evicting the shortfall never evicts more than it must
if PAGE_SIZE == 512:  # the ideal counts whole 512-token blocks; a smaller page can also hit inside one
    assert hit["shortfall"].max() <= stats.ideal_hit_rate + 1e-6

# %% [markdown]
# A trace with a bad line is named by file and line, and the field:

# %%
bad_trace = Path(tempfile.gettempdir()) / "kvlab_bad_trace.jsonl"
bad_trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 5, "input_length": 600, "output_length": 8, "hash_ids": [1]}\n')
try:
    load_trace(bad_trace)
except TraceFormatError as exc:
    print(f"TraceFormatError: {exc}")
