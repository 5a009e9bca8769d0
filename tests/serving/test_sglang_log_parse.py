"""Reading lines as users paste them: DP/TP tags, docker-compose and tqdm debris, ROCm builds, server_args with
nested values and elided fields, launch commands, version lines."""

from kvlab.serving.sglang_log import parse_sglang_log, split_top_level


def test_tags_debris_and_rocm():
    text = "\n".join([
        "sglang-1  | [2025-05-01 10:00:00 DP1 TP3] Load weight begin. avail mem=180.01 GB",
        " 61%|█████▎     | 179/292 [00:01<00:00, 130.83it/s][2025-05-01 10:00:09 DP1 TP3] Load weight end. "
        "type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=100.50 GB, mem usage=79.51 GB.",
        "sglang-1  | [2025-05-01 10:00:00 DP0 TP3] Load weight begin. avail mem=180.02 GB",
        "ROCM_HOME: /opt/rocm",
        "GPU 0,1,2,3,4,5,6,7: AMD Instinct MI300X",
    ])
    log = parse_sglang_log(text)
    assert set(log.ranks) == {"DP1 TP3", "DP0 TP3"}
    r = log.ranks["DP1 TP3"]
    assert (r.tp_rank, r.before_gib, r.after_gib, r.weights_usage_gib) == (3, 180.01, 100.50, 79.51)
    assert r.lines == {"begin": 1, "end": 2}
    assert log.rocm and log.gpu_name == "AMD Instinct MI300X" and log.arch == "DeepseekV3ForCausalLM"


def test_server_args_nested_and_elided():
    line = ("[2025-02-09 20:33:04] server_args=ServerArgs(model_path='a, b', json_model_override_args='{}', "
            "lora_paths=None, cuda_graph_bs=[1, 2, 4], ... mem_fraction_static=0.88, ..., tp_size=2)  [excerpt]")
    log = parse_sglang_log(line)
    assert log.server_args["model_path"] == "a, b" and log.server_args["cuda_graph_bs"] == "[1, 2, 4]"
    assert log.setting("mem_fraction_static")[0] == "0.88" and log.setting("tp_size")[0] == "2"
    assert split_top_level("a=1, b='x, y', c=(1, 2)") == ["a=1", "b='x, y'", "c=(1, 2)"]


def test_launch_command_and_versions():
    for text, version in (("sglang==0.1.17", "0.1.17"), ("sglang: 0.4.2.post3", "0.4.2.post3"),
                          ("sglang                            0.4.6.post5", "0.4.6.post5"),
                          ("**image**: lmsysorg/sglang:v0.4.3.post2-cu125", "0.4.3.post2")):
        assert parse_sglang_log(text).version == version, text
    log = parse_sglang_log("`python -m sglang.launch_server --model-path m --tp 4 --mem-fraction-static=0.75 "
                           "--enable-dp-attention --dp 2`")
    assert log.setting("tp_size")[0] == "4" and log.setting("mem_fraction_static")[0] == "0.75"
    assert log.setting("dp_size")[0] == "2" and log.setting("enable_dp_attention")[0] == "True"
    assert "command line --mem-fraction-static 0.75 (line 1)" == log.setting("mem_fraction_static")[1]


def test_leak_warning_is_not_the_pool_line():
    text = "[2025-01-01 00:00:00 TP0] available_size=10, max_total_num_tokens=20\nKV cache pool leak detected!"
    assert parse_sglang_log(text).ranks == {}
