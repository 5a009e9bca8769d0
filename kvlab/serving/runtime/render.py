"""A kvlab simulation's per-step rows printed as SGLang 0.5.23 prints its runtime lines: the example runtime log
notebook 05 opens with, and a log whose truth is known (the replay's tests).

The rows are ``SimResult.rows`` (kvlab/sched/ledger.py); nothing here imports the scheduler. What SGLang prints
and the rows do not hold is said in the log's first line: ``#new-seq`` is each prefill step's rise in running
requests plus those that finished or were retracted in that step (at least 1), and throughput is over the
modelled clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

START = datetime(2026, 1, 1, 12, 0, 0)
DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default (server_args.py)


def _stamp(t: float) -> str:
    return (START + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S")


def render_sglang_runtime(rows: list[dict], pool_tokens: int, *, label: str, tag: str = "TP0") -> list[str]:
    """The log lines of a run: a header, ``max_total_num_tokens=``, then Prefill / Decode / retraction lines."""
    lines = [f"# kvlab-rendered: {label}; SGLang 0.5.23's runtime line formats; #new-seq estimated from the "
             f"running count; throughput over kvlab's modelled clock",
             f"[{_stamp(0)} {tag}] max_total_num_tokens={pool_tokens}, chunked_prefill_size=8192, "
             f"max_prefill_tokens=16384, max_running_requests=256, context_len=32768"]
    running = decodes = out_tokens = 0
    last_decode_t = last_prefill_t = 0.0
    for row in rows:
        t, used = row["time_s"], row["protected_tokens"]
        usage = f"token usage: {used / pool_tokens:.2f}"
        if row["retracted"]:
            lines.append(f"[{_stamp(t)} {tag}] KV cache pool is full. Retract requests. #retracted_reqs: "
                         f"{row['retracted']}, #new_tokens_gained: 0, #new_token_ratio: 0.7000 -> 1.0000")
        if row["kind"] == "prefill":
            new_seq = max(1, row["running"] - running + row["finished"] + row["retracted"])
            gap = max(t - last_prefill_t, 1e-9)
            lines.append(f"[{_stamp(t)} {tag}] Prefill batch, #new-seq: {new_seq}, #new-token: "
                         f"{row['prefill_tokens']}, #cached-token: {row['hit_tokens']}, {usage}, #running-req: "
                         f"{running}, #queue-req: {row['waiting']}, #pending-token: 0, cuda graph: False, input "
                         f"throughput (token/s): {row['prefill_tokens'] / gap:.2f}")
            last_prefill_t = t
        else:
            decodes += 1
            out_tokens += row["running"]
            if decodes % DECODE_LOG_INTERVAL == 0:
                gap = max(t - last_decode_t, 1e-9)
                lines.append(f"[{_stamp(t)} {tag}] Decode batch, #running-req: {row['running']}, #token: {used}, "
                             f"{usage}, cuda graph: True, gen throughput (token/s): {out_tokens / gap:.2f}, "
                             f"#queue-req: {row['waiting']}")
                last_decode_t, out_tokens = t, 0
        running = row["running"]
    return lines
