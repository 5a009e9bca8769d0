"""The four runtime findings (issue 36) on generated SGLang look-alike logs: each fires on the pattern it names,
with the lines it rests on, and stays quiet where the pattern is absent."""

from __future__ import annotations

import pytest

from kvlab.serving.runtime.findings import FULL, LOW, SMALL
from kvlab.serving.runtime.report import runtime_json, runtime_timeline


def prefill(i, new, cached, usage, running=4, queue=0, rank="TP0"):
    return (f"[2026-01-01 00:{i // 60:02d}:{i % 60:02d} {rank}] Prefill batch, #new-seq: 1, #new-token: {new}, "
            f"#cached-token: {cached}, token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queue}, ")


def decode(i, usage, running=4, queue=0, rank="TP0"):
    return (f"[2026-01-01 00:{i // 60:02d}:{i % 60:02d} {rank}] Decode batch, #running-req: {running}, "
            f"#token: {int(usage * 1000)}, token usage: {usage:.2f}, cuda graph: True, gen throughput (token/s): "
            f"100.00, #queue-req: {queue}")


def findings(lines) -> dict:
    data = runtime_json(runtime_timeline(text="\n".join(lines) + "\n"))
    return {f["name"]: f for f in data["findings"]}


def test_hit_rate_fell_while_full():
    lines = [prefill(i, 100, 900, 0.30) for i in range(6)]
    lines += [decode(6, FULL + 0.02)]
    lines += [prefill(7 + i, 900, 100, FULL + 0.02) for i in range(6)]
    f = findings(lines)["hit_rate_fell_when_full"]
    assert f["hit_rate_full"] == pytest.approx(0.1) and f["hit_rate_rest"] == pytest.approx(0.9)
    assert f["lines"] == [8, 9, 10, 11, 12, 13]
    assert "cannot_know" in f


def test_hit_rate_steady_when_full_is_no_finding():
    lines = [prefill(i, 100, 900, 0.30) for i in range(6)] + [decode(6, 0.99)]
    lines += [prefill(7 + i, 100, 900, 0.99) for i in range(6)]
    assert "hit_rate_fell_when_full" not in findings(lines)


def test_queue_grew_at_low_usage():
    lines = [decode(i, LOW - 0.3, running=8, queue=i + 1) for i in range(5)]
    f = findings(lines)["queue_grew_at_low_usage"]
    assert f["lines"] == [1, 2, 3, 4, 5] and "from 1 to 5" in f["text"]


def test_queue_growing_at_high_usage_is_no_queue_finding():
    lines = [decode(i, 0.9, queue=i + 1) for i in range(5)]
    assert "queue_grew_at_low_usage" not in findings(lines)


def test_pool_larger_than_load():
    lines = [decode(i, 0.05 + 0.01 * (i % 3)) for i in range(12)]
    f = findings(lines + ["max_total_num_tokens=100000"])["pool_larger_than_load"]
    assert f["lines"] == [3] and "7,000 of 100,000 tokens" in f["text"]
    assert "pool_larger_than_load" not in findings([decode(i, SMALL) for i in range(12)])


def test_retraction_finding_names_ratio_and_lines():
    lines = [decode(0, 0.99), "[2026-01-01 00:00:01 TP0] KV cache pool is full. Retract requests. "
             "#retracted_reqs: 3, #new_tokens_gained: 900, #new_token_ratio: 0.4000 -> 0.7000", decode(2, 0.8)]
    f = findings(lines)["pool_full_retracted"]
    assert f["count"] == 3 and f["lines"] == [2] and "0.4000 -> 0.7000" in f["text"]
