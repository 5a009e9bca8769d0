"""The host tier (HiCache's L2) as experiments: what a pressure event does to a two-tier tree, and the write policies.

SGLang's hierarchical cache keeps a device radix tree (L1) whose nodes may also, or only, live in a host pool (L2);
kvlab's :class:`~kvlab.mem_cache.hiradix_cache.HiRadixCache` follows 0.5.16's rules (docs/semantics.md, "HiCache
(host tier)"). Here it runs on hand-sized scripts, no scheduler:

- :func:`pressure_event`: notebook 02's tree (six conversations behind a 1,024-token system prompt), a few of them
  asked again, on a two-tier cache; then one allocation that is short of slots, evicted in either mode. Each node
  is *demoted* (left the device, kept on host: it was backed up, or written back first under ``write_back``),
  *destroyed* (gone from both tiers: never backed up, or the write-back found the host pool full) or untouched.
- :func:`run_script`: chat turns through the same kind of cache, one write policy and one eviction mode: device
  hits, host hits, tokens loaded back and written to host, what eviction destroyed, and the seconds the copies took.
- :class:`HostTierDemo`: the tree widget's stepper (``TreeDemoPanel``) on a two-tier cache.
- :func:`write_back_leaf_eviction`: the exercise's scenario, one device leaf evicted under ``write_back``.

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

import torch

from kvlab.experiments.arguments import HelperArgumentError, check_event_tokens, check_int, check_number
from kvlab.experiments.tree_demo import SteppedDemo, TreeDemo
from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
from kvlab.mem_cache.base_prefix_cache import EvictResult
from kvlab.mem_cache.cache_controller import DEFAULT_HOST_DEVICE_BYTES_PER_S, WRITE_POLICIES
from kvlab.mem_cache.common import EVICTION_MODES
from kvlab.mem_cache.hiradix_cache import HiEvictResult, HiRadixCache
from kvlab.mem_cache.memory_pool_host import HostKVCache
from kvlab.mem_cache.shortfall import shortfall_tokens, tokens_to_evict
from kvlab.sched.config import MAX_HICACHE
from kvlab.units import GB

MODES = EVICTION_MODES  # ("shortfall", "full")
MODE_LABELS = {"shortfall": "shortfall (the fix)", "full": "full (the bug)"}
POLICIES = WRITE_POLICIES  # ("write_through", "write_through_selective", "write_back")
# Llama-3-8B in bf16: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 128 KiB of KV per token
SIZE_PER_TOKEN_BYTES = 32 * 8 * 128 * 2 * 2
STEP_S = 0.02  # modelled time of one request in the scripts: the clock moves this much after each one

# what became of a node at an eviction (the ``fate`` column of :func:`fates_frame`)
KEPT = "kept on the device"
DEMOTED = "demoted: was on host too, now host only"
WRITTEN_BACK = "written to host, then demoted"
NOT_BACKED_UP = "destroyed: never backed up"
HOST_FULL = "destroyed: host pool full, the write-back failed"
HOST_EVICTED = "host copy evicted to make room"
UNTOUCHED_HOST = "host only, untouched"
FATES = (KEPT, UNTOUCHED_HOST, DEMOTED, WRITTEN_BACK, NOT_BACKED_UP, HOST_FULL, HOST_EVICTED)
DESTROYED_FATES = (NOT_BACKED_UP, HOST_FULL, HOST_EVICTED)


# the largest hand-sized caches and scripts the helpers take (the notebook's: 4,096 slots, a host pool of 2x, 60
# requests): far beyond them, and within seconds
MAX_CAPACITY_TOKENS = 1 << 20
MAX_HOST_TOKENS = 1 << 24
MAX_SCRIPT_REQUESTS = 500
MAX_SCRIPT_TOKENS = 1 << 19  # num_requests × a quarter of capacity_tokens (the longest a conversation grows)


def make_cache(capacity_tokens: int = 4096, *, host_ratio: float = 2.0, write_policy: str = "write_through",
               mode: str = "shortfall", size_per_token: int = SIZE_PER_TOKEN_BYTES,
               bytes_per_s: float = DEFAULT_HOST_DEVICE_BYTES_PER_S) -> tuple[HiRadixCache, TokenToKVPoolAllocator]:
    """A page-1 two-tier cache: a device pool of ``capacity_tokens`` slots and a host pool sized as SGLang sizes
    it for ``--hicache-ratio host_ratio`` (``int(capacity × ratio)`` rounded up by a page). ``mode`` is also the
    load-back's eviction rule."""
    if write_policy not in POLICIES:
        raise ValueError(f"write_policy must be one of {', '.join(POLICIES)}, got {write_policy!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be 'shortfall' (the fix) or 'full' (the bug), got {mode!r}")
    check_int("make_cache", "capacity_tokens", capacity_tokens, 1, MAX_CAPACITY_TOKENS, "a hand-sized cache")
    check_number("make_cache", "host_ratio", host_ratio, MAX_HICACHE["hicache_ratio"], "SGLang's --hicache-ratio")
    if capacity_tokens * host_ratio > MAX_HOST_TOKENS:
        raise HelperArgumentError(f"make_cache(capacity_tokens={capacity_tokens}, host_ratio={host_ratio!r}): a host "
                                  f"pool of {int(capacity_tokens * host_ratio):,} tokens; at most {MAX_HOST_TOKENS:,} "
                                  "in a hand-sized cache")
    alloc = TokenToKVPoolAllocator(capacity_tokens)
    host = HostKVCache(capacity_tokens, size_per_token, 1, hicache_ratio=host_ratio)
    cache = HiRadixCache(None, alloc, host, 1, write_policy=write_policy, load_back_evict_mode=mode,
                         d2h_bytes_per_s=bytes_per_s, h2d_bytes_per_s=bytes_per_s)
    return cache, alloc


def evict_for(cache: HiRadixCache, num_tokens: int, mode: str) -> HiEvictResult | EvictResult:
    """``evict_from_tree_cache`` on a two-tier cache, keeping the tree's :class:`HiEvictResult` (demoted, written
    back, destroyed): ask for the shortfall (``"shortfall"``) or for all of ``num_tokens`` when short (``"full"``)."""
    available = cache.token_to_kv_pool_allocator.available_size()
    requested = tokens_to_evict(num_tokens, available, mode)
    if not requested:
        return EvictResult()
    shortfall = shortfall_tokens(num_tokens, available)
    res = cache.evict(requested)
    base = EvictResult.of(shortfall, requested, res.evicted_tokens)
    return HiEvictResult(**base.__dict__, demoted_tokens=res.demoted_tokens,
                         written_back_tokens=res.written_back_tokens, destroyed_tokens=res.destroyed_tokens,
                         host_evicted_tokens=res.host_evicted_tokens)


# ---- one pressure event ---------------------------------------------------------------------------------------------
SYSTEM_TOKENS = 1024
CONVERSATION_TAILS = (200, 250, 300, 400, 500, 700)  # notebook 02's six conversations
# the order they are served in: conversations 1 and 3 are asked again (a second hit: write_through_selective
# backs them up), so the least recently used order is 2, 1, 4, 3, 5, 6
SCRIPT = (1, 2, 1, 3, 4, 3, 5, 6)
EVENT_HOST_RATIO = 0.5  # a host pool of 2,049 tokens: the first three conversations fit, then it is full
EVENT_SCENARIOS = (  # (write policy, host ratio): the rows of the notebook's figure
    ("write_through", EVENT_HOST_RATIO),
    ("write_through_selective", EVENT_HOST_RATIO),
    ("write_back", EVENT_HOST_RATIO),
    ("write_back", 0.2),  # 820 host tokens: the write-back of a third conversation does not fit
)


def conversation_key(conv: int) -> list[int]:
    first = 10_000 * conv
    return list(range(1, SYSTEM_TOKENS + 1)) + [first + t for t in range(CONVERSATION_TAILS[conv - 1])]


def conversation_names() -> dict[int, tuple[str, str]]:
    """First token of a node -> (long name, icicle label), as ``shortfall_eviction.conversation_tree``'s."""
    names = {1: ("system prompt", f"system prompt: {SYSTEM_TOKENS:,}")}
    for i, tail in enumerate(CONVERSATION_TAILS, 1):
        names[10_000 * i] = (f"conversation {i} ({tail} tokens after the system prompt)", f"conv {i}: {tail}")
    return names


def serve(cache: HiRadixCache, key: Sequence[int], mode: str = "shortfall") -> ServeStep:
    """One request straight against the two-tier cache, as SGLang's scheduler serves it: ``match_prefix``; a host
    hit is loaded back (``init_load_back``: all or nothing, may evict in ``mode``); lock the device prefix, evict
    for the rest (``mode``), allocate, ``insert`` the whole key, unlock; then the transfer clock moves
    :data:`STEP_S` (copies issued so far finish, their nodes unlock). Returns what it did."""
    alloc = cache.token_to_kv_pool_allocator
    ctl = cache.cache_controller.totals
    written0, loaded0 = ctl.written_tokens, ctl.loaded_tokens
    m = cache.match_prefix(key)
    device_hit, host_hit = m.device_prefix_len, m.host_hit_length
    load_evict = EvictResult()
    if host_hit:
        lb = cache.load_back(m.last_host_node)
        load_evict = lb.evict
        m = cache.match_prefix(key)
    lock = cache.lock(m.last_device_node)
    need = len(key) - m.device_prefix_len
    ev = evict_for(cache, need, mode)
    kv = alloc.alloc(need)
    if kv is None:
        cache.unlock(lock)
        cache.advance(STEP_S)
        return ServeStep(len(key), device_hit, host_hit, ctl.loaded_tokens - loaded0, 0, ev, load_evict,
                         ctl.written_tokens - written0, rejected=True)
    cache.insert_slots(key, torch.cat([m.device_indices, kv]), prev_prefix_len=m.device_prefix_len)
    cache.unlock(lock)
    cache.advance(STEP_S)
    cache.check_invariants()
    return ServeStep(len(key), device_hit, host_hit, ctl.loaded_tokens - loaded0, need, ev, load_evict,
                     ctl.written_tokens - written0)


@dataclass(frozen=True)
class ServeStep:
    """One request of :func:`serve`. ``device_hit_tokens``: matched on the device; ``host_hit_tokens``: matched
    on host only; ``loaded_back_tokens``: of those, loaded back (0 when the load was skipped or did not fit);
    ``computed_tokens``: prefilled; ``evict`` / ``load_evict``: the allocation's and the load-back's eviction;
    ``written_tokens``: host copies issued during the request."""

    tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    loaded_back_tokens: int
    computed_tokens: int
    evict: EvictResult
    load_evict: EvictResult
    written_tokens: int
    rejected: bool = False


def event_tree(write_policy: str, *, host_ratio: float = EVENT_HOST_RATIO, capacity: int = 4096):
    """The six conversations served in :data:`SCRIPT` order on a fresh two-tier cache, every copy finished."""
    cache, alloc = make_cache(capacity, host_ratio=host_ratio, write_policy=write_policy)
    for conv in SCRIPT:
        serve(cache, conversation_key(conv))
    cache.drain()
    cache.check_invariants()
    return cache, alloc


@dataclass(frozen=True)
class HostPressureEvent:
    """One allocation under pressure on a two-tier tree, in one eviction mode and write policy. ``fates``: one row
    per node of the tree before the event (``fates_frame``: name, tokens, residency before and after, fate);
    ``frame_before`` / ``frame_after``: ``tree_frame`` tables (with ``residency``) for the icicles."""

    mode: str
    write_policy: str
    host_ratio: float
    host_tokens: int
    num_tokens: int
    available_before: int
    evict: HiEvictResult
    fates: object  # pandas.DataFrame
    frame_before: object
    frame_after: object
    written_bytes: int
    stall_s: float

    def names_with(self, fate: str) -> tuple[str, ...]:
        return tuple(self.fates.loc[self.fates["fate"] == fate, "name"])

    @property
    def destroyed(self) -> tuple[str, ...]:
        return tuple(self.fates.loc[self.fates["fate"].isin(DESTROYED_FATES), "name"])

    @property
    def demoted(self) -> tuple[str, ...]:
        return tuple(self.fates.loc[self.fates["fate"].isin((DEMOTED, WRITTEN_BACK)), "name"])


def pressure_event(mode: str, write_policy: str = "write_through", *, host_ratio: float = EVENT_HOST_RATIO,
                   num_tokens: int = 600, capacity: int = 4096) -> HostPressureEvent:
    """:func:`event_tree`, running requests holding all but ``num_tokens // 2`` free slots, then one allocation
    of ``num_tokens``: evict the shortfall or all of it (``mode``), and say what became of each node."""
    from kvlab.mem_cache.tree_view import tree_frame

    if mode not in MODES:
        raise ValueError(f"mode must be 'shortfall' (the fix) or 'full' (the bug), got {mode!r}")
    check_int("pressure_event", "capacity", capacity, 1, MAX_CAPACITY_TOKENS, "a hand-sized cache")
    cache, alloc = event_tree(write_policy, host_ratio=host_ratio, capacity=capacity)
    check_event_tokens("pressure_event", num_tokens, capacity, alloc.available_size())
    names = conversation_names()
    short = {k: label for k, (_, label) in names.items()}
    held = alloc.alloc(alloc.available_size() - num_tokens // 2)  # running requests hold the rest
    before = tree_frame(cache, names=short)
    nodes_before = {n.id: (n, n.residency) for n in cache.nodes() if n is not cache.root_node}
    available = alloc.available_size()
    ctl = cache.cache_controller.totals
    written0, stall0 = ctl.written_tokens, ctl.stall_s
    result = evict_for(cache, num_tokens, mode)
    cache.check_invariants()
    alive = {n.id: n.residency for n in cache.nodes() if n is not cache.root_node}
    rows = []
    for node_id, (node, was) in nodes_before.items():
        now = alive.get(node_id)
        name = names.get(node.key[0], (str(node.key[0]),))[0].split(" (")[0]  # "conversation 4"
        rows.append(dict(id=node_id, name=name, tokens=len(node.key),
                         before=was, after=now or "gone", fate=_fate(was, now, write_policy)))
    import pandas as pd

    order = {node_id: i for i, node_id in enumerate(before["id"])}  # the tree's pre-order, as the icicle reads
    fates = pd.DataFrame(rows).sort_values("id", key=lambda ids: ids.map(order)).reset_index(drop=True)
    after = tree_frame(cache, names=short)
    del held
    return HostPressureEvent(mode, write_policy, host_ratio, cache.token_to_kv_pool_host.size, num_tokens, available,
                             result, fates, before, after, (ctl.written_tokens - written0) * SIZE_PER_TOKEN_BYTES,
                             ctl.stall_s - stall0)


def _fate(before: str, after: str | None, write_policy: str) -> str:
    if after is None:
        if before == "host":
            return HOST_EVICTED
        return HOST_FULL if write_policy == "write_back" else NOT_BACKED_UP
    if before == "host":
        return UNTOUCHED_HOST
    if after == "host":
        return DEMOTED if before == "both" else WRITTEN_BACK
    return KEPT


def pressure_events(scenarios: Sequence[tuple[str, float]] = EVENT_SCENARIOS) -> dict:
    """``{(write_policy, host_ratio, mode): event}`` for every scenario and both modes."""
    return {(policy, ratio, mode): pressure_event(mode, policy, host_ratio=ratio)
            for policy, ratio in scenarios for mode in MODES}


def scenario_label(write_policy: str, host_ratio: float, host_tokens: int) -> str:
    return f"{write_policy}, host pool {host_tokens:,} tokens (ratio {host_ratio:g})"


def events_frame(events: dict):
    """One row per (scenario, mode): the event in numbers (tokens, and the bytes the write-backs moved)."""
    import pandas as pd

    rows = []
    for (policy, _ratio, mode), e in events.items():
        ev = e.evict
        rows.append({
            "write policy": policy, "host pool (tokens)": e.host_tokens, "eviction": MODE_LABELS[mode],
            "shortfall": ev.shortfall_tokens, "asked of the tree": ev.requested_tokens,
            "evicted from the device": ev.evicted_tokens, "demoted (kept on host)": ev.demoted_tokens,
            "… of which written to host first": ev.written_back_tokens, "destroyed": ev.destroyed_tokens,
            "host copies evicted": ev.host_evicted_tokens,
            "MB written to host": round(e.written_bytes / 1e6, 1),
            "conversations destroyed": ", ".join(e.destroyed) or "none",
        })
    return pd.DataFrame(rows)


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
    def moved_gb(self) -> float:
        """Decimal GB copied between the tiers, both directions."""
        return (self.written_to_host_tokens + self.loaded_back_tokens) * SIZE_PER_TOKEN_BYTES / GB

    def totals(self) -> dict:
        out = {k: getattr(self, k) for k in ScriptRun.__dataclass_fields__ if k != "steps"}
        return {**out, "hit_rate": self.hit_rate, "device_hit_rate": self.device_hit_rate, "moved_gb": self.moved_gb}


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
    ("GB moved between the tiers", "moved_gb", "gb"),
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


# ---- the tree widget's stepper ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostDemoStep:
    """One step of :class:`HostTierDemo` (``TreeDemoPanel`` reads ``index`` and ``text()``). ``kind``:
    ``"request"``, ``"rejected"`` or ``"pressure"``."""

    index: int
    kind: str
    label: str
    num_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    loaded_back_tokens: int
    available_before_tokens: int
    available_after_tokens: int
    evict: EvictResult

    @property
    def cached_tokens(self) -> int:
        return self.device_hit_tokens + self.loaded_back_tokens

    def text(self) -> str:
        ev = self.evict
        if ev.requested_tokens:
            fate = ""
            if isinstance(ev, HiEvictResult):
                fate = f": {ev.demoted_tokens:,} demoted to host, {ev.destroyed_tokens:,} destroyed"
            evicted = (f", evicted {ev.evicted_tokens:,} (asked {ev.requested_tokens:,} for a shortfall of "
                       f"{ev.shortfall_tokens:,}){fate}")
        else:
            evicted = ", no eviction"
        if self.kind == "pressure":
            return (f"#{self.index} pressure event: a batch needs {self.num_tokens:,} slots, "
                    f"{self.available_before_tokens:,} free{evicted}")
        verb = "rejected" if self.kind == "rejected" else "ran"
        loaded = f", {self.loaded_back_tokens:,} loaded back from host" if self.host_hit_tokens else ""
        return (f"#{self.index} {self.label} {verb}: {self.num_tokens:,} tokens, {self.device_hit_tokens:,} hit on "
                f"the device{loaded}{evicted}; {self.available_after_tokens:,} slots free")


class HostTierDemo(SteppedDemo):
    """``tree_demo.TreeDemo``'s chat turns on a two-tier cache (``write_policy``, host pool ``host_ratio`` × the
    device pool): a host hit is loaded back, evictions demote or destroy, the transfer clock moves
    :data:`STEP_S` per request. Same interface as ``TreeDemo`` (``next_request``, ``pressure_event``, ``reset``,
    ``mode``, ``history``, ``cache``, ``names``), so ``TreeDemoPanel`` steps it."""

    def __init__(self, *, capacity_tokens: int = 4096, mode: str = "shortfall", write_policy: str = "write_through",
                 host_ratio: float = 2.0, num_requests: int = 40, num_conversations: int = 8, seed: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"HostTierDemo: mode must be one of {MODES}, got {mode!r}")
        if write_policy not in POLICIES:
            raise ValueError(f"HostTierDemo: write_policy must be one of {', '.join(POLICIES)}, got {write_policy!r}")
        plain = TreeDemo(capacity_tokens=capacity_tokens, num_requests=num_requests,
                         num_conversations=num_conversations, seed=seed)  # validates the sizes, makes the turns
        self.capacity_tokens = capacity_tokens
        self.mode = mode
        self.write_policy = write_policy
        self.host_ratio = host_ratio
        self.seed = seed
        self.requests, self.names = plain.requests, plain.names
        self.reset()

    def reset(self) -> None:
        """Back to an empty two-tier cache (this demo's write policy) and the first request."""
        self.cache, self.allocator = make_cache(self.capacity_tokens, host_ratio=self.host_ratio,
                                                write_policy=self.write_policy, mode=self.mode)
        self.history: list[HostDemoStep] = []
        self._next = 0
        self._running = None

    def next_request(self) -> HostDemoStep:
        """Finish the running request, serve the next one (:func:`serve`) and keep its path locked (running)."""
        label, key = self._take_next()
        self.cache.load_back_evict_mode = self.mode
        available = self.allocator.available_size()
        step = serve(self.cache, key, self.mode)
        if not step.rejected:
            self._running = self.cache.match_prefix(key).last_device_node
            self.cache.inc_lock_ref(self._running)
        return self._record("rejected" if step.rejected else "request", label, len(key), step.device_hit_tokens,
                            step.host_hit_tokens, step.loaded_back_tokens, available, step.evict)

    def pressure_event(self, shortfall_tokens: int = 256) -> HostDemoStep:
        """A batch of other requests needs ``free + shortfall_tokens`` slots: evict in this demo's mode (backed-up
        leaves are demoted, others destroyed or, under ``write_back``, written first), allocate, release."""
        if shortfall_tokens < 1:
            raise ValueError(f"pressure_event: shortfall_tokens must be >= 1, got {shortfall_tokens}")
        available = self.allocator.available_size()
        need = available + shortfall_tokens
        ev = evict_for(self.cache, need, self.mode)
        batch = self.allocator.alloc(min(need, self.allocator.available_size()))
        if batch is not None:
            self.allocator.free(batch)
        self.cache.advance(STEP_S)
        return self._record("pressure", "pressure event", need, 0, 0, 0, available, ev)

    def _record(self, kind: str, label: str, num_tokens: int, device_hit: int, host_hit: int, loaded: int,
                available: int, evict: EvictResult) -> HostDemoStep:
        self.cache.check_invariants()
        self.allocator.check_invariants()
        step = HostDemoStep(len(self.history) + 1, kind, label, num_tokens, device_hit, host_hit, loaded, available,
                            self.allocator.available_size(), evict)
        self.history.append(step)
        return step


# ---- the exercise's scenario: one device leaf evicted under write_back ------------------------------------------------
DEMOTE = "demote"  # already backed up: the device copy is freed, the node stays on host
WRITE_THEN_DEMOTE = "write then demote"  # written to host first (the eviction waits), then as DEMOTE
DESTROY = "destroy"  # gone from both tiers
EVICTION_OUTCOMES = (DEMOTE, WRITE_THEN_DEMOTE, DESTROY)


@dataclass(frozen=True)
class LeafEviction:
    """What a real ``HiRadixCache`` under ``write_back`` did to one device leaf of ``node_tokens`` when asked to evict
    it: ``outcome`` (one of :data:`EVICTION_OUTCOMES`), host tokens written and host copies evicted to make room."""

    backed_up: bool
    node_tokens: int
    host_free_tokens: int
    host_evictable_tokens: int
    outcome: str
    written_tokens: int
    host_evicted_tokens: int


def _exact_host_pool(capacity: int, host_tokens: int, write_policy: str) -> tuple[HiRadixCache, TokenToKVPoolAllocator]:
    """A two-tier cache whose host pool is exactly ``host_tokens`` (page 1): SGLang sizes it ``int(capacity × ratio)``
    plus a page, so the ratio is chosen just under ``(host_tokens − 1) / capacity``."""
    if host_tokens < 1:
        raise ValueError(f"host pool must hold at least one token, got {host_tokens}")
    return make_cache(capacity, host_ratio=(host_tokens - 0.5) / capacity, write_policy=write_policy)


def write_back_leaf_eviction(backed_up: bool, node_tokens: int, host_free_tokens: int,
                             host_evictable_tokens: int = 0, *, capacity: int = 4096) -> LeafEviction:
    """Build a ``write_back`` cache where one unlocked device leaf of ``node_tokens`` (with a host copy already when
    ``backed_up``) is the only eviction candidate, the host pool has ``host_free_tokens`` free and
    ``host_evictable_tokens`` in a host-only leaf it may evict; evict ``node_tokens`` and report what happened."""
    for name, v in (("node_tokens", node_tokens), ("host_free_tokens", host_free_tokens),
                    ("host_evictable_tokens", host_evictable_tokens)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"write_back_leaf_eviction: {name} must be an int >= 0, got {v!r}")
    if node_tokens < 1:
        raise ValueError(f"write_back_leaf_eviction: node_tokens must be >= 1, got {node_tokens}")
    host_tokens = host_free_tokens + host_evictable_tokens + (node_tokens if backed_up else 0)
    cache, alloc = _exact_host_pool(capacity, max(host_tokens, 1), "write_back")

    def put(first: int, n: int):
        key = list(range(first, first + n))
        cache.insert(key, alloc.alloc(n))
        return cache.match_prefix(key).last_device_node

    target = put(1, node_tokens)
    if backed_up:
        cache.write_backup(target, write_back=True)
    if host_evictable_tokens:
        x = put(1_000_000, host_evictable_tokens)
        cache.write_backup(x, write_back=True)
        cache.drain()
        cache.inc_lock_ref(target)
        cache.evict(host_evictable_tokens)  # x is the only candidate: demoted, now a host-only leaf
        cache.dec_lock_ref(target)
    if host_tokens == 0:  # fill the one-token minimum pool with a locked node's copy: nothing free, nothing evictable
        pin = put(2_000_000, 1)
        cache.write_backup(pin, write_back=True)
        cache.inc_lock_ref(pin)
    cache.drain()
    cache.check_invariants()
    host = cache.token_to_kv_pool_host
    assert host.available_size() == host_free_tokens, (host.available_size(), host_free_tokens)
    written0, host_evicted0 = cache.cache_controller.totals.written_tokens, cache.host_evicted_tokens
    cache.evict(node_tokens)
    cache.check_invariants()
    node = next((n for n in cache.nodes() if n is not cache.root_node and n.key[0] == 1), None)
    if node is None:
        outcome = DESTROY
    else:
        outcome = DEMOTE if backed_up else WRITE_THEN_DEMOTE
        assert node.residency == "host", node
    return LeafEviction(backed_up, node_tokens, host_free_tokens, host_evictable_tokens, outcome,
                        cache.cache_controller.totals.written_tokens - written0,
                        cache.host_evicted_tokens - host_evicted0)
