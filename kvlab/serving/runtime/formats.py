"""The per-step lines SGLang and vLLM print while they serve, as each version prints them (docs/semantics.md,
"Runtime logs", lists every format with the version and upstream file it comes from).

A message is found by its anchor anywhere on a line (docker-compose, tqdm and shell prefixes in front); what
follows the anchor is read as ``name: value`` items separated by ``", "``, so an optional field present in one
version and absent in another needs no pattern of its own. A field kvlab does not know is counted by name
(``RuntimeLog.unknown_fields``), never dropped silently.
"""

from __future__ import annotations

import re

# SGLang. "Prefill batch. " (0.1.x to 0.5.0), "Prefill batch, " (0.5.x on), "Prefill batch [123], " with
# SGLANG_LOG_FORWARD_ITERS, "Prefill batch(mixed #running-req: 3). " (0.2/0.3 with mixed chunked prefill)
PREFILL = re.compile(r"Prefill batch(?:\s*\[\d+\])?(?:\s*\(mixed #running-req: (?P<mixed>\d+)\))?[.,] (?P<rest>.*)")
DECODE = re.compile(r"Decode batch(?:\s*\[\d+\])?[.,] (?P<rest>.*)")
# "decode out of memory happened, " (0.2.x), "Decode out of memory happened. " (0.3.0 to 0.4.x),
# "KV cache pool is full. Retract requests. " (0.4.7 on)
RETRACT = re.compile(r"(?:KV cache pool is full\. Retract requests\.|[Dd]ecode out of memory happened[.,]) (?P<rest>.*)")
# vLLM V0 (engine/metrics.py LoggingStatLogger) and V1 (v1/metrics/loggers.py LoggingStatLogger)
VLLM_STATS = re.compile(r"(?:Engine (?P<engine>\d+): )?(?P<rest>Avg prompt throughput: .*)")
VLLM_HIT_V0 = re.compile(r"Prefix cache hit rate: GPU: (?P<gpu>\d+(?:\.\d+)?)%, CPU: (?P<cpu>\d+(?:\.\d+)?)%")
VLLM_PREEMPT = re.compile(r"Sequence group (?P<req>\S+) is preempted by PreemptionMode\.(?P<mode>\w+) mode because "
                          r"there is not enough KV cache space\.(?:.*?total_(?:num_)?cumulative_preemption(?:_cnt)?="
                          r"(?P<total>\d+))?")
ANCHORS = {"Prefill batch": "prefill", "Decode batch": "decode", "Retract requests": "retract",
           "Decode out of memory happened": "retract", "decode out of memory happened": "retract",
           "Avg prompt throughput": "vllm",
           "Prefix cache hit rate: GPU": "vllm_hit", "is preempted by PreemptionMode": "preempt"}
ANCHOR = re.compile("|".join(map(re.escape, ANCHORS)))
PATTERNS = {"prefill": PREFILL, "decode": DECODE, "retract": RETRACT, "vllm": VLLM_STATS}

# item name as printed -> kvlab's column; the same column from several versions' names
FIELDS = {
    "#new-seq": "new_seq", "#new-token": "new_token", "#cached-token": "cached_token",
    "token usage": "usage", "full token usage": "usage", "#running-req": "running", "#queue-req": "queue",
    "#token": "used_tokens", "#full token": "used_tokens", "gen throughput (token/s)": "gen_tput",
    "input throughput (token/s)": "prefill_tput", "cache hit rate": "logged_hit_rate",
    "#retracted_reqs": "retracted", "#new_token_ratio": "ratio", "#new_tokens_gained": "tokens_gained",
    # vLLM
    "Avg prompt throughput": "prefill_tput", "Avg generation throughput": "gen_tput", "Running": "running",
    "Waiting": "queue", "Pending": "queue", "GPU KV cache usage": "usage", "Prefix cache hit rate": "logged_hit_rate",
    "Preemptions": "preemptions",  # V1, printed only when > 0: preemptions since the last stats line
}
# read and kept out of the timeline on purpose (named in docs/semantics.md), not "unknown"
KNOWN_EXTRA = {"cuda graph", "npu graph", "cpu graph", "musa graph", "#pending-token", "swa token usage",
               "#swa token", "mamba usage", "mamba num", "accept len", "accept rate", "largest-len",
               "#unbootstrapped-req", "#transferring-req", "#bootstrap-req", "#inflight-req", "#prealloc-req",
               "#transfer-req", "#retracted-req", "pre-allocated usage", "#mamba_num_gained", "Swapped",
               "CPU KV cache usage", "#replay-token", "#optimistic-req", "cap len", "block accept len",
               "#gpu token", "gpu token usage", "#cpu token", "cpu token usage", "#host-receive-req",
               "waiting-image-req", "Deferred", "Corrupted", "External prefix cache hit rate", "MM cache hit rate"}
REQUIRED = {"prefill": ("new_seq", "new_token", "cached_token"), "decode": ("running",),
            "retract": ("retracted",), "vllm": ("running", "usage")}
PERCENT = {"logged_hit_rate", "usage"}  # printed in % by vLLM and SGLang's "cache hit rate"

_UNIT = re.compile(r"^(\d{1,15}(?:\.\d{1,15})?)\s*(?:%|tokens/s|reqs)?\.?$")  # no 400-digit "number"
_RATIO = re.compile(r"^(\d{1,15}(?:\.\d{1,15})?) -> (\d{1,15}(?:\.\d{1,15})?)$")


_ITEM = re.compile(r"(?:^|, )([^,:]+): ([^,]*)")


def split_items(rest: str) -> tuple[list[tuple[str, str]], bool]:
    """``"#new-seq: 1, #new-token: 2, "`` -> ([("#new-seq", "1"), ...], cut); cut: the last item has no value
    (a line cut short by a terminal or a paste)."""
    rest = rest.rstrip().rstrip(",")
    return _ITEM.findall(rest), ": " not in rest.rpartition(", ")[2]


def number(column: str, text: str) -> float | tuple[float, float] | None:
    """A printed value as a number (``95.9%`` -> 0.959 for a percentage column; ``a -> b`` -> (a, b)); None when
    it is not one (a garbled or cut value)."""
    if len(text) < 20 and text.replace(".", "", 1).isdigit():  # plain digits (no nan, inf, 1e30, 1_000, 10^400)
        return float(text)
    if column == "ratio":
        m = _RATIO.match(text)
        return (float(m.group(1)), float(m.group(2))) if m else None
    m = _UNIT.match(text)
    if not m:
        return None
    value = float(m.group(1))
    if column in PERCENT and text.endswith("%"):
        value = round(value / 100.0, 12)  # 98.4% -> 0.984, not 0.9840000000000001
    return value


# a timestamp before the message: "2024-11-29 10:28:25", "05-19 10:13:11" (vLLM, no year), "10:28:25" alone
STAMP = re.compile(r"(?:(?P<y>\d{4})-)?(?:(?P<mo>\d{2})-(?P<d>\d{2})[ T])?(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
                   r"(?:[.,](?P<frac>\d{1,6}))?")
RANK_TAG = re.compile(r"\[([^\[\]]*)\][\s:]*$")
RANK_PART = re.compile(r"\b(DP|PP|TP|EP)(\d+)\b|gpu_id=(\d+)|gpu=(\d+)")
