"""Example start-up logs kvlab writes itself, in several versions' formats (data/examples/server_logs/).

Each :class:`ServerExample` names its engine, version, model config and GPU; :func:`render_example` writes its
log with :func:`kvlab.serving.sglang_formats.render_sglang_log` / :func:`kvlab.serving.vllm_log.render_vllm_log`
from numbers kvlab computes (:mod:`kvlab.serving.engine_compare`'s inputs and rules), so every example is
consistent with the rules it teaches. Nothing is copied from anyone's log.

The two ``qwen3-235b-fp8-4xh100`` logs rebuild vllm-project/vllm#21348 (Qwen3-235B-A22B-FP8 on 4×H100: 178,880
tokens on vLLM, 367,404 on SGLang): the pool sizes, the "8.11 GiB" available, the K/V sizes and the launch
settings (TP 4, ``--mem-fraction-static 0.93``; vLLM's defaults) are the report's; the readings the report did
not show (free memory before/after loading, the other workers' available memory, what loading took) are
kvlab's reconstruction: the 2-decimal readings closest to the reported pool, 55.17 GiB loaded (the FP8
checkpoint's weights per rank). Each log names those readings in a ``# kvlab-reconstructed:`` line
(:mod:`kvlab.serving.provenance`), so every number resting on them shows as assumed.

Regenerate: ``python -m kvlab.serving.examples data/examples/server_logs``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.device.spec import DEVICE_PRESETS
from kvlab.paths import data_dir
from kvlab.serving.pool import sglang_tokens
from kvlab.serving.provenance import marker_line
from kvlab.units import GiB

DATA_DIR = data_dir()
LOG_DIR = DATA_DIR / "examples" / "server_logs"


@dataclass(frozen=True)
class ServerExample:
    name: str
    engine: str  # "sglang" | "vllm"
    version: str
    model: str  # a kvlab preset name or a path under data/
    gpu: str  # a kvlab GPU preset
    tp_size: int
    description: str
    settings: dict = field(default_factory=dict)
    reconstructed: tuple[str, ...] = ()  # readings kvlab rebuilt (kvlab.serving.provenance), marked in the log

    @property
    def reconstructed_line(self) -> str:
        return marker_line(self.reconstructed, REBUILT_WHY) if self.reconstructed else ""

    @property
    def filename(self) -> str:
        return f"{self.name}.log"

    @property
    def model_source(self) -> str:
        path = DATA_DIR / self.model
        return str(path) if path.exists() else self.model

    def model_config(self):
        from kvlab.model.hf_config import load_model_config

        return load_model_config(self.model_source)


QWEN_FP8 = "examples/models/qwen3-235b-a22b-fp8"
REBUILT_WHY = "vllm#21348 did not print these; kvlab chose them to give the reported pool (data/README.md)"
EXAMPLES = (
    ServerExample("qwen3-235b-fp8-4xh100-sglang-0.4.9", "sglang", "0.4.9", QWEN_FP8, "h100-80g", 4,
                  "vllm#21348's SGLang run: 367,404 tokens at --mem-fraction-static 0.93 (readings rebuilt)",
                  {"fraction": 0.93, "before": 77.03, "after": 21.86, "tokens": 367_404},
                  ("free_before_load", "free_after_load")),
    ServerExample("qwen3-235b-fp8-4xh100-vllm-0.10.1.1", "vllm", "0.10.1.1", QWEN_FP8, "h100-80g", 4,
                  "vllm#21348's vLLM run: 178,880 tokens, 'Available KV cache memory: 8.11 GiB' on one worker",
                  {"weights": 55.15, "available": [8.11, 8.02, 8.02, 8.02], "tokens": 178_880},
                  ("model_loading", "available@1", "available@2", "available@3")),
    ServerExample("llama-3.1-8b-h100-sglang-0.5.23", "sglang", "0.5.23", "llama-3.1-8b", "h100-80g", 1,
                  "Llama 3.1 8B on one H100, today's SGLang and its default fraction"),
    ServerExample("qwq-32b-4xl4-sglang-0.4.3.post3", "sglang", "0.4.3.post3", "qwq-32b", "l4", 4,
                  "QwQ-32B on 4×L4 (24 GB cards): the pool is small beside the 131,072-token context"),
    ServerExample("llama-3.1-8b-a100-sglang-0.2.9", "sglang", "0.2.9", "llama-3.1-8b", "a100-80g", 1,
                  "Llama 3.1 8B on an A100 80 GB, a 2024 SGLang (its [gpu=N] prefix, the TP table default)"),
    ServerExample("llama-3.1-70b-4xh100-vllm-0.34.0", "vllm", "0.34.0", "llama-3.1-70b", "h100-80g", 4,
                  "Llama 3.1 70B on 4×H100, today's vLLM (extensible KV cache, one-line pool message)"),
)


def get_example(name: str) -> ServerExample:
    for ex in EXAMPLES:
        if ex.name == name:
            return ex
    raise KeyError(f"no example log {name!r}; examples: {', '.join(e.name for e in EXAMPLES)}")


def _sglang(ex: ServerExample, config) -> str:
    from kvlab.serving.engine_compare import estimate_inputs, kv_cell
    from kvlab.serving.sglang_formats import default_server_args, render_sglang_log
    from kvlab.serving.sglang_versions import default_mem_fraction, rope_reserve_for_config

    device = DEVICE_PRESETS[ex.gpu]
    cell, _ = kv_cell(config, ex.tp_size, config.kv_dtype_bytes)
    if "before" in ex.settings:
        before, after, fraction = ex.settings["before"], ex.settings["after"], ex.settings["fraction"]
        tokens = ex.settings["tokens"]
    else:
        mem = estimate_inputs(config, device, ex.tp_size)
        before = round(mem.total.gib - mem.startup.gib, 2)
        after = round(before - mem.weights.gib - 0.08, 2)  # + a little the loader keeps (buffers, rope caches)
        fraction = default_mem_fraction(ex.version, ex.tp_size, device.smi_mib).value
        # 0.5.8+ grows the RoPE cache after 'Load weight end', before the reading SGLang sizes the pool with
        rope = rope_reserve_for_config(ex.version, config) / GiB
        tokens = sglang_tokens(before, after - rope, fraction, cell)
    pool_gib = (tokens + 1) * cell / GiB
    args = default_server_args(ex.version, tp_size=ex.tp_size, mem_fraction_static=fraction)
    archs = {"qwq-32b": "Qwen2ForCausalLM"}
    arch = "Qwen3MoeForCausalLM" if "qwen3" in ex.model else archs.get(ex.model, "LlamaForCausalLM")
    text = render_sglang_log(ex.version, before_gib=before, after_gib=after, pool_end_gib=round(after - pool_gib, 2),
                             tokens=tokens, context_len=config.context_len, cell_size_bytes=cell,
                             tp_size=ex.tp_size, server_args=args, arch=arch)
    return text + (ex.reconstructed_line + "\n" if ex.reconstructed else "")


def _vllm(ex: ServerExample, config) -> str:
    from kvlab.serving.engine_compare import estimate_inputs, kv_cell
    from kvlab.serving.vllm_budget import vllm_budget, vllm_rule
    from kvlab.serving.vllm_log import render_vllm_log

    cell, _ = kv_cell(config, ex.tp_size, config.kv_dtype_bytes)
    if "available" in ex.settings:
        weights, available, tokens = ex.settings["weights"], ex.settings["available"], ex.settings["tokens"]
        util = 0.9
    else:
        mem = estimate_inputs(config, DEVICE_PRESETS[ex.gpu], ex.tp_size)
        rule = vllm_rule(ex.version)
        budget = vllm_budget(total=mem.total, startup=mem.startup, weights=mem.weights, activation=mem.activation,
                             non_torch=mem.non_torch, cuda_graph=mem.cuda_graph, cell_size_bytes=cell, rule=rule)
        weights, available, tokens = mem.weights.gib, round(budget.budget_gib, 2), budget.tokens
        util = rule.default_utilization
    return render_vllm_log(ex.version, weights_gib=weights, available_gib=available, tokens=tokens,
                           max_model_len=config.context_len, tp_size=ex.tp_size, gpu_memory_utilization=util,
                           reconstructed=ex.reconstructed, reconstructed_why=REBUILT_WHY)


def render_example(ex: ServerExample) -> str:
    config = ex.model_config()
    return _sglang(ex, config) if ex.engine == "sglang" else _vllm(ex, config)


def write_example_logs(out_dir=LOG_DIR) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for ex in EXAMPLES:
        path = out / ex.filename
        path.write_text(render_example(ex), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":  # python -m kvlab.serving.examples [OUT_DIR]
    for written in write_example_logs(sys.argv[1] if len(sys.argv) > 1 else LOG_DIR):
        print(written)
