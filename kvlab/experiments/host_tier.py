"""The host tier (HiCache's L2) as experiments: what a pressure event does to a two-tier tree, and the write policies.

SGLang's hierarchical cache keeps a device radix tree (L1) whose nodes may also, or only, live in a host pool (L2);
kvlab's :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` follows 0.5.16's rules (docs/semantics.md, "HiCache
(host tier)"). Here it runs on hand-sized scripts, no scheduler:

- :func:`pressure_event`: notebook 02's tree (six conversations behind a 1,024-token system prompt), a few of them
  asked again, on a two-tier cache; then one allocation that is short of slots, evicted in either mode. Each node
  is *demoted* (left the device, kept on host: it was backed up, or written back first under ``write_back``),
  *destroyed* (gone from both tiers: never backed up, or the write-back found the host pool full) or untouched.
- :func:`run_script`: chat turns through the same kind of cache, one write policy and one eviction mode: device
  hits, host hits, tokens loaded back and written to host, what eviction destroyed, and the seconds the copies took.
- :class:`HostTierDemo`: the tree widget's stepper (``TreeDemoPanel``) on a two-tier cache.
- :func:`write_back_leaf_eviction`: the exercise's scenario, one device leaf evicted under ``write_back``.

This module holds the scripts (:func:`run_script`, :func:`policy_runs`) and re-exports the rest: the cache and
:func:`serve` are :mod:`kvlab.experiments.host_tier_cache`'s, the pressure event
:mod:`kvlab.experiments.host_tier_events`'s, the stepper and the exercise :mod:`kvlab.experiments.host_tier_demo`'s.

The scheduler with a host tier on the shipped trace (hit rate against host size, finding 2's regime map) is
:mod:`kvlab.experiments.host_tier_sweep`.

Over-eviction (finding 2, SGLang ≤ 0.5.16's ``full`` mode) means something else here: a backed-up node evicted
early is demoted, not lost, so it costs a load-back (and, under ``write_back``, a write) instead of a recompute —
unless the host pool is full too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvlab.experiments.arguments import HelperArgumentError, check_int
from kvlab.experiments.host_tier_cache import MAX_CAPACITY_TOKENS as MAX_CAPACITY_TOKENS  # re-exported
from kvlab.experiments.host_tier_cache import MAX_HOST_TOKENS as MAX_HOST_TOKENS  # re-exported
from kvlab.experiments.host_tier_cache import MAX_SCRIPT_REQUESTS as MAX_SCRIPT_REQUESTS  # re-exported
from kvlab.experiments.host_tier_cache import MAX_SCRIPT_TOKENS as MAX_SCRIPT_TOKENS  # re-exported
from kvlab.experiments.host_tier_cache import MODE_LABELS as MODE_LABELS  # re-exported
from kvlab.experiments.host_tier_cache import MODES as MODES  # re-exported
from kvlab.experiments.host_tier_cache import POLICIES as POLICIES  # re-exported
from kvlab.experiments.host_tier_cache import SIZE_PER_TOKEN_BYTES as SIZE_PER_TOKEN_BYTES  # re-exported
from kvlab.experiments.host_tier_cache import STEP_S as STEP_S  # re-exported
from kvlab.experiments.host_tier_cache import ServeStep as ServeStep  # re-exported
from kvlab.experiments.host_tier_cache import evict_for as evict_for  # re-exported
from kvlab.experiments.host_tier_cache import host_link_text as host_link_text  # re-exported
from kvlab.experiments.host_tier_cache import make_cache as make_cache  # re-exported
from kvlab.experiments.host_tier_cache import serve as serve  # re-exported
from kvlab.experiments.host_tier_demo import DEMOTE as DEMOTE  # re-exported
from kvlab.experiments.host_tier_demo import DESTROY as DESTROY  # re-exported
from kvlab.experiments.host_tier_demo import EVICTION_OUTCOMES as EVICTION_OUTCOMES  # re-exported
from kvlab.experiments.host_tier_demo import WRITE_THEN_DEMOTE as WRITE_THEN_DEMOTE  # re-exported
from kvlab.experiments.host_tier_demo import HostDemoStep as HostDemoStep  # re-exported
from kvlab.experiments.host_tier_demo import HostTierDemo as HostTierDemo  # re-exported
from kvlab.experiments.host_tier_demo import LeafEviction as LeafEviction  # re-exported
from kvlab.experiments.host_tier_demo import write_back_leaf_eviction as write_back_leaf_eviction  # re-exported
from kvlab.experiments.host_tier_events import CONVERSATION_TAILS as CONVERSATION_TAILS  # re-exported
from kvlab.experiments.host_tier_events import DEMOTED as DEMOTED  # re-exported
from kvlab.experiments.host_tier_events import DESTROYED_FATES as DESTROYED_FATES  # re-exported
from kvlab.experiments.host_tier_events import EVENT_HOST_RATIO as EVENT_HOST_RATIO  # re-exported
from kvlab.experiments.host_tier_events import EVENT_SCENARIOS as EVENT_SCENARIOS  # re-exported
from kvlab.experiments.host_tier_events import FATES as FATES  # re-exported
from kvlab.experiments.host_tier_events import HOST_EVICTED as HOST_EVICTED  # re-exported
from kvlab.experiments.host_tier_events import HOST_FULL as HOST_FULL  # re-exported
from kvlab.experiments.host_tier_events import KEPT as KEPT  # re-exported
from kvlab.experiments.host_tier_events import NOT_BACKED_UP as NOT_BACKED_UP  # re-exported
from kvlab.experiments.host_tier_events import SCRIPT as SCRIPT  # re-exported
from kvlab.experiments.host_tier_events import SYSTEM_TOKENS as SYSTEM_TOKENS  # re-exported
from kvlab.experiments.host_tier_events import UNTOUCHED_HOST as UNTOUCHED_HOST  # re-exported
from kvlab.experiments.host_tier_events import WRITTEN_BACK as WRITTEN_BACK  # re-exported
from kvlab.experiments.host_tier_events import HostPressureEvent as HostPressureEvent  # re-exported
from kvlab.experiments.host_tier_events import conversation_key as conversation_key  # re-exported
from kvlab.experiments.host_tier_events import conversation_names as conversation_names  # re-exported
from kvlab.experiments.host_tier_events import event_tree as event_tree  # re-exported
from kvlab.experiments.host_tier_events import events_frame as events_frame  # re-exported
from kvlab.experiments.host_tier_events import events_table as events_table  # re-exported
from kvlab.experiments.host_tier_events import pressure_event as pressure_event  # re-exported
from kvlab.experiments.host_tier_events import pressure_events as pressure_events  # re-exported
from kvlab.experiments.host_tier_events import scenario_label as scenario_label  # re-exported
from kvlab.experiments.tree_demo import TreeDemo
from kvlab.units import GiB

# ---- write policies side by side ------------------------------------------------------------------------------------
SCRIPT_DEFAULTS = dict(capacity_tokens=4096, host_ratio=2.0, num_requests=60, num_conversations=10, seed=0)


@dataclass(frozen=True)
class ScriptRun:
    """:func:`run_script`'s totals (tokens unless named otherwise)."""

    write_policy: str
    mode: str
    host_tokens: int
    requests: int
    prompt_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    loaded_back_tokens: int
    computed_tokens: int
    written_to_host_tokens: int
    host_evicted_tokens: int
    evicted_tokens: int
    over_evicted_tokens: int
    demoted_tokens: int
    destroyed_tokens: int
    transfer_s: float
    stall_s: float
    steps: tuple = field(default=(), repr=False)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from either tier (device hits + loaded back) over all prompt tokens."""
        return (self.device_hit_tokens + self.loaded_back_tokens) / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def device_hit_rate(self) -> float:
        return self.device_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def moved_gib(self) -> float:
        """GiB copied between the tiers, both directions."""
        return (self.written_to_host_tokens + self.loaded_back_tokens) * SIZE_PER_TOKEN_BYTES / GiB

    def totals(self) -> dict:
        out = {k: getattr(self, k) for k in ScriptRun.__dataclass_fields__ if k != "steps"}
        return {**out, "hit_rate": self.hit_rate, "device_hit_rate": self.device_hit_rate, "moved_gib": self.moved_gib}


def script_requests(*, capacity_tokens: int = 4096, num_requests: int = 60, num_conversations: int = 10,
                    seed: int = 0) -> list[list[int]]:
    """Seeded chat turns (``tree_demo.TreeDemo``'s: two system prompts, conversations growing turn by turn)."""

    demo = TreeDemo(capacity_tokens=capacity_tokens, num_requests=num_requests,
                    num_conversations=num_conversations, seed=seed)
    return [key for _, key in demo.requests]


def run_script(write_policy: str, mode: str = "shortfall", *, capacity_tokens: int = 4096, host_ratio: float = 2.0,
               num_requests: int = 60, num_conversations: int = 10, seed: int = 0,
               requests: Sequence[Sequence[int]] | None = None) -> ScriptRun:
    """Seeded chat turns through a fresh two-tier cache (:func:`serve` each), one write policy, one eviction mode."""
    if requests is None:
        _check_script("run_script", capacity_tokens, num_requests, num_conversations)
        requests = script_requests(capacity_tokens=capacity_tokens, num_requests=num_requests,
                                   num_conversations=num_conversations, seed=seed)
    cache, _alloc = make_cache(capacity_tokens, host_ratio=host_ratio, write_policy=write_policy, mode=mode)
    steps = tuple(serve(cache, key, mode) for key in requests)
    cache.drain()
    cache.check_invariants()
    t = cache.cache_controller.totals
    evs = [s.evict for s in steps] + [s.load_evict for s in steps]
    return ScriptRun(
        write_policy, mode, cache.token_to_kv_pool_host.size, len(steps), sum(s.tokens for s in steps),
        sum(s.device_hit_tokens for s in steps), sum(s.host_hit_tokens for s in steps),
        sum(s.loaded_back_tokens for s in steps), sum(s.computed_tokens for s in steps), t.written_tokens,
        cache.host_evicted_tokens, sum(e.evicted_tokens for e in evs), sum(e.over_evicted_tokens for e in evs),
        sum(getattr(e, "demoted_tokens", 0) for e in evs), sum(getattr(e, "destroyed_tokens", 0) for e in evs),
        t.write_s + t.load_s, t.stall_s, steps)


def _check_script(helper: str, capacity_tokens: Any, num_requests: Any, num_conversations: Any) -> None:
    """The seeded script's sizes: counts within :data:`MAX_SCRIPT_REQUESTS`, and its prompts (each up to a quarter
    of the pool) within :data:`MAX_SCRIPT_TOKENS`, so a script runs in seconds."""
    check_int(helper, "capacity_tokens", capacity_tokens, 1, MAX_CAPACITY_TOKENS, "a hand-sized cache")
    for name, value in (("num_requests", num_requests), ("num_conversations", num_conversations)):
        check_int(helper, name, value, 1, MAX_SCRIPT_REQUESTS, "a script that runs in seconds")
    if num_requests * (capacity_tokens // 4) > MAX_SCRIPT_TOKENS:
        raise HelperArgumentError(
            f"{helper}(num_requests={num_requests}, capacity_tokens={capacity_tokens}): prompts of up to "
            f"num_requests × capacity_tokens / 4 = {num_requests * (capacity_tokens // 4):,} tokens; at most "
            f"{MAX_SCRIPT_TOKENS:,}, a script that runs in seconds")


POLICY_ROWS = (  # (label, ScriptRun attribute or totals key, format)
    ("prompt tokens", "prompt_tokens", "int"),
    ("hit on the device", "device_hit_tokens", "int"),
    ("hit on host only", "host_hit_tokens", "int"),
    ("… loaded back", "loaded_back_tokens", "int"),
    ("prefilled (computed)", "computed_tokens", "int"),
    ("hit rate (device + loaded back)", "hit_rate", "pct"),
    ("written to host", "written_to_host_tokens", "int"),
    ("host copies evicted", "host_evicted_tokens", "int"),
    ("evicted from the device", "evicted_tokens", "int"),
    ("… demoted (kept on host)", "demoted_tokens", "int"),
    ("… destroyed", "destroyed_tokens", "int"),
    ("GiB moved between the tiers", "moved_gib", "gb"),
    ("transfer seconds", "transfer_s", "ms"),
)


def policy_runs(*, modes: Sequence[str] = MODES, **options) -> dict:
    """``{(write_policy, mode): ScriptRun}`` on the same requests."""
    opts = {**SCRIPT_DEFAULTS, **options}
    requests = script_requests(capacity_tokens=opts["capacity_tokens"], num_requests=opts["num_requests"],
                               num_conversations=opts["num_conversations"], seed=opts["seed"])
    return {(policy, mode): run_script(policy, mode, capacity_tokens=opts["capacity_tokens"],
                                       host_ratio=opts["host_ratio"], requests=requests)
            for mode in modes for policy in POLICIES}


def policy_frame(runs: dict, mode: str = "shortfall"):
    """The write policies side by side (columns) in one mode, rows in words (:data:`POLICY_ROWS`)."""
    import pandas as pd

    fmt = {"int": lambda v: f"{int(v):,}", "pct": lambda v: f"{v:.2%}", "gb": lambda v: f"{v:.3f}",
           "ms": lambda v: f"{v * 1000:.2f} ms"}
    cols = {}
    for policy in POLICIES:
        totals = runs[(policy, mode)].totals()
        cols[policy] = [fmt[kind](totals[key]) for _, key, kind in POLICY_ROWS]
    return pd.DataFrame(cols, index=[label for label, _, _ in POLICY_ROWS])


def policy_numbers(runs: dict):
    """Tidy numbers of :func:`policy_runs` (one row per policy and mode) for the figure and the tests."""
    import pandas as pd

    return pd.DataFrame([{"write_policy": p, "mode": m, **r.totals()} for (p, m), r in runs.items()])
