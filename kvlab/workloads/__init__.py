"""What arrives: requests (:mod:`.request`), seeded synthetic workloads (:mod:`.generators`) and
Mooncake-format JSONL traces (:mod:`.mooncake`).

    make_workload("generated-shared-prefix", seed=0)   # SGLang bench_serving's defaults, 1024 requests
    load_trace("data/traces/mooncake_small.jsonl")     # 512-token blocks; run with --page-size 512
"""

from kvlab.workloads.generators import (
    WORKLOADS,
    few_shot,
    generated_shared_prefix,
    make_workload,
    multi_turn_chat,
    register_workload,
    workload_defaults,
)
from kvlab.workloads.mooncake import (
    MOONCAKE_BLOCK_SIZE,
    MooncakeRecord,
    TraceFormatError,
    TraceStats,
    block_tokens,
    generate_trace,
    iter_records,
    load_trace,
    read_records,
    records_to_requests,
    trace_stats,
    write_trace,
)
from kvlab.workloads.request import Request, TokenSequence, requests_to_frame

__all__ = [
    "MOONCAKE_BLOCK_SIZE", "MooncakeRecord", "Request", "TokenSequence", "TraceFormatError", "TraceStats",
    "WORKLOADS", "block_tokens", "few_shot", "generate_trace", "generated_shared_prefix", "iter_records",
    "load_trace", "make_workload", "multi_turn_chat", "read_records", "records_to_requests",
    "register_workload", "requests_to_frame", "trace_stats", "workload_defaults", "write_trace",
]
