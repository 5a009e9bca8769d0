"""How much the fuzz suites run, in one place, and a count of what they really ran.

The hypothesis profile (``KVLAB_FUZZ``, loaded in tests/conftest.py) picks a column of ``EXAMPLES``:
each fuzz suite asks :func:`fuzz_settings` for its settings instead of hard-coding ``max_examples``.
An example is one random operation sequence (a state-machine run of up to ``STEPS`` rules) or one
random workload (the scheduler suites). Each suite calls :func:`record` once per example it starts,
and tests/conftest.py prints the measured counts at the end of the run.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from hypothesis import settings

ENV = "KVLAB_FUZZ"
PROFILES = ("ci", "long", "dev")  # ci is the default; long for release checks; dev for a quick look

# Examples per suite and profile (tests/conftest.py has the measured times). Hypothesis runs a few more
# than configured (replays from its example database, and examples cut short count too).
EXAMPLES: dict[str, dict[str, int]] = {
    # tests/device/test_caching_allocator_properties.py: malloc / free / empty_cache on the allocator model
    "allocator": {"ci": 400, "long": 2000, "dev": 20},
    # tests/mem_cache/test_stateful.py: allocator + RadixCache request lifecycles, page 1 and page 4
    "radix_page1": {"ci": 450, "long": 2000, "dev": 20},
    "radix_page4": {"ci": 450, "long": 2000, "dev": 20},
    # tests/mem_cache/test_hybrid_stateful.py
    "swa_radix": {"ci": 300, "long": 1500, "dev": 20},
    "mamba_radix": {"ci": 300, "long": 1500, "dev": 20},
    # tests/mem_cache/test_hicache_stateful.py: allocator + host pool + HiRadixCache, page 1 and page 4
    "hicache_page1": {"ci": 150, "long": 1000, "dev": 15},
    "hicache_page4": {"ci": 150, "long": 1000, "dev": 15},
    # tests/mem_cache/test_base_prefix_cache.py: match_alloc_insert vs a longest-common-prefix oracle
    "match_alloc_insert": {"ci": 150, "long": 800, "dev": 10},
    # tests/sched/test_scheduler.py, tests/sched/test_fast_decode.py: one random workload per example
    "scheduler": {"ci": 150, "long": 700, "dev": 10},
    "fast_decode": {"ci": 150, "long": 700, "dev": 10},
    # tests/mem_cache/test_page_tree.py: PageKeys on random segmented sequences; PageRadixTree against the paged
    # RadixCache on one random operation sequence per example
    "page_keys": {"ci": 300, "long": 1500, "dev": 20},
    "page_tree": {"ci": 200, "long": 1000, "dev": 15},
    # tests/sched/test_page_engine.py: RandomOutput against a full draw; debug runs of random small workloads
    "random_output": {"ci": 200, "long": 1000, "dev": 20},
    "page_engine_debug": {"ci": 150, "long": 700, "dev": 10},
    # tests/sched/test_closed_loop.py: one random bench_multiturn run per example (both decode strategies)
    "closed_loop": {"ci": 100, "long": 500, "dev": 10},
    # tests/sched/test_page_hicache.py: random small workloads with a host tier, page engine against the token level
    "page_hicache_twin": {"ci": 100, "long": 500, "dev": 10},
    # tests/sched/test_page_storage.py: random multi-turn workloads with host and storage tiers, page engine against
    # the token level
    "page_storage_twin": {"ci": 100, "long": 500, "dev": 10},
    # tests/serving/test_log_roundtrip.py: one rendered start-up log per example, parsed back and explained
    "log_roundtrip": {"ci": 200, "long": 1000, "dev": 20},
    # tests/device/test_replay_corpus.py: one generated snapshot pickle per example, through `kvlab replay --json`
    # with four what-ifs (not hypothesis: seeds 0..n-1 of kvlab.device.replay.gen.random_case)
    "replay_corpus": {"ci": 300, "long": 3000, "dev": 20},
    # tests/test_cli_fuzz.py: one mutated snapshot, trace, log, config or sweep file through the real CLI per example
    "cli_fuzz": {"ci": 2000, "long": 20000, "dev": 100},
}
# Rules per state-machine run (the upper bound; hypothesis draws the length). Same in every profile, so
# the long profile explores more sequences of the same depth.
STEPS: dict[str, int] = {"allocator": 60, "radix_page1": 40, "radix_page4": 40, "swa_radix": 40, "mamba_radix": 40,
                         "hicache_page1": 40, "hicache_page4": 40}

ran: Counter[str] = Counter()  # examples started per suite, in this process


def profile() -> str:
    """The fuzz profile named by ``KVLAB_FUZZ`` (default ``ci``)."""
    name = os.environ.get(ENV, "") or "ci"
    if name not in PROFILES:
        raise ValueError(f"{ENV}={name!r}: expected one of {', '.join(PROFILES)}")
    return name


def examples(suite: str) -> int:
    """Examples ``suite`` runs under the current profile."""
    return EXAMPLES[suite][profile()]


def fuzz_settings(suite: str, **extra: Any) -> settings:
    """Settings for one fuzz suite: the profile's (tests/conftest.py) with the suite's example count and,
    for a state machine, its step count. ``extra`` adds suite-specific settings (health checks)."""
    if "max_examples" in extra or "stateful_step_count" in extra:
        raise TypeError(f"fuzz suite {suite!r}: counts come from tests/fuzz.py, not from the caller")
    if suite in STEPS:
        extra["stateful_step_count"] = STEPS[suite]
    return settings(max_examples=examples(suite), **extra)


def record(suite: str) -> None:
    """Count one example of ``suite`` (call it where each example starts)."""
    ran[suite] += 1
