"""The host tier for the tree widget and the exercise: :class:`HostTierDemo` (``TreeDemoPanel``'s stepper on a
two-tier cache) and :func:`write_back_leaf_eviction` (one device leaf evicted under ``write_back``)."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.experiments.host_tier_cache import MODES, POLICIES, STEP_S, evict_for, make_cache, serve
from kvlab.experiments.tree_demo import SteppedDemo, TreeDemo
from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
from kvlab.mem_cache.base_prefix_cache import EvictResult
from kvlab.mem_cache.hicache.hiradix_cache import HiEvictResult, HiRadixCache
from kvlab.mem_cache.shortfall import shortfall_tokens


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
    changed: tuple = ()  # ids of the nodes this step put in the tree or moved between the tiers (write, demote, load)
    mode: str = "shortfall"  # the eviction mode it ran in (a replay runs each step in its own)

    @property
    def cached_tokens(self) -> int:
        return self.device_hit_tokens + self.loaded_back_tokens

    def text(self) -> str:
        ev = self.evict
        if ev.requested_tokens:
            fate = ""
            if isinstance(ev, HiEvictResult):
                written = (f" ({ev.written_back_tokens:,} of them written to host first: write_back copies a leaf "
                           "before freeing its device slots)" if ev.written_back_tokens else "")
                fate = f": {ev.demoted_tokens:,} demoted to host{written}, {ev.destroyed_tokens:,} destroyed"
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

    def replay(self, write_policy: str | None = None) -> None:
        """Start over under ``write_policy`` (default: this demo's) and run the same steps again, each in the
        eviction mode it ran in: the same requests and pressure events, so two policies compare on one history."""
        if write_policy is not None and write_policy not in POLICIES:
            raise ValueError(f"HostTierDemo: write_policy must be one of {', '.join(POLICIES)}, got {write_policy!r}")
        steps, mode = list(self.history), self.mode
        self.write_policy = write_policy or self.write_policy
        self.reset()
        for step in steps:
            self.mode = step.mode
            if step.kind == "pressure":
                self.pressure_event(shortfall_tokens(step.num_tokens, step.available_before_tokens))
            else:
                self.next_request()
        self.mode = mode

    def reset(self) -> None:
        """Back to an empty two-tier cache (this demo's write policy) and the first request."""
        self.cache, self.allocator = make_cache(self.capacity_tokens, host_ratio=self.host_ratio,
                                                write_policy=self.write_policy, mode=self.mode)
        self.history: list[HostDemoStep] = []
        self._before: dict[int, str] = {}
        self._next = 0
        self._running = None

    def next_request(self) -> HostDemoStep:
        """Finish the running request, serve the next one (:func:`serve`) and keep its path locked (running)."""
        label, key = self._take_next()
        self.cache.load_back_evict_mode = self.mode
        self._before = self.residencies()
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
        if shortfall_tokens < 1:  # (checked before the residencies are noted)
            raise ValueError(f"pressure_event: shortfall_tokens must be >= 1, got {shortfall_tokens}")
        self._before = self.residencies()
        available, need, ev = self._pressure(shortfall_tokens, evict_for)
        self.cache.advance(STEP_S)
        return self._record("pressure", "pressure event", need, 0, 0, 0, available, ev)

    def residencies(self) -> dict[int, str]:
        """``{node id: residency}`` of every node but the root (``"device"``, ``"both"`` or ``"host"``)."""
        return {n.id: n.residency for n in self.cache.nodes() if n is not self.cache.root_node}

    def _record(self, kind: str, label: str, num_tokens: int, device_hit: int, host_hit: int, loaded: int,
                available: int, evict: EvictResult) -> HostDemoStep:
        self.cache.check_invariants()
        self.allocator.check_invariants()
        after = self.residencies()
        changed = tuple(i for i, r in after.items() if self._before.get(i) != r)
        step = HostDemoStep(len(self.history) + 1, kind, label, num_tokens, device_hit, host_hit, loaded, available,
                            self.allocator.available_size(), evict, changed, self.mode)
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
