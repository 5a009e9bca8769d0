"""``kvlab simulate --compare-table``: a published bench_multiturn table beside kvlab's run of its settings; the
sglang#33984 table reproduced to 6 decimals; a generated table; the figure draws the CLI's numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvlab.experiments.published_tables import STORAGE_FLAGS, compare
from tests.shared_data import real_data

TABLES = real_data("hicache_tables_examples.jsonl")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "kvlab.cli", "simulate", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(TABLES is None, reason="../shared/real-data/hicache_tables_examples.jsonl is absent (only CI "
                                           "and the project's machines have ../shared)")
def test_sglang_33984_reproduced_to_6_decimals():
    """The documented command: kvlab simulate --compare-table ../shared/real-data/hicache_tables_examples.jsonl"""
    published = json.loads(TABLES.read_text().splitlines()[0])
    done = _cli("--compare-table", f"{TABLES}#sglang-issue-33984-ratio2", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r["simulated_cache_hit_rate"] for r in out["rounds"]] == [r["cache_hit_rate"] for r in published["rows"]]
    assert out["device_pool"].startswith("ASSUMED")  # the table gives no model: the output says what kvlab assumed
    # the table's storage backend runs, with SGLang's default prefetch policy (said so)
    assert out["storage_flags"] == {"--hicache-storage-backend": "mooncake", "--hicache-storage-prefetch-policy": "timeout"}
    assert any("SGLang's default 'timeout'" in n for n in out["notes"])
    assert any("request_length = 4096 is inferred" in n for n in out["notes"])
    text = _cli("--compare-table", str(TABLES)).stdout
    assert "ASSUMED" in text and "    8        20      0.888696       0.888696   +0.000000" in text


def _table(tmp_path, **server):
    """A generated table: the no-eviction ideal of 5 clients, request 256, output 1, page 16, and a made-up TTFT."""
    def ideal(r):
        return 0.0 if r == 0 else round((256 + (r - 1) * 257) // 16 * 16 / (256 + r * 257), 6)
    record = {"id": "generated", "table_label": "test", "url": None,
              "server": {"page_size": 16, "enable_hierarchical_cache": False, **server},
              "hardware": {"gpu": None}, "bench": {"num_clients": 5, "num_rounds": 4, "request_length": 256,
                                                   "output_length_inferred": 1, "enable_round_barrier": True,
                                                   "max_parallel": 5, "request_rate": 16, "seed": 3},
              "rows": [{"round": r, "avg_ttft_s": 0.5 + r, "cache_hit_rate": ideal(r)} for r in range(4)]}
    path = tmp_path / "tables.jsonl"
    path.write_text(json.dumps({"id": "other", "server": {}, "bench": {}, "rows": []}) + "\n" + json.dumps(record)
                    + "\n")
    return path


def test_generated_table_with_a_pool_too_small(tmp_path):
    roomy = compare(f"{_table(tmp_path)}#generated")
    assert [r["simulated_cache_hit_rate"] for r in roomy.rows] == [r["measured_cache_hit_rate"] for r in roomy.rows]
    assert any("output_length = 1 is inferred" in n for n in roomy.plan.notes)
    # a given pool (max_total_tokens) that holds only two clients' histories: eviction, so hits fall below
    small = compare(f"{_table(tmp_path, max_total_tokens=2048)}#generated")
    assert small.plan.kv_tokens == 2048 and "given" in small.plan.pool_note
    assert small.rows[-1]["simulated_cache_hit_rate"] < small.rows[-1]["measured_cache_hit_rate"]
    # finding 2 on a published table: the eviction mode is the one setting the table leaves to the user
    bug = json.loads(_cli("--compare-table", f"{_table(tmp_path, max_total_tokens=2048)}#generated", "--eviction",
                          "full", "--json").stdout)
    assert bug["eviction"] == "full" and bug["totals"]["over_evicted_tokens"] > 0


def test_pool_from_model_gpu_and_mem_fraction(tmp_path):
    from kvlab.device.budget import kv_budget
    from kvlab.device.spec import get_device_spec
    from kvlab.model import get_model_config

    path = tmp_path / "t.jsonl"
    rec = json.loads(_table(tmp_path).read_text().splitlines()[1])
    rec["server"].update(model="llama-3.1-8b", mem_fraction_static=0.8)
    rec["hardware"]["gpu"] = "h100-80g"
    path.write_text(json.dumps(rec))
    p = compare(str(path)).plan
    spec, cfg = get_device_spec("h100-80g"), get_model_config("llama-3.1-8b")
    before = spec.total_bytes - spec.non_pytorch_bytes
    expect = kv_budget(pre_model_load_bytes=before, available_bytes=before - cfg.weight_bytes_per_rank(1),
                       mem_fraction_static=0.8, cell_size_bytes=cfg.cell_size_bytes(1), context_len=cfg.context_len,
                       page_size=16).max_total_num_tokens
    assert p.kv_tokens == expect and "finding-1" in p.pool_note
    assert p.config["cost"].kv_bytes_per_token == cfg.cell_size_bytes(1)  # host copies priced for the model
    # as a table names them: the model's repository id, the GPU's product name
    rec["server"]["model"], rec["hardware"]["gpu"] = "meta-llama/Llama-3.1-8B-Instruct", "NVIDIA H100 80GB HBM3"
    path.write_text(json.dumps(rec))
    assert compare(str(path)).plan.kv_tokens == expect
    rec["server"]["max_total_tokens"] = 3000  # SGLang's cap, below the profiled pool: floored to the page
    path.write_text(json.dumps(rec))
    assert compare(str(path)).plan.kv_tokens == 2992
    rec["server"].update(model="acme/Unknown-7B", max_total_tokens=None, enable_hierarchical_cache=True,
                         hicache_size_gb=4)
    path.write_text(json.dumps(rec))
    p = compare(str(path)).plan
    assert p.pool_note.startswith("ASSUMED") and "'acme/Unknown-7B' is none of kvlab's presets" in p.pool_note
    assert p.host_tier == "--hicache-size 4 (GB)"


@pytest.mark.parametrize("content, needle", [("{not json", ":1: not JSON"), ("[1]", "expected a JSON object"),
                                             ('{"server": {"a": 1}, "bench": {"x": 1}, "rows": [{"round": "a"}]}',
                                              "rows[0]"),
                                             ('{"server": {"page_size": "64"}, "bench": {"x": 1}, "rows": [{"round": '
                                              '0, "cache_hit_rate": 0}]}', "field server.page_size must be a positive "
                                                                           "integer, got '64'"),
                                             ('{"server": {"page_size": 4}, "bench": {"num_clients": 0}, "rows": '
                                              '[{"round": 0, "cache_hit_rate": 0}]}', "num_clients must be an int")])
def test_bad_tables_exit_2(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    done = _cli("--compare-table", str(path))
    assert done.returncode == 2 and needle in done.stderr and done.stderr.startswith("kvlab: error:")
    assert len(done.stderr.splitlines()) == 1


def test_table_settings_are_the_tables_own(tmp_path):
    done = _cli("--compare-table", str(_table(tmp_path)) + "#generated", "--kv-tokens", "4096")
    assert done.returncode == 2 and "--compare-table runs the table's own settings: drop --kv-tokens" in done.stderr
    done = _cli("--compare-table", str(_table(tmp_path)) + "#nothere")
    assert done.returncode == 2 and "no table with id 'nothere'" in done.stderr and "generated" in done.stderr


def test_storage_fields_run_the_storage_tier(tmp_path):
    """A table whose device and host pools forget the histories: its storage backend adds storage hits (SGLang's
    default policy, timeout, where the table gives none; the table's policy where given); a backend kvlab has no
    preset for, or one without the host tier, is said not modelled; a policy SGLang lacks is refused."""
    host = dict(enable_hierarchical_cache=True, hicache_ratio=1, max_total_tokens=2048)
    plain = compare(f"{_table(tmp_path, **host)}#generated")
    stored = compare(f"{_table(tmp_path, **host, hicache_storage_backend='file')}#generated")
    assert plain.totals["storage_hit_tokens"] == 0 and plain.plan.storage == {}
    assert stored.totals["storage_hit_tokens"] > 0 and stored.plan.config["hicache_storage_prefetch_policy"] == "timeout"
    assert sum(r["simulated_cache_hit_rate"] for r in stored.rows) > sum(r["simulated_cache_hit_rate"] for r in plain.rows)
    best = compare(f"{_table(tmp_path, **host, hicache_storage_backend='file', hicache_storage_prefetch_policy='best_effort')}"
                   "#generated")
    assert best.plan.storage["--hicache-storage-prefetch-policy"] == "best_effort"
    assert best.plan.config["hicache_storage_prefetch_policy"] == "best_effort"
    for server in (dict(host, hicache_storage_backend="aibrix"), dict(hicache_storage_backend="file")):
        other = compare(f"{_table(tmp_path, **server)}#generated")
        assert "hicache_storage_backend" not in other.plan.config and other.totals["storage_hit_tokens"] == 0
        assert any("not modelled" in n for n in other.plan.notes)
    done = _cli("--compare-table", str(_table(tmp_path, **host, hicache_storage_backend="file",
                                               hicache_storage_prefetch_policy="never")) + "#generated")
    assert done.returncode == 2 and "server.hicache_storage_prefetch_policy" in done.stderr and "'never'" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_storage_fields_map_to_one_dict():
    assert STORAGE_FLAGS == {"hicache_storage_backend": "--hicache-storage-backend",
                             "hicache_storage_prefetch_policy": "--hicache-storage-prefetch-policy"}


def test_figure_draws_the_cli_numbers(tmp_path):
    from kvlab.viz.multiturn_plots import rounds_vs_published

    path = _table(tmp_path, max_total_tokens=2048)
    cli = json.loads(_cli("--compare-table", f"{path}#generated", "--json").stdout)
    fig = rounds_vs_published(compare(f"{path}#generated"))
    measured, simulated = fig.data
    assert list(measured.y) == [r["measured_cache_hit_rate"] for r in cli["rounds"]]
    assert list(simulated.y) == [r["simulated_cache_hit_rate"] for r in cli["rounds"]]
    assert list(simulated.x) == [r["round"] for r in cli["rounds"]]
    assert "2,048 tokens" in fig.layout.title.text and "given" in fig.layout.title.text
