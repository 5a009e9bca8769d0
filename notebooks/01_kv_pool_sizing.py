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
# # 01 · Sizing the KV pool: measure after collecting
#
# SGLang sizes its KV-cache pool from the GPU memory that is free **right after the weights are loaded**:
#
# $$\text{rest} = \text{available} - \text{pre\_load\_free} \times (1 - \text{mem\_fraction\_static}),\qquad
#   \text{max\_total\_num\_tokens} = \lfloor \text{rest} / \text{cell\_size} \rfloor$$
#
# `available` comes from `get_available_gpu_memory()`, which calls `torch.cuda.empty_cache()` and then
# `torch.cuda.mem_get_info()`. `empty_cache()` can only hand back cached blocks that **nothing references**.
# If the weight loader's temporaries are still referenced — by a reference cycle that only the garbage
# collector can break — their blocks stay allocated, `available` is under-read, and because `rest` is a small
# difference of two large numbers the pool can come out orders of magnitude too small. The fix in SGLang
# (PR #36583) is one line: `gc.collect()` before measuring.
#
# This notebook reproduces the PR's numbers (4×H200 capped to 80 GB, TP4 + EAGLE, `--mem-fraction-static 0.8`):
# a pool of under 2k tokens that refuses a 3,034-token prompt, against a pool >100× larger with the fix (the
# PR's exact numbers and kvlab's, and why they differ, are printed under the table below).
# On a laptop it runs on kvlab's model of PyTorch's caching allocator; on a GPU box the last section runs the
# same loader on the real `torch.cuda` allocator. The settings the cells below use are in the first code cell
# (tagged `parameters`, papermill's convention).

# %% tags=["parameters"]
PRESET = "sglang-pr-4xh200"  # the PR's scenario (sections 1, 2 and the exercise): 4×H200 at 80 GB, TP4
GPU_PRESET = "llama-8b-l4"  # section 4, on this machine's GPU when it has one
LOADER_DEVICE = "sim:h100-80g"  # section 3: the loader's reference cycle, on one simulated device
LOADER_MODEL = "llama-3.1-8b"
DEVICE = None  # None: $KVLAB_DEVICE when set (`kvlab report --device`), else "auto" ("cuda" on a GPU box)

# %%
import pandas as pd

import kvlab
from kvlab.device import resolve_device_name
from kvlab.experiments import kv_pool_sizing

DEVICE = resolve_device_name(DEVICE)  # "cuda" on a GPU box, else "sim:h200"
print(f"kvlab {kvlab.__version__} · this machine's device: {DEVICE}")

# %% [markdown]
# ## 1 · The two arms of the finding
# `compare()` starts the server twice — without and with `gc.collect()` before the measurement — and returns both
# results. Everything in them comes from real tensors whose allocator blocks are freed when their storage dies.

# %%
no_gc, with_gc = kv_pool_sizing.compare(PRESET)
kv_pool_sizing.summary_frame(no_gc, with_gc)

# %% [markdown]
# The last row is what the PR calls memory "left idle": once the server has run and its garbage collector has
# freed the loader's temporaries, that much GPU memory sits unused because the pool was sized too early.

# %%
ratio = with_gc.max_total_num_tokens / no_gc.max_total_num_tokens
print(f"pool without gc: {no_gc.max_total_num_tokens:,} tokens · with gc: {with_gc.max_total_num_tokens:,} tokens "
      f"· {ratio:,.0f}× larger")
print(f"without gc, SGLang refuses the prompt:\n  {no_gc.error}")
assert not no_gc.accepted and with_gc.accepted and ratio >= 100

# %%
from IPython.display import Markdown, display

Markdown(kv_pool_sizing.pr_numbers_note(no_gc.max_total_num_tokens, with_gc.max_total_num_tokens))

# %% [markdown]
# ## 2 · Try it live
# The toggle decides whether your server collects before measuring. The two timelines (rank 0 of 4) show what the
# allocator did in each arm: the weights go in, the loader's staging shards go in with them, and at the
# **measure** phase only the right-hand arm has let go of them. In the left-hand arm the collector runs later,
# while serving: it frees the same staging, but the pool was sized already, so that memory sits idle (the label
# says how much). Move `mem_fraction_static`, switch `empty_cache()` off, or change the prompt and preset.

# %% tags=["dashboard"]
from kvlab.viz.widgets import KVPoolPanel

panel = KVPoolPanel(PRESET)
panel.widget

# %% [markdown]
# ## 3 · Why `del` is not enough
# The loader keeps the first exception of its dtype-converting fallback for its load report. That exception's
# traceback holds the frame of `WeightLoader.load`, whose locals hold the loader itself and the staging shards it
# kept for verification: a cycle. Reference counting frees nothing in a cycle; only `gc.collect()` does.

# %%
import gc

from kvlab.device import get_device
from kvlab.device.measure import automatic_gc_paused
from kvlab.model import get_model_config, load_weights
from kvlab.units import fmt_bytes

with automatic_gc_paused():  # keep the interpreter's automatic collector out of the experiment
    device = get_device(LOADER_DEVICE)
    loaded = load_weights(device, get_model_config(LOADER_MODEL))
    after_load = device.memory_allocated()
    del loaded  # the caller lets go of everything it was given ...
    after_del = device.memory_allocated()
    gc.collect()  # an explicit collection still runs
    after_gc = device.memory_allocated()
steps = pd.DataFrame({"allocated": [fmt_bytes(after_load), fmt_bytes(after_del), fmt_bytes(after_gc)]},
                     index=["after load", "after del: the cycle still holds it all", "after gc.collect()"])
steps

# %% [markdown]
# ## 4 · On a real GPU
# With a CUDA device the same loader runs on PyTorch's own caching allocator and the readings are the driver's.
# (On this machine: skipped when no GPU is visible.)

# %%
if DEVICE.startswith("cuda"):
    gpu_no_gc, gpu_gc = kv_pool_sizing.compare(GPU_PRESET, device="cuda")
    display(kv_pool_sizing.summary_frame(gpu_no_gc, gpu_gc))
else:
    print("no CUDA device here: the sections above ran on kvlab's model of the caching allocator")

# %% [markdown]
# ## 5 · Exercise: measure after collecting
# `my_measure(devices)` is the reading SGLang sizes its pool from. It gets the tensor-parallel ranks (each has
# `empty_cache()` and `mem_get_info()`, which returns `(free, total)` bytes) and returns the free bytes SGLang may
# use: the minimum over the ranks. As given it is SGLang's reading **before** the fix. Change it so the pool comes
# out right, then run the check below: it starts section 1's server (`PRESET`, the PR's `sglang-pr-4xh200`) with
# your function in place of kvlab's reading. The weights, the loader's reference cycle and Python's garbage
# collector are all real; only your function decides what is collected and emptied before the reading.

# %%
import gc


def my_measure(devices):
    for d in devices:
        d.empty_cache()
    return min(d.mem_get_info()[0] for d in devices)


# %%
from kvlab.labs import kv_pool_sizing as lab

lab.measure.check(my_measure, scenario=PRESET)

# %% [markdown]
# The reference solution is below when solutions are on: `KVLAB_SOLUTIONS=1 jupyter lab`, or
# `kvlab app 01 --solutions` for a workshop.

# %%
lab.measure.solution
