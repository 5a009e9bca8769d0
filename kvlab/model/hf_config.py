"""A Hugging Face ``config.json`` (a file, a folder holding one, or a preset kvlab ships) -> ModelConfig.

kvlab's model presets are such files (``kvlab/model/presets/<name>.json``) and go through the same
reader as a user's config, so a preset can never say more than its config.json does. Nothing is
downloaded: a hub id that is not a local path is refused.

What is read (the names Hugging Face's ``transformers`` configs use; aliases in ``_ALIASES``):

- MHA/GQA: ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (absent = MHA, as
  transformers defaults it), ``head_dim`` (explicit, else ``hidden_size // num_attention_heads``);
- MLA (DeepSeek-V2/V3, Kimi): ``kv_lora_rank`` + ``qk_rope_head_dim`` (one latent head per token);
- MoE: ``n_routed_experts`` / ``num_experts`` / ``num_local_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``n_shared_experts``, ``first_k_dense_replace``;
- a multimodal config's ``text_config`` (the language model is what owns the KV cache);
- ``sliding_window`` / ``layer_types``: noted, not used for the cell size (SGLang sizes every layer's
  KV for the full context unless the model runs as hybrid-SWA, which kvlab does not model);
- ``torch_dtype`` / ``dtype`` and ``quantization_config.quant_method`` for the weights.

Only the KV geometry is required: ``num_hidden_layers``; for MHA/GQA ``num_key_value_heads`` (or
``num_attention_heads``) and ``head_dim`` (or ``hidden_size`` and ``num_attention_heads``); for MLA
``kv_lora_rank`` and ``qk_rope_head_dim``; the dtype (``torch_dtype``, bfloat16 where absent, noted). A field
only the weights or the context length use (``hidden_size``, ``num_attention_heads``, ``intermediate_size``,
``vocab_size``, ``max_position_embeddings``, MLA's ``qk_nope_head_dim``) may be absent: the ModelConfig holds
``None`` and names it in ``missing``. Every missing KV field, and every malformed field, raises
:class:`ConfigError` naming the file and the field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kvlab.model.config import ConfigError, ModelConfig

PRESET_DIR = Path(__file__).resolve().parent / "presets"

# kv_cache_dtype names SGLang accepts (server_args: auto, fp8_e5m2, fp8_e4m3, bf16/bfloat16, fp16/float16)
KV_DTYPE_NAMES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
    "fp8_e4m3": "fp8_e4m3", "fp8": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "float32": "float32", "fp32": "float32",
}
_TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32",
                 "float": "float32", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_ALIASES = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads"),
    "num_key_value_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length",
                                "max_seq_len"),
    "num_experts": ("n_routed_experts", "num_experts", "num_local_experts"),
}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def resolve_config_path(source: str | Path) -> Path:
    """A preset name, a config.json file, or a folder holding config.json -> the file to read."""
    text = str(source)
    if text in preset_names():
        return PRESET_DIR / f"{text}.json"
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path}: folder holds no config.json")
        return path / "config.json"
    if path.is_file():
        return path
    raise ConfigError(
        f"{text}: no such file or folder, and not a kvlab preset (kvlab never downloads from the hub; "
        f"presets: {', '.join(preset_names())})"
    )


#: how deep a config.json may nest its values (the top-level object is level 1): Hugging Face configs nest a few
#: levels (``text_config.rope_scaling``, ``quantization_config.config_groups.group_0.weights``), and a value kvlab
#: read must stay shallow enough for every later walk (repr, json.dumps, comparisons) to finish without recursing out
MAX_JSON_DEPTH = 32
# a JSON string (escapes included), or one of the characters that shape the nesting
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]')


def too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> list | None:
    """The path (``["quantization_config", "a", 0]``: keys and indexes) of the first value of the JSON ``text`` that
    opens an object or array deeper than ``limit`` levels; None where none does. A scan of the text, no recursion."""
    path: list = []  # per open container: the key (object) or index (array) being read
    last_string = ""
    for m in _JSON_TOKENS.finditer(text):
        token = m.group()
        if token in ("{", "["):
            if len(path) >= limit:
                return path
            path.append(0 if token == "[" else "")
        elif token in ("}", "]"):
            if path:
                path.pop()
        elif token == ":" and path:
            path[-1] = last_string
        elif token == "," and path and isinstance(path[-1], int):
            path[-1] += 1
        elif token[0] == '"':
            last_string = token[1:-1]
    return None


def _nested_too_deep(origin: str | Path, path: list | None) -> ConfigError:
    """The error for a config nested past MAX_JSON_DEPTH, naming its top-level field and where it goes too deep."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path or ()).lstrip(".")
    where = where if len(where) <= 80 else where[:77] + "..."
    named = f"field {path[0]!r:.60} is" if path and isinstance(path[0], str) else "its values are"
    return ConfigError(f"{origin}: {named} nested more than {MAX_JSON_DEPTH} levels deep" + (f" (at {where})" if where
                       else "") + ": not a Hugging Face config.json (they nest a few levels)")


def read_config_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected a Hugging Face config.json)") from None
    return config_json_from_text(text, path)


def config_json_from_text(text: str, origin: str | Path) -> dict:
    """The JSON object of a config.json's ``text``; a ConfigError naming ``origin`` (and the line, or the field) where
    it is no JSON, is nested deeper than MAX_JSON_DEPTH, or is no object."""
    deep = too_deep(text)
    if deep is not None:
        raise _nested_too_deep(origin, deep)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{origin}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
    except RecursionError:  # the scan above counts as json does; this stays as a second guard
        raise _nested_too_deep(origin, None) from None
    except ValueError:  # Python reads no integer of more than 4,300 digits
        key = re.search(r'"([^"\\]{0,80})"\s*:\s*-?\d{4000}', text)
        raise ConfigError(f"{origin}: {f'field {key.group(1)!r} holds' if key else 'it holds'} a number of more "
                          f"than 4,300 digits: not a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}")
    return data


def load_model_config(source: str | Path, *, kv_cache_dtype: str = "auto", name: str | None = None) -> ModelConfig:
    """Read a preset name, a config.json, or a folder holding one into a :class:`ModelConfig`."""
    path = resolve_config_path(source)
    data = read_config_json(path)
    if name is None:
        name = path.stem if path.parent == PRESET_DIR else str(data.get("_name_or_path") or path.parent.name
                                                               or path.stem)
    return config_from_dict(data, name=name, origin=str(path), kv_cache_dtype=kv_cache_dtype)


#: the largest value kvlab takes for a count or a size in a config.json: no model comes near it (the largest
#: released ones in the comments), and a value past it would make a loop over the layers, or a sum over the weight
#: shapes, run for minutes or hours; a field not listed here is bounded by MAX_FIELD
FIELD_LIMITS = {
    "num_hidden_layers": 1_024,  # 126 (Llama 3.1 405B)
    "first_k_dense_replace": 1_024,
    "hidden_size": 262_144,  # 16,384 (Llama 3.1 405B)
    "num_attention_heads": 4_096,  # 128 (DeepSeek-V3, Llama 3.1 405B)
    "num_key_value_heads": 4_096,
    "head_dim": 16_384,  # 256 (Gemma)
    "qk_rope_head_dim": 16_384,  # 64 (DeepSeek-V3)
    "qk_nope_head_dim": 16_384,  # 128
    "v_head_dim": 16_384,  # 128
    "kv_lora_rank": 65_536,  # 512
    "q_lora_rank": 65_536,  # 1,536
    "vocab_size": 16_777_216,  # 262,144 (Gemma 3)
    "intermediate_size": 4_194_304,  # 53,248 (Llama 3.1 405B)
    "moe_intermediate_size": 4_194_304,
    "shared_expert_intermediate_size": 4_194_304,
    "num_experts": 16_384,  # 512 (Qwen3-Next)
    "num_experts_per_tok": 16_384,
    "n_shared_experts": 16_384,
    "max_position_embeddings": 1 << 32,  # 10,485,760 (Llama 4 Scout)
}
MAX_FIELD = 10**12


class _Fields:
    """Typed field access that names the file and the field in every error."""

    def __init__(self, data: dict, origin: str, prefix: str = ""):
        self.data, self.origin, self.prefix = data, origin, prefix

    def has(self, key: str) -> bool:
        return any(self.data.get(alias) is not None for alias in _ALIASES.get(key, (key,)))

    def raw(self, key: str) -> tuple[str, Any]:
        for alias in _ALIASES.get(key, (key,)):
            if self.data.get(alias) is not None:
                return alias, self.data[alias]
        return key, None

    def optional(self, key: str, missing: list[str], minimum: int = 1) -> int | None:
        """A positive integer field the KV cell size does not need: ``None`` (and ``key`` added to
        ``missing``) where the file lacks it; an error where it is there but malformed."""
        if not self.has(key):
            missing.append(key)
            return None
        return self.int(key, minimum=minimum)

    def int(self, key: str, *, default: int | None = None, minimum: int = 1, why: str = "") -> int:
        alias, value = self.raw(key)
        if value is None:
            if default is not None:
                return default
            names = " / ".join(f"'{a}'" for a in _ALIASES.get(key, (key,)))
            raise ConfigError(f"{self.origin}: field {self.prefix}{names} is missing" + (f" ({why})" if why else ""))
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{self.origin}: field '{self.prefix}{alias}' must be an integer >= {minimum}, "
                              f"got {value!r:.60}")
        limit = FIELD_LIMITS.get(key, MAX_FIELD)
        if value > limit:
            digits = str(value)
            shown = f"{value:,}" if len(digits) <= 30 else f"{digits[:20]}... ({len(digits)} digits)"
            raise ConfigError(f"{self.origin}: field '{self.prefix}{alias}' must be at most {limit:,} (beyond any "
                              f"model: kvlab stops there), got {shown}")
        return value


def _weight_dtype(data: dict, f: _Fields, notes: list[str]) -> str:
    raw = data.get("torch_dtype") or data.get("dtype")
    if raw is None:
        notes.append("no torch_dtype: the weights (and KV dtype auto) taken as bfloat16")
        raw = "bfloat16"
    dtype = _TORCH_DTYPES.get(str(raw).removeprefix("torch."))
    if dtype is None:
        raise ConfigError(f"{f.origin}: field 'torch_dtype' must be one of {sorted(_TORCH_DTYPES)}, got {raw!r:.60}")
    quant = data.get("quantization_config") or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "fp8":
        return "fp8"
    if method:
        notes.append(f"weights quantized with {method!r:.60}: kvlab's weight bytes assume {dtype}, not the "
                     f"quantized size (the KV cell size does not depend on it)")
    return dtype


def _kv_dtype(kv_cache_dtype: str, weight_dtype: str, origin: str, notes: list[str]) -> str:
    if kv_cache_dtype in (None, "", "auto"):
        # SGLang: kv_cache_dtype auto = the model's dtype (an fp8 checkpoint still runs in bf16)
        if weight_dtype == "float32":
            notes.append("dtype auto on a float32 config: SGLang serves it in 16-bit; KV taken as bfloat16")
            return "bfloat16"
        return "bfloat16" if weight_dtype == "fp8" else weight_dtype
    name = KV_DTYPE_NAMES.get(str(kv_cache_dtype).lower())
    if name is None:
        raise ConfigError(f"{origin}: kv_cache_dtype must be auto or one of {sorted(KV_DTYPE_NAMES)}, "
                          f"got {kv_cache_dtype!r}")
    return name


def _language_model(data: dict, origin: str, notes: list[str]) -> tuple[dict, str]:
    """The part of ``data`` that owns the KV cache (a multimodal config's text_config) and its field prefix."""
    if _Fields(data, origin).has("num_hidden_layers") or not isinstance(data.get("text_config"), dict):
        return data, ""
    text = dict(data["text_config"])
    notes.append("multimodal config: the language model's text_config owns the KV cache; vision encoder "
                 "memory is not modelled")
    for key in ("torch_dtype", "dtype", "quantization_config"):
        text.setdefault(key, data.get(key))
    return text, "text_config."


def _mla_shape(f: _Fields, heads: int | None, missing: list[str], notes: list[str]) -> tuple[int, ...]:
    """MLA's cache shape: (kv_heads, head_dim, kv_lora_rank, qk_rope, qk_nope, v_head_dim)."""
    kv_heads = heads or 1  # one latent per token and layer: MLA's cell does not count heads
    kv_lora_rank = f.int("kv_lora_rank", why="MLA latent size")
    qk_rope = f.int("qk_rope_head_dim", why="MLA caches kv_lora_rank + qk_rope_head_dim per token and layer")
    qk_nope = f.optional("qk_nope_head_dim", missing) or 0
    v_head_dim = f.int("v_head_dim", default=qk_nope, minimum=0)
    notes.append(f"MLA: one latent of {kv_lora_rank} + {qk_rope} per token and layer, not split by TP")
    return kv_heads, qk_nope + qk_rope, kv_lora_rank, qk_rope, qk_nope, v_head_dim


def _kv_heads(f: _Fields, heads: int | None, notes: list[str]) -> int:
    """The number of KV heads of an MHA/GQA/MQA model, checked to divide the attention heads."""
    origin, prefix = f.origin, f.prefix
    if f.has("num_key_value_heads"):
        kv_heads = f.int("num_key_value_heads")
    elif f.data.get("multi_query") is True:
        kv_heads = 1
        notes.append("multi_query: one KV head")
    elif heads is not None:
        kv_heads = heads
        notes.append("no num_key_value_heads: MHA, as transformers assumes (KV heads = attention heads)")
    else:
        raise ConfigError(f"{origin}: field '{prefix}num_key_value_heads' is missing, and so is "
                          f"'{prefix}num_attention_heads' (MHA takes one from the other): needed for the KV "
                          f"cell size")
    if heads is not None and (kv_heads > heads or heads % kv_heads):
        raise ConfigError(f"{origin}: field '{prefix}num_key_value_heads' = {kv_heads} must divide "
                          f"num_attention_heads = {heads}")
    return kv_heads


def _head_dim(f: _Fields, hidden: int | None, heads: int | None) -> int:
    """``head_dim`` as given, else hidden_size / num_attention_heads."""
    origin, prefix = f.origin, f.prefix
    if f.data.get("head_dim") is not None:
        return f.int("head_dim")
    if hidden is None or heads is None:
        lacking = " and ".join(f"'{prefix}{k}'" for k, v in (("hidden_size", hidden),
                                                              ("num_attention_heads", heads)) if v is None)
        raise ConfigError(f"{origin}: field '{prefix}head_dim' is missing, and so is {lacking} to derive it "
                          f"from (head_dim = hidden_size / num_attention_heads): needed for the KV cell size")
    if hidden % heads:
        raise ConfigError(f"{origin}: no field '{prefix}head_dim', and hidden_size {hidden} is not a "
                          f"multiple of num_attention_heads {heads}")
    return hidden // heads


def _moe_shape(f: _Fields, missing: list[str], notes: list[str]) -> tuple[int, int | None, int, int]:
    """The MLP widths: (num_experts, intermediate_size, moe_intermediate_size, num_shared_experts)."""
    experts = f.int("num_experts", default=0, minimum=0)
    moe_inter = f.int("moe_intermediate_size", default=0, minimum=0)
    inter = f.optional("intermediate_size", missing, minimum=0)
    if experts and not moe_inter:  # Mixtral: intermediate_size is each expert's
        moe_inter = inter or 0
        if inter is None:
            missing.append("moe_intermediate_size")
    if experts and inter is None and not f.int("first_k_dense_replace", default=0, minimum=0):
        missing.remove("intermediate_size")  # every layer is MoE: no dense MLP width to know
        inter = 0
    shared = f.int("n_shared_experts", default=0, minimum=0)
    shared_inter = f.int("shared_expert_intermediate_size", default=0, minimum=0)
    if not shared and shared_inter and moe_inter:
        shared = max(1, round(shared_inter / moe_inter))
    if experts:
        notes.append(f"MoE: {experts} experts, {f.int('num_experts_per_tok', default=0, minimum=0)} per token")
    return experts, inter, moe_inter, shared


def _sliding_window(data: dict, layers: int, notes: list[str]) -> int:
    """The sliding window (0 for none), with a note on how SGLang sizes the pool for it."""
    window = data.get("sliding_window") if data.get("use_sliding_window", True) is not False else None
    window = window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else 0
    if window:
        kinds = data.get("layer_types") or []
        sliding = sum(1 for k in kinds if "sliding" in str(k)) if isinstance(kinds, list) else 0
        notes.append(f"sliding window {window}" + (f" on {sliding} of {layers} layers" if sliding else "")
                     + ": SGLang still sizes the pool per full-context token unless it runs the model as "
                       "hybrid SWA, which kvlab does not model")
    return window


def _architecture(data: dict, origin: str) -> str:
    """The model's architecture name (architectures[0], else model_type)."""
    archs = data.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else data.get("model_type", "")
    if not isinstance(arch, str):  # a name, nothing else: it is matched by prefix below
        raise ConfigError(f"{origin}: architectures[0] / model_type must be a string, got {arch!r:.60}")
    return arch


def config_from_dict(data: dict, *, name: str, origin: str, kv_cache_dtype: str = "auto") -> ModelConfig:
    notes: list[str] = []
    meta = data.get("kvlab") if isinstance(data.get("kvlab"), dict) else {}
    data, prefix = _language_model(data, origin, notes)
    f = _Fields(data, origin, prefix)
    missing: list[str] = []
    layers = f.int("num_hidden_layers", why="needed for the KV cell size")
    hidden = f.optional("hidden_size", missing)
    heads = f.optional("num_attention_heads", missing)
    mla = data.get("kv_lora_rank") is not None
    if mla:
        kv_heads, head_dim, kv_lora_rank, qk_rope, qk_nope, v_head_dim = _mla_shape(f, heads, missing, notes)
    else:
        kv_lora_rank = qk_rope = qk_nope = v_head_dim = 0
        kv_heads = _kv_heads(f, heads, notes)
        head_dim = _head_dim(f, hidden, heads)
    context = f.optional("max_position_embeddings", missing)
    vocab = f.optional("vocab_size", missing)
    experts, inter, moe_inter, shared = _moe_shape(f, missing, notes)
    window = _sliding_window(data, layers, notes)
    weight_dtype = _weight_dtype(data, f, notes)
    arch = _architecture(data, origin)
    return ModelConfig(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=inter, vocab_size=vocab, context_len=context,
        weight_dtype=weight_dtype, kv_dtype=_kv_dtype(kv_cache_dtype, weight_dtype, origin, notes),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        qk_norm=arch.startswith("Qwen3") or bool(meta.get("qk_norm", False)),
        attention="mla" if mla else "mha", q_lora_rank=f.int("q_lora_rank", default=0, minimum=0),
        kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope, qk_nope_head_dim=qk_nope, v_head_dim=v_head_dim,
        num_experts=experts, num_experts_per_tok=f.int("num_experts_per_tok", default=0, minimum=0),
        moe_intermediate_size=moe_inter, num_shared_experts=shared,
        first_k_dense_layers=f.int("first_k_dense_replace", default=0, minimum=0),
        sliding_window=window,
        description=str(meta.get("description", arch)), source=origin, notes=tuple(notes), missing=tuple(missing),
    )


MODEL_PRESETS: dict[str, ModelConfig] = {name: load_model_config(name) for name in preset_names()}


def get_model_config(name: str) -> ModelConfig:
    """A preset kvlab ships, by name (``kvlab/model/presets/<name>.json``, read as a user's config is)."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(sorted(MODEL_PRESETS))}") from None
