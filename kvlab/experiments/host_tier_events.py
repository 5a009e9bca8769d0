"""One pressure event on a two-tier tree (notebook 07): notebook 02's six conversations, a few asked again, then
one allocation short of slots, evicted in either mode; what became of each node (:func:`pressure_event`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.experiments.arguments import check_event_tokens, check_int
from kvlab.experiments.host_tier_cache import (
    MAX_CAPACITY_TOKENS,
    MODE_LABELS,
    MODES,
    SIZE_PER_TOKEN_BYTES,
    evict_for,
    make_cache,
    serve,
)
from kvlab.mem_cache.hicache.hiradix_cache import HiEvictResult
from kvlab.units import MiB

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
    names = {1: ("system prompt", f"system prompt<br>{SYSTEM_TOKENS:,}")}  # two lines: the icicle's column is narrow
    for i, tail in enumerate(CONVERSATION_TAILS, 1):
        names[10_000 * i] = (f"conversation {i} ({tail} tokens after the system prompt)", f"conv {i}: {tail}")
    return names


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
            "MiB written to host": round(e.written_bytes / MiB, 1),
            "conversations destroyed": ", ".join(e.destroyed) or "none",
        })
    return pd.DataFrame(rows)


def events_table(events: dict):
    """:func:`events_frame` turned on its side for reading: one row per quantity, one column per (scenario, mode),
    per scenario the bug's column, then the fix's, each column's label naming its write policy, host pool and mode
    in one flat string, so a header cell stands over
    exactly its own column (a MultiIndex header spans cells and, rendered, put names over other columns)."""
    from kvlab.experiments.shortfall_eviction import SHOWN

    scenarios = list(dict.fromkeys(k[:2] for k in events))
    ordered = sorted(events, key=lambda k: (scenarios.index(k[:2]), SHOWN.index(k[2])))  # per scenario: bug, fix
    frame = events_frame({k: events[k] for k in ordered})
    labels = [f"{p} · host {h:,} · {m}" for p, h, m in
              zip(frame["write policy"], frame["host pool (tokens)"], frame["eviction"])]
    return frame.drop(columns=["write policy", "host pool (tokens)", "eviction"]).set_axis(labels).T
