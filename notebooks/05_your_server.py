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
# # 05 · Your server: why its KV pool is the size it is
#
# Give kvlab your server's start-up log (SGLang from 0.1.17 to today, or vLLM) and the model's `config.json`, and it
# recomputes the KV pool with that version's own rules (`kvlab explain-log` on the command line):
#
# 1. the pool's arithmetic as a waterfall, and what kvlab finds in the log;
# 2. **SGLang vs vLLM from the same inputs**: both engines' budgets term by term, and what the gap between them
#    is made of;
# 3. what-ifs: another `mem_fraction_static`, KV dtype, TP size or GPU;
# 4. a live panel: paste or upload your log and config, or pick one of the example logs kvlab ships.
#
# The default is a real report, [vllm-project/vllm#21348](https://github.com/vllm-project/vllm/issues/21348):
# Qwen3-235B-A22B-FP8 on 4×H100 got **178,880** tokens on vLLM and **367,404** on SGLang. The example logs are
# kvlab's own rendering of that report (`data/examples/server_logs/`, see `data/README.md`): its pool sizes,
# printed memory and settings, with the readings it did not show rebuilt. Each log names its rebuilt readings in a
# `# kvlab-reconstructed:` line, and every number resting on one is marked **assumed** (a `*` in the waterfalls
# and tables, "assumed" in the findings): with your own log, nothing is.

# %% tags=["parameters"]
LOG_PATH = None  # your start-up log; None: the report's SGLang log (data/examples/server_logs/)
MODEL_CONFIG = None  # a config.json, its folder, or a kvlab preset name; None: data/examples/models/qwen3-235b-a22b-fp8
GPU = "h100-80g"  # a kvlab GPU preset or product name; None: what the log names
VLLM_LOG = None  # the vLLM log of the same model, for the comparison; None: the report's (with the default log)
WHAT_IFS = ["mem_fraction_static=0.9", "kv_cache_dtype=fp8_e4m3", "tp=8", "gpu=h200"]

# %%
from pathlib import Path

import pandas as pd
from IPython.display import HTML

from kvlab.model.hf_config import load_model_config
from kvlab.serving import explain_log
from kvlab.serving.engine_compare import compare_explanation
from kvlab.serving.examples import DATA_DIR, LOG_DIR, QWEN_FP8
from kvlab.serving.text import format_explanation
from kvlab.serving.vllm_log import parse_vllm_log
from kvlab.serving.whatif import apply_what_ifs
from kvlab.viz.engine_plots import engine_waterfalls, gap_bars
from kvlab.viz.server_panel import explanation_waterfall, findings_html, what_if_figure

default_log = LOG_PATH is None
log_path = LOG_DIR / "qwen3-235b-fp8-4xh100-sglang-0.4.9.log" if default_log else Path(LOG_PATH)
config = load_model_config(MODEL_CONFIG or DATA_DIR / QWEN_FP8)
vllm_path = LOG_DIR / "qwen3-235b-fp8-4xh100-vllm-0.10.1.1.log" if default_log and VLLM_LOG is None else VLLM_LOG
vllm_path = Path(vllm_path) if vllm_path else None

# %% [markdown]
# ## 1 · The pool, recomputed
# SGLang reads the free GPU memory before loading (`before`) and after (`after`), keeps `before × (1 −
# mem_fraction_static)` out for activations and CUDA graphs, and gives the rest to the pool: `rest = after − before ×
# (1 − f)`, `tokens = rest // cell`. The log prints the readings to two decimals, so kvlab gives the range of pools
# they allow and checks the logged one against it.

# %%
exp = explain_log(log_path, model_config=config, gpu=GPU)
if exp.engine == "sglang":  # what-ifs recompute SGLang's arithmetic (section 3)
    exp.what_if = apply_what_ifs(exp, WHAT_IFS)
print(format_explanation(exp))

# %%
explanation_waterfall(exp)

# %% [markdown]
# What kvlab noticed in the log, each with the numbers behind it:

# %%
HTML(findings_html(exp))

# %% [markdown]
# ## 2 · SGLang vs vLLM from the same inputs
# The same model on the same GPUs, sized by both engines' rules (`kvlab.serving.engine_compare`):
#
# - **SGLang**: `rest = f × free_before_load − loaded`. Its fraction is of the memory *free before loading*;
#   activations and CUDA graphs must fit in the `1 − f` it keeps out, and are never measured.
# - **vLLM**: `available = util × total − weights − peak activation − non-torch growth`. Its utilization is of the
#   card's *total*, and the activation peak of a profile run (`max_num_batched_tokens` tokens, then the sampler over
#   `max_num_seqs` requests) is reserved *inside* it, on top of the `1 − util` left outside. Which version's rule
#   applies is printed with it: V0 (0.6.3), V1 (0.10.1.1), the CUDA graph estimate (0.21+), today's extensible cache
#   (0.34.0), each read from vLLM's own source.
#
# With the report's vLLM log, vLLM's side is what it printed: the activation peak is what its "Available KV cache
# memory" implies. Without one it is kvlab's estimate from the config.

# %%
vllm_log = parse_vllm_log(vllm_path.read_text(encoding="utf-8"), str(vllm_path)) if vllm_path else None
comparison = compare_explanation(exp, vllm_log=vllm_log)
engine_waterfalls(comparison)

# %%
gap_bars(comparison)

# %%
pd.DataFrame(comparison.gap)[["what", "gib", "tokens", "basis"]].assign(
    share=lambda d: (d.tokens / (comparison.sglang.tokens - comparison.vllm.tokens)).round(3))

# %% [markdown]
# On the report the cell is the same for both engines (94 layers × 1 KV head per rank — 4 KV heads over 4 ranks, no
# replication — × 256 × 2 bytes of bf16 = 48,128 B), and `0.93 × free-before-load` is about `0.9 × total`: the
# fraction is not the difference. Nearly all of the 2× is the activation peak vLLM reserves inside its budget from
# its profile run — memory SGLang leaves to its `1 − f` slack. The report does not print that peak: the 7.60 GiB
# shown is what vLLM's "Available KV cache memory" implies once weights and non-torch growth are taken out, and
# both of those are assumed here (the weights rebuilt, the non-torch growth kvlab's guess), so the row is marked
# `assumed`. Neither choice is wrong: vLLM guards against an out-of-memory under a full batch, SGLang bets that
# `1 − f` is enough.

# %% [markdown]
# ## 3 · What if
# One setting changed at a time, the readings kept (`kvlab explain-log --what-if KEY=VALUE`): a TP change moves the
# weights per rank and the KV heads per rank; a GPU change moves the free memory by the difference in totals.

# %%
what_if_figure(exp)

# %% [markdown]
# ## 4 · Your server, live
# Pick an example log, or paste / upload your own log and `config.json`. A pasted or uploaded log brings its own
# inputs: the model config from the model it names (else from its architecture and its own numbers: cell size,
# context length, what loading took), the GPU from the product name it prints, the TP size it ran with. Where it
# does not say, the panel asks (nothing is computed before a model config is chosen); nothing an earlier example
# set stays, and a config that contradicts the log is the error at the top of the verdict. The what-if controls
# recompute the pool with one setting changed.

# %% tags=["dashboard"]
from kvlab.viz.server_panel import ServerPanel  # imported here too: `kvlab app 05` runs this cell first

panel = ServerPanel()
panel.widget

# %%
print(f"panel: {panel.explanation.max_total_num_tokens_computed:,} tokens computed for {panel.example.value}; "
      f"SGLang {panel.comparison.sglang.tokens:,} vs vLLM {panel.comparison.vllm.tokens:,}")

# %% [markdown]
# ## 5 · What your server did: its runtime log
# Sections 1–4 explain how the server *sized* its pool. The lines it prints while it serves say what it *did* with
# it: SGLang's `Prefill batch` lines (new and cached prompt tokens, token usage, running and queued requests), its
# `Decode batch` lines (every 40th decode step) and `KV cache pool is full. Retract requests.` under pressure; vLLM's
# periodic stats and preemption warnings (`kvlab explain-log` reads the same lines; formats by version in
# docs/semantics.md, "Runtime logs"). kvlab draws them on one time axis, with the hit rate as SGLang computes it,
# Σ cached / Σ (new + cached), and says what the timeline shows, with the lines each finding rests on.
#
# The example is a kvlab simulation printed in SGLang 0.5.23's formats (`data/examples/runtime_logs/`, its first
# line says so); set `RUNTIME_LOG` to your own log, or paste / upload it in the panel below.

# %%
from kvlab.serving.runtime.report import format_runtime, runtime_json, runtime_timeline
from kvlab.viz.runtime_panel import runtime_example_path
from kvlab.viz.runtime_plots import runtime_timeline_figure

RUNTIME_LOG = None  # a server log with its runtime lines; None: the example
runtime_path = Path(RUNTIME_LOG) if RUNTIME_LOG else runtime_example_path()
timeline = runtime_timeline(runtime_path)
runtime = runtime_json(timeline)
print(format_runtime(runtime))

# %%
runtime_timeline_figure(timeline, title=f"Runtime: {runtime_path.name}")

# %% [markdown]
# Paste or upload your own log (the start-up lines may stay in: the pool size they print turns token usage into
# tokens).

# %% tags=["dashboard"]
from kvlab.viz.runtime_panel import RuntimePanel  # imported here too: `kvlab app 05` runs this cell first

runtime_panel = RuntimePanel()
runtime_panel.widget
