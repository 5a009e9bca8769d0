"""ModelConfig (read from a Hugging Face config.json by kvlab.model.hf_config, which also holds the presets:
config.json files in kvlab/model/presets/) and the KV bytes one token costs on one tensor-parallel rank.

Cell size mirrors SGLang's ``model_executor/pool_configurator.py::_compute_cell_size``:
- MHA/GQA: ``max(1, kv_heads // tp) × (head_dim + v_head_dim) × layers × kv_dtype_bytes``;
- MLA: ``(kv_lora_rank + qk_rope_head_dim) × layers × kv_dtype_bytes`` (one latent head, no TP split);
- an EAGLE draft shares token slots with the target: ``cell += int(cell × draft_layers / layers)``.

Only the KV geometry is required (layers, KV heads and head_dim, or MLA's ranks; the dtype): a config.json that
lacks a field the cell size does not need (``vocab_size``, ``max_position_embeddings``, ...) reads with that
field ``None`` and named in ``missing``; what needs it (the weights, the context length) says so
(:meth:`ModelConfig.require`).

``weight_specs`` lists the *runtime* parameters (SGLang's fused names: ``qkv_proj``, ``gate_up_proj``,
MoE ``w13``/``w2``) with each rank's shard shape, so a loader can allocate them on a device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvlab.errors import KvlabError

DTYPES = {
    "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}


# config.json fields the weights need beyond the KV geometry (vLLM's activation estimate needs them too)
WEIGHT_FIELDS = ("hidden_size", "num_attention_heads", "intermediate_size", "moe_intermediate_size", "vocab_size",
                 "qk_nope_head_dim")


class ConfigError(KvlabError, ValueError):
    """A model config kvlab cannot use; the message names the file and the field."""


@dataclass(frozen=True)
class WeightSpec:
    name: str
    full_shape: tuple[int, ...]
    shard_dim: int | None  # None = replicated on every rank
    tp_size: int
    dtype: torch.dtype
    pieces: tuple[tuple[str, int], ...] = ()  # fused params: (checkpoint name, rows) stacked along dim 0

    @property
    def shard_shape(self) -> tuple[int, ...]:
        if self.shard_dim is None:
            return self.full_shape
        shape = list(self.full_shape)
        shape[self.shard_dim] //= self.tp_size
        return tuple(shape)

    @property
    def shard_bytes(self) -> int:
        n = 1
        for d in self.shard_shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class ModelConfig:
    name: str
    num_layers: int
    hidden_size: int | None  # None: the config.json lacks it (named in ``missing``)
    num_attention_heads: int | None
    num_kv_heads: int
    head_dim: int
    intermediate_size: int | None
    vocab_size: int | None
    context_len: int | None = 8192  # max_position_embeddings; None where the config.json lacks it
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    # MLA (DeepSeek): a latent KV of kv_lora_rank + qk_rope_head_dim per token and layer
    attention: str = "mha"  # "mha" (incl. GQA) or "mla"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_k_dense_layers: int = 0
    # EAGLE-style draft: one decoder layer + fc over [embed; hidden], shares embeddings/lm_head
    is_eagle_draft: bool = False
    sliding_window: int = 0  # noted from config.json; the cell size does not use it (see hf_config)
    description: str = ""
    source: str = ""  # the config.json it was read from
    notes: tuple[str, ...] = ()  # what the reader assumed or left out, in words
    missing: tuple[str, ...] = ()  # config.json fields absent from the file (none that the KV cell size needs)

    def __post_init__(self) -> None:
        if self.attention not in ("mha", "mla"):
            raise ValueError(f"ModelConfig {self.name!r}: attention must be 'mha' or 'mla', got {self.attention!r}")
        for dtype_field in ("weight_dtype", "kv_dtype"):
            if getattr(self, dtype_field) not in DTYPES:
                raise ValueError(f"ModelConfig {self.name!r}: {dtype_field} must be one of {sorted(DTYPES)}")

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def lacks(self, fields=WEIGHT_FIELDS) -> tuple[str, ...]:
        """The config.json fields among ``fields`` that this config's file does not have."""
        return tuple(f for f in fields if f in self.missing)

    def require(self, needed_for: str, fields=WEIGHT_FIELDS) -> None:
        """Raise :class:`ConfigError` naming the file, the fields it lacks and what needs them."""
        absent = self.lacks(fields)
        if absent:
            names = ", ".join(f"'{f}'" for f in absent)
            raise ConfigError(f"{self.source or self.name}: no field {names}: {needed_for} needs "
                              f"{'it' if len(absent) == 1 else 'them'} (the KV cell size does not)")

    @property
    def torch_weight_dtype(self) -> torch.dtype:
        return DTYPES[self.weight_dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        return torch.empty((), dtype=DTYPES[self.kv_dtype]).element_size()

    # ---- KV cache ---------------------------------------------------------------------------
    def kv_heads_per_rank(self, tp_size: int = 1) -> int:
        return max(1, self.num_kv_heads // tp_size)

    def cell_size_bytes(self, tp_size: int = 1, draft_layers: int = 0) -> int:
        """KV bytes per token on one rank (all layers, K and V)."""
        if not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"tp_size must be a positive int, got {tp_size!r}")
        if self.attention == "mla":
            cell = (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers * self.kv_dtype_bytes
        else:
            v_dim = self.v_head_dim or self.head_dim
            cell = self.kv_heads_per_rank(tp_size) * (self.head_dim + v_dim) * self.num_layers * self.kv_dtype_bytes
        return cell + int(cell * draft_layers / self.num_layers)

    # ---- weights ----------------------------------------------------------------------------
    def weight_specs(self, tp_size: int = 1) -> list[WeightSpec]:
        """Runtime parameters in load order, with SGLang's TP sharding."""
        if not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"tp_size must be a positive int, got {tp_size!r}")
        self.require("the weights")
        dt = self.torch_weight_dtype
        norm_dt = torch.bfloat16 if dt == torch.float8_e4m3fn else dt
        h = self.hidden_size
        specs: list[WeightSpec] = []

        def add(name, shape, shard_dim, dtype=dt, pieces=()):
            if shard_dim is not None and shape[shard_dim] % tp_size:
                shard_dim = None  # not divisible: replicate (as SGLang does for kv heads < tp)
            specs.append(WeightSpec(name, tuple(shape), shard_dim, tp_size, dtype, tuple(pieces)))

        if not self.is_eagle_draft:
            add("model.embed_tokens.weight", (self.vocab_size, h), 0)
        else:
            add("model.fc.weight", (h, 2 * h), 0)
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            add(p + "input_layernorm.weight", (h,), None, norm_dt)
            self._add_attention_weights(add, p, norm_dt)
            add(p + "post_attention_layernorm.weight", (h,), None, norm_dt)
            self._add_mlp_weights(add, p, i, norm_dt)
        add("model.norm.weight", (h,), None, norm_dt)
        if not self.tie_word_embeddings and not self.is_eagle_draft:
            add("lm_head.weight", (self.vocab_size, h), 0)
        return specs

    def _add_attention_weights(self, add, p: str, norm_dt: torch.dtype) -> None:
        """One layer's attention weights (MLA's low-rank projections, or the fused QKV), in load order."""
        h = self.hidden_size
        if self.attention == "mla":
            q_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                add(p + "self_attn.q_a_proj.weight", (self.q_lora_rank, h), None)
                add(p + "self_attn.q_a_layernorm.weight", (self.q_lora_rank,), None, norm_dt)
                add(p + "self_attn.q_b_proj.weight", (self.num_attention_heads * q_head, self.q_lora_rank), 0)
            else:
                add(p + "self_attn.q_proj.weight", (self.num_attention_heads * q_head, h), 0)
            add(p + "self_attn.kv_a_proj_with_mqa.weight", (self.kv_lora_rank + self.qk_rope_head_dim, h), None)
            add(p + "self_attn.kv_a_layernorm.weight", (self.kv_lora_rank,), None, norm_dt)
            add(
                p + "self_attn.kv_b_proj.weight",
                (self.num_attention_heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
                0,
            )
            add(p + "self_attn.o_proj.weight", (h, self.num_attention_heads * self.v_head_dim), 1)
        else:
            q_rows = self.num_attention_heads * self.head_dim
            kv_rows = self.num_kv_heads * self.head_dim
            add(
                p + "self_attn.qkv_proj.weight",
                (q_rows + 2 * kv_rows, h),
                0,
                pieces=(("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)),
            )
            if self.qk_norm:
                add(p + "self_attn.q_norm.weight", (self.head_dim,), None, norm_dt)
                add(p + "self_attn.k_norm.weight", (self.head_dim,), None, norm_dt)
            add(p + "self_attn.o_proj.weight", (h, q_rows), 1)

    def _add_mlp_weights(self, add, p: str, i: int, norm_dt: torch.dtype) -> None:
        """One layer's MLP weights (the experts and shared experts of a MoE layer, or the dense MLP)."""
        h = self.hidden_size
        if self.num_experts and i >= self.first_k_dense_layers:
            e, mi = self.num_experts, self.moe_intermediate_size
            add(p + "mlp.gate.weight", (e, h), None, norm_dt)
            add(p + "mlp.experts.w13_weight", (e, 2 * mi, h), 1)
            add(p + "mlp.experts.w2_weight", (e, h, mi), 2)
            if self.num_shared_experts:
                si = mi * self.num_shared_experts
                add(p + "mlp.shared_experts.gate_up_proj.weight", (2 * si, h), 0,
                    pieces=(("gate_proj", si), ("up_proj", si)))
                add(p + "mlp.shared_experts.down_proj.weight", (h, si), 1)
        else:
            mi = self.intermediate_size
            add(p + "mlp.gate_up_proj.weight", (2 * mi, h), 0, pieces=(("gate_proj", mi), ("up_proj", mi)))
            add(p + "mlp.down_proj.weight", (h, mi), 1)

    def num_parameters(self) -> int:
        total = 0
        for spec in self.weight_specs(1):
            n = 1
            for d in spec.full_shape:
                n *= d
            total += n
        return total

    def weight_bytes_per_rank(self, tp_size: int = 1) -> int:
        return sum(spec.shard_bytes for spec in self.weight_specs(tp_size))

    def eagle_draft(self, num_layers: int = 1) -> ModelConfig:
        """An EAGLE draft head for this model: ``num_layers`` decoder layers + fc, shared embeddings."""
        return self.replace(name=f"{self.name}-eagle", num_layers=num_layers, is_eagle_draft=True,
                            num_experts=0, first_k_dense_layers=0,
                            intermediate_size=self.intermediate_size or self.moe_intermediate_size,
                            description=f"EAGLE draft head ({num_layers} layer) for {self.name}")
