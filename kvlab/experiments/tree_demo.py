"""A radix cache you can step through, one request at a time, for the tree widget.

Each request is a chat turn: its prompt is its conversation's history (a shared system prompt, then
earlier turns) plus a new user message, and its output is inserted with it, as
``RadixCache.cache_finished_req`` does. The request stays *running* (its path locked, SGLang's
``inc_lock_ref``) until the next one arrives, so the tree always shows one locked path.
A *pressure event* is a batch of other requests that needs more slots than are free:
``evict_from_tree_cache`` evicts the shortfall (``mode="shortfall"``, SGLang >= 0.5.17) or all of
the need (``mode="full"``, <= 0.5.16); the batch then finishes without caching anything.

Everything is seeded: the same ``seed`` gives the same requests, the same trees and the same numbers.

    demo = TreeDemo(seed=0)
    demo.next_request(); demo.pressure_event()
    tree_frame(demo.cache, names=demo.names)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvlab.mem_cache.allocator import TokenToKVPoolAllocator
from kvlab.mem_cache.common import EVICTION_MODES, evict_from_tree_cache, match_alloc_insert
from kvlab.mem_cache.evict_policy import EvictResult
from kvlab.mem_cache.radix_cache import RadixCache, TreeNode

SYSTEM_PROMPTS = (("system A", 512), ("system B", 384))  # (name, tokens); ids 1.. and 5001..
FIRST_MESSAGE_ID = 100_000  # message tokens are numbered from here on, so every message is unique


@dataclass(frozen=True)
class DemoStep:
    """What one step did. ``kind``: ``"request"``, ``"rejected"`` (no room even after eviction) or
    ``"pressure"``. Token counts are this step's; ``available_after_tokens`` is the pool's free slots."""

    index: int
    kind: str
    label: str
    num_tokens: int  # request: its whole sequence (prompt + output); pressure: the batch's need
    cached_tokens: int  # request: prefix found in the tree; pressure: 0
    available_before_tokens: int
    available_after_tokens: int
    evict: EvictResult

    def text(self) -> str:
        ev = self.evict
        evicted = (f", evicted {ev.evicted_tokens:,} (asked {ev.requested_tokens:,} for a shortfall of "
                   f"{ev.shortfall_tokens:,})" if ev.requested_tokens else ", no eviction")
        if self.kind == "pressure":
            return (f"#{self.index} pressure event: a batch needs {self.num_tokens:,} slots, "
                    f"{self.available_before_tokens:,} free{evicted}")
        verb = "rejected" if self.kind == "rejected" else "ran"
        return (f"#{self.index} {self.label} {verb}: {self.num_tokens:,} tokens, {self.cached_tokens:,} cached"
                f"{evicted}; {self.available_after_tokens:,} slots free")


class SteppedDemo:
    """What the step-by-step demos share: a list of ``(label, key)`` requests run one at a time, the running one's
    path kept locked until the next starts."""

    requests: list
    allocator: TokenToKVPoolAllocator
    mode: str
    _next: int
    _running: TreeNode | None

    @property
    def done(self) -> bool:
        return self._next >= len(self.requests)

    @property
    def requests_run(self) -> int:
        return self._next

    def _finish_running(self) -> None:
        if self._running is not None:
            self.cache.dec_lock_ref(self._running)
            self._running = None

    def _pressure(self, shortfall_tokens: int, evict) -> tuple[int, int, EvictResult]:
        """A pressure event's mechanism: a batch needs ``free + shortfall_tokens`` slots, ``evict(cache, need, mode)``
        makes room in the demo's mode, the batch allocates what fits and releases it (it caches nothing). Returns
        the slots free before, the slots needed, and the eviction's result."""
        if shortfall_tokens < 1:
            raise ValueError(f"pressure_event: shortfall_tokens must be >= 1, got {shortfall_tokens}")
        available = self.allocator.available_size()
        need = available + shortfall_tokens
        ev = evict(self.cache, need, self.mode)
        batch = self.allocator.alloc(min(need, self.allocator.available_size()))
        if batch is not None:
            self.allocator.free(batch)
        return available, need, ev

    def _take_next(self) -> tuple[str, list[int]]:
        """Unlock the running request and hand out the next ``(label, key)``."""
        if self.done:
            raise IndexError(f"{type(self).__name__}: all {len(self.requests)} requests have run; call reset()")
        label, key = self.requests[self._next]
        self._next += 1
        self._finish_running()
        return label, key


class TreeDemo(SteppedDemo):
    """A small ``RadixCache`` over a ``TokenToKVPoolAllocator`` of ``capacity_tokens`` slots, and a
    seeded list of ``num_requests`` chat turns over ``num_conversations`` conversations."""

    def __init__(self, *, capacity_tokens: int = 4096, mode: str = "shortfall", policy: str = "lru",
                 num_requests: int = 40, num_conversations: int = 8, seed: int = 0) -> None:
        if mode not in EVICTION_MODES:
            raise ValueError(f"TreeDemo: mode must be one of {EVICTION_MODES}, got {mode!r}")
        longest_system = max(t for _, t in SYSTEM_PROMPTS)
        if capacity_tokens < 4 * longest_system:
            raise ValueError(f"TreeDemo: capacity_tokens={capacity_tokens} is too small; "
                             f"give at least {4 * longest_system} (4 × the longest system prompt)")
        if num_requests < 1 or num_conversations < 1:
            raise ValueError(f"TreeDemo: num_requests ({num_requests}) and num_conversations "
                             f"({num_conversations}) must be >= 1")
        self.capacity_tokens = capacity_tokens
        self.mode = mode
        self.policy = policy
        self.seed = seed
        self.requests, self.names = _make_requests(num_requests, num_conversations, capacity_tokens, seed)
        self.reset()

    def reset(self) -> None:
        """Back to an empty tree and the first request (same seed: the same run again)."""
        self.allocator = TokenToKVPoolAllocator(self.capacity_tokens)
        self.cache = RadixCache(None, self.allocator, page_size=1, eviction_policy=self.policy)
        self.history: list[DemoStep] = []
        self._next = 0
        self._running: TreeNode | None = None

    def next_request(self) -> DemoStep:
        """Finish the running request, then run the next one: match its prefix, lock it, allocate the
        rest (evicting under pressure), insert the whole sequence and keep it locked (running)."""
        label, key = self._take_next()
        cache = self.cache
        available = self.allocator.available_size()
        res = match_alloc_insert(cache, key, mode=self.mode)  # the match is locked while it evicts
        if res.out_cache_loc is None:
            return self._record("rejected", label, len(key), res.prefix_len, available, res.evict)
        leaf = cache.match_prefix(key).last_device_node
        cache.inc_lock_ref(leaf)
        self._running = leaf
        return self._record("request", label, len(key), res.prefix_len, available, res.evict)

    def pressure_event(self, shortfall_tokens: int = 256) -> DemoStep:
        """A batch of other requests needs ``free + shortfall_tokens`` slots now; evict in this demo's
        mode, allocate, and release the batch's slots when it finishes (it caches nothing)."""
        available, need, ev = self._pressure(shortfall_tokens, evict_from_tree_cache)
        return self._record("pressure", "pressure event", need, 0, available, ev)

    def _record(self, kind: str, label: str, num_tokens: int, cached: int, available: int,
                evict: EvictResult) -> DemoStep:
        self.cache.check_invariants()
        self.allocator.check_invariants()
        step = DemoStep(len(self.history) + 1, kind, label, num_tokens, cached, available,
                        self.allocator.available_size(), evict)
        self.history.append(step)
        return step

    def history_frame(self):
        import pandas as pd

        return pd.DataFrame([dict(index=s.index, kind=s.kind, label=s.label, num_tokens=s.num_tokens,
                                  cached_tokens=s.cached_tokens, evicted_tokens=s.evict.evicted_tokens,
                                  over_evicted_tokens=s.evict.over_evicted_tokens,
                                  available_after_tokens=s.available_after_tokens) for s in self.history])


def _make_requests(num_requests: int, num_conversations: int, capacity_tokens: int,
                   seed: int) -> tuple[list[tuple[str, list[int]]], dict[int, str]]:
    """Chat turns: each conversation keeps its history (system prompt, then user/assistant messages);
    a turn's key is history + a new user message + the answer. A conversation whose next turn would
    no longer fit a quarter of the pool starts over, under a new number."""
    rng = random.Random(seed)
    names: dict[int, str] = {}
    systems = []
    for i, (name, tokens) in enumerate(SYSTEM_PROMPTS):
        first = 1 + 5000 * i
        systems.append(list(range(first, first + tokens)))
        names[first] = f"{name}: {tokens}"
    next_id = FIRST_MESSAGE_ID
    histories = [list(systems[c % len(systems)]) for c in range(num_conversations)]
    turns = [0] * num_conversations
    numbers = list(range(1, num_conversations + 1))  # a conversation that starts over gets a new number
    next_number = num_conversations + 1
    requests = []
    for _ in range(num_requests):
        c = rng.randrange(num_conversations)
        user, answer = rng.randint(40, 160), rng.randint(30, 120)
        if len(histories[c]) + user + answer > capacity_tokens // 4:
            histories[c], turns[c] = list(systems[c % len(systems)]), 0
            numbers[c], next_number = next_number, next_number + 1
        turns[c] += 1
        label = f"conv {numbers[c]} · turn {turns[c]}"
        names[next_id] = label
        message = list(range(next_id, next_id + user + answer))
        next_id += user + answer
        histories[c] = histories[c] + message
        requests.append((label, list(histories[c])))
    return requests, names
