"""Reading a Hugging Face config.json: MHA/GQA/MLA/MoE, TP, KV dtypes, and every field error naming the file."""

import json

import pytest

from kvlab.model.hf_config import (
    MODEL_PRESETS,
    PRESET_DIR,
    ConfigError,
    get_model_config,
    load_model_config,
    preset_names,
)

LLAMA3_8B = {  # the architecture numbers of meta-llama/Meta-Llama-3-8B's config.json
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


def _write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_presets_are_config_files_read_by_the_same_reader():
    assert set(preset_names()) == set(MODEL_PRESETS)
    for name in preset_names():
        assert (PRESET_DIR / f"{name}.json").is_file()
        assert load_model_config(name) == MODEL_PRESETS[name] == get_model_config(name)


def test_gqa_file_and_folder(tmp_path):
    path = _write(tmp_path, LLAMA3_8B)
    for source in (path, tmp_path, str(tmp_path)):
        cfg = load_model_config(source)
        assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.context_len) == (32, 8, 128, 8192)
        # 8 KV heads × (128 + 128) × 32 layers × 2 B
        assert cfg.cell_size_bytes(1) == 131_072
        assert cfg.cell_size_bytes(4) == 2 * 256 * 32 * 2 == 32_768
        assert cfg.cell_size_bytes(16) == 1 * 256 * 32 * 2  # fewer KV heads than ranks: replicated


def test_explicit_head_dim_wins_over_hidden_over_heads(tmp_path):
    # Qwen3-0.6B: hidden 1024 / 16 heads would be 64, but config.json says head_dim 128
    cfg = load_model_config(_write(tmp_path, {**LLAMA3_8B, "hidden_size": 1024, "num_attention_heads": 16,
                                              "head_dim": 128, "num_hidden_layers": 28}))
    assert cfg.head_dim == 128 and cfg.cell_size_bytes(1) == 8 * 256 * 28 * 2 == 114_688


def test_mla_cell_is_latent_and_not_split_by_tp():
    cfg = get_model_config("deepseek-v2-lite")
    assert cfg.attention == "mla"
    assert cfg.cell_size_bytes(1) == cfg.cell_size_bytes(8) == (512 + 64) * 27 * 2 == 31_104


@pytest.mark.parametrize("kv_dtype,bytes_per", [("auto", 2), ("bf16", 2), ("fp16", 2), ("fp8_e4m3", 1),
                                                ("fp8_e5m2", 1)])
def test_kv_dtype(tmp_path, kv_dtype, bytes_per):
    cfg = load_model_config(_write(tmp_path, LLAMA3_8B), kv_cache_dtype=kv_dtype)
    assert cfg.cell_size_bytes(1) == 8 * 256 * 32 * bytes_per


def test_fp8_checkpoint_keeps_16_bit_kv_under_auto(tmp_path):
    data = {**LLAMA3_8B, "quantization_config": {"quant_method": "fp8"}}
    cfg = load_model_config(_write(tmp_path, data))
    assert cfg.weight_dtype == "fp8" and cfg.kv_dtype == "bfloat16"


def test_moe_sliding_window_and_multimodal_are_noted(tmp_path):
    data = {"architectures": ["SomeVLM"], "torch_dtype": "bfloat16",
            "text_config": {**LLAMA3_8B, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 4096}}
    cfg = load_model_config(_write(tmp_path, data))
    assert cfg.num_experts == 8 and cfg.moe_intermediate_size == 14336  # Mixtral: per-expert intermediate_size
    assert cfg.sliding_window == 4096
    notes = " ".join(cfg.notes)
    assert "text_config" in notes and "sliding window 4096" in notes and "MoE: 8 experts" in notes


def test_missing_kv_heads_means_mha(tmp_path):
    data = dict(LLAMA3_8B)
    del data["num_key_value_heads"]
    cfg = load_model_config(_write(tmp_path, data))
    assert cfg.num_kv_heads == 32 and any("MHA" in n for n in cfg.notes)


# only the KV geometry: what the cell size reads, nothing the weights or the context length need
LLAMA3_8B_KV = {"num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"}
DEEPSEEK_V2_LITE_KV = {"num_hidden_layers": 27, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}


def test_kv_fields_alone_give_the_cell_and_name_what_is_absent(tmp_path):
    full = load_model_config(_write(tmp_path, LLAMA3_8B, "full.json"))
    kv = load_model_config(_write(tmp_path, LLAMA3_8B_KV, "kv.json"))
    assert kv.cell_size_bytes(1) == full.cell_size_bytes(1) == 32 * 8 * 256 * 2
    assert kv.cell_size_bytes(4) == full.cell_size_bytes(4) and kv.kv_dtype == full.kv_dtype == "bfloat16"
    assert full.missing == () and full.lacks() == ()
    assert set(kv.missing) == {"hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                               "max_position_embeddings"}
    assert kv.context_len is None and kv.vocab_size is None and kv.hidden_size is None
    mla = load_model_config(_write(tmp_path, DEEPSEEK_V2_LITE_KV, "mla.json"))
    assert mla.cell_size_bytes(8) == (512 + 64) * 27 * 2 and mla.attention == "mla"
    assert "qk_nope_head_dim" in mla.missing and "vocab_size" in mla.missing


def test_what_needs_an_absent_field_names_it(tmp_path):
    kv = load_model_config(_write(tmp_path, LLAMA3_8B_KV))
    with pytest.raises(ConfigError) as err:
        kv.weight_bytes_per_rank(1)
    message = str(err.value)
    assert str(tmp_path / "config.json") in message and "the weights needs them" in message
    for name in ("'hidden_size'", "'num_attention_heads'", "'intermediate_size'", "'vocab_size'"):
        assert name in message
    no_vocab = load_model_config(_write(tmp_path, {k: v for k, v in LLAMA3_8B.items() if k != "vocab_size"}, "v.json"))
    assert no_vocab.missing == ("vocab_size",) and no_vocab.context_len == 8192
    with pytest.raises(ConfigError, match=r"v\.json: no field 'vocab_size': the weights needs it"):
        no_vocab.weight_specs(1)


def test_moe_without_widths_names_the_expert_width(tmp_path):
    data = {**LLAMA3_8B, "num_local_experts": 8, "num_experts_per_tok": 2}
    del data["intermediate_size"]
    cfg = load_model_config(_write(tmp_path, data))
    assert cfg.missing == ("moe_intermediate_size",) and cfg.intermediate_size == 0
    with pytest.raises(ConfigError, match="no field 'moe_intermediate_size'"):
        cfg.weight_bytes_per_rank(1)


def test_absent_torch_dtype_is_noted(tmp_path):
    data = {k: v for k, v in LLAMA3_8B.items() if k != "torch_dtype"}
    cfg = load_model_config(_write(tmp_path, data))
    assert cfg.kv_dtype == "bfloat16" and any("no torch_dtype" in n for n in cfg.notes)


@pytest.mark.parametrize("change,message", [
    ({"num_hidden_layers": None}, "field 'num_hidden_layers' / 'n_layer' / 'num_layers' / 'n_layers' is missing"),
    ({"num_attention_heads": "32"}, "field 'num_attention_heads' must be an integer >= 1, got '32'"),
    ({"num_key_value_heads": 0}, "field 'num_key_value_heads' must be an integer >= 1, got 0"),
    ({"num_key_value_heads": 5}, "'num_key_value_heads' = 5 must divide num_attention_heads = 32"),
    ({"hidden_size": 4001}, "hidden_size 4001 is not a multiple of num_attention_heads 32"),
    ({"hidden_size": None}, "field 'head_dim' is missing, and so is 'hidden_size' to derive it from"),
    ({"num_attention_heads": None, "num_key_value_heads": None},
     "field 'num_key_value_heads' is missing, and so is 'num_attention_heads'"),
    ({"max_position_embeddings": 0}, "field 'max_position_embeddings' must be an integer >= 1, got 0"),
    ({"vocab_size": -1}, "field 'vocab_size' must be an integer >= 1, got -1"),
    ({"torch_dtype": "int4"}, "field 'torch_dtype' must be one of"),
    ({"kv_lora_rank": 512}, "field 'qk_rope_head_dim' is missing (MLA caches"),
])
def test_bad_fields_name_file_and_field(tmp_path, change, message):
    data = {k: v for k, v in {**LLAMA3_8B, **change}.items() if v is not None}
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_model_config(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_bad_files(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(ConfigError, match=r"broken.json:3:3: not valid JSON"):
        load_model_config(broken)
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_model_config(_write(tmp_path, [1, 2], "list.json"))
    with pytest.raises(ConfigError, match="folder holds no config.json"):
        load_model_config(tmp_path / "..")
    with pytest.raises(ConfigError, match="never downloads from the hub"):
        load_model_config("meta-llama/Llama-3.1-8B")
    with pytest.raises(ConfigError, match="kv_cache_dtype must be auto or one of"):
        load_model_config(_write(tmp_path, LLAMA3_8B), kv_cache_dtype="int8")


@pytest.mark.parametrize("name,published", [("llama-3-8b", 8.03e9), ("deepseek-v2-lite", 15.7e9)])
def test_new_preset_parameter_counts(name, published):
    assert abs(get_model_config(name).num_parameters() / published - 1) < 0.01
