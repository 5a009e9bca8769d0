"""SGLang's KV cell size (bytes per token on one rank) for a model config under one version's rule."""

from __future__ import annotations

from kvlab.model.config import ModelConfig
from kvlab.serving.sglang_log import LogError
from kvlab.serving.sglang_versions import CellRule


def config_cell(config: ModelConfig, rule: CellRule, attn_tp: int, dtype_bytes: int, mla_on: bool, where: str) -> int:
    """SGLang's cell size for ``config`` under a version's rule (kvlab.serving.sglang_versions.cell_rule)."""
    if config.attention == "mla":
        if not mla_on:
            raise LogError(f"{where}: sglang {rule.read} sizes this MLA model without MLA (MLA off: "
                           f"{'no MLA support' if rule.mla == 'no' else 'needs --enable-mla'}); kvlab does not "
                           f"model that cell size")
        return (config.kv_lora_rank + config.qk_rope_head_dim) * config.num_layers * dtype_bytes
    heads = config.num_kv_heads // attn_tp if rule.kv_heads == "floor" else max(1, config.num_kv_heads // attn_tp)
    if heads == 0:
        raise LogError(f"{where}: sglang {rule.read} gives each of {attn_tp} ranks {config.num_kv_heads} // "
                       f"{attn_tp} = 0 KV heads (it crashed on such a setup)")
    v_dim = config.v_head_dim or config.head_dim
    return heads * (config.head_dim + v_dim) * config.num_layers * dtype_bytes
