"""The scheduler's memory, written down: what the loop and its components ask of the pools and the tree, and the
errors that mean the asking went wrong.

Two memories satisfy :class:`SchedulerMemory`:

- :class:`kvlab.sched.kv.SchedulerKV`: the token-level pools and radix cache (slot ids and rows; page size 1, the
  reference loop, HiCache's two-tier tree);
- :class:`kvlab.sched.page_kv.PageKV`: the page engine (page counts and page ids only; the fast path at page size
  > 1, with or without a host tier).

``tests/test_layering.py`` holds both to this contract by signature. The HiCache-only call (``load_back``) is not
part of it: only a request with host hits, which only a memory with a host tier makes, reaches it (both have it).

The errors: a request that does not fit at all is refused before a run starts (``Scheduler.__init__``, the user's
input). Past that, admission and retraction make every allocation fit, so one that fails is kvlab's fault: a
:class:`SchedulerBug` (``KvlabBug``: the CLI exits 3 and saves the traceback, never a user error). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvlab.errors import KvlabBug

if TYPE_CHECKING:
    import numpy as np  # noqa: F401 - the annotations name it

    from kvlab.sched.ledger import PoolSizes
    from kvlab.sched.request import SimReq


class SchedulerBug(KvlabBug, RuntimeError):
    """The scheduler's bookkeeping went wrong (a kvlab bug). A ``RuntimeError`` still, for code that caught one."""


class RowsExhaustedError(SchedulerBug):
    """More requests were admitted than ``max_running`` leaves request rows for."""


class AllocationError(SchedulerBug):
    """An allocation that admission (prefill) or the decode check (``reserve``, retraction) had made room for
    found the pool short."""


class SchedulerStuckError(SchedulerBug):
    """Nothing runs, nothing can be admitted and no copy is in flight, yet requests wait."""


@runtime_checkable
class SchedulerMemory(Protocol):
    """Pools and tree of one run as the scheduler's components see them (sizes in tokens)."""

    page_size: int
    kv_tokens: int
    eviction: str  # finding 2's mode, applied to every eviction (kvlab.mem_cache.shortfall.tokens_to_evict)

    # sizes
    def available(self) -> int:
        """Free tokens in the pool."""

    def evictable(self) -> int:
        """Tokens the tree could evict (unlocked)."""

    def sizes(self) -> PoolSizes:
        """Free, evictable and locked tokens, for the step's row."""

    def state(self) -> tuple:
        """What a waiting request's admission check reads, as one comparable value."""

    # eviction
    def evict(self, tokens: int) -> None:
        """Make room for ``tokens`` by finding 2's rule in the run's mode, noted in the ledger."""

    def reserve(self, tokens: int) -> bool:
        """Evict for ``tokens``; does the pool now hold them?"""

    # prefill
    def match(self, req: SimReq) -> None:
        """The request's cached prefix (``Req.init_next_round_input``)."""

    def replayable(self, req: SimReq) -> bool:
        """Would matching ``req`` again now be a replay of its last match?"""

    def replay_matches_of(self, req: SimReq, times: int) -> None:
        """The side effects of ``times`` more matches of ``req`` while replayable."""

    def lock(self, req: SimReq) -> None:
        """Lock the request's matched prefix."""

    def unlock(self, req: SimReq) -> None:
        """Unlock it."""

    def alloc_extend(self, batch: Sequence[SimReq]) -> None:
        """A row per new request and slots for every ``extend_len``; :class:`AllocationError` if short."""

    def cache_chunk(self, req: SimReq) -> None:
        """A chunked request's computed part goes into the tree."""

    def cache_unfinished(self, req: SimReq) -> None:
        """A request's prompt goes into the tree after its prefill."""

    # decode
    def alloc_decode(self, running: Sequence[SimReq]) -> None:
        """One slot per running request for its last emitted token."""

    def take_decode_pages(self, batch_size: int, num_pages: int) -> list[int]:
        """The page ids of a paged decode round."""

    def last_slot(self, req: SimReq) -> int:
        """The slot of the request's last token with KV."""

    def write_decoded(self, req: SimReq, written_len: int, last_slot: int, opened_pages: list, end: int) -> int:
        """Write the event-driven rounds' slots into the request's row; the slot at ``end - 1``."""

    # leaving
    def finish(self, req: SimReq) -> None:
        """Cache prompt + outputs into the tree and free the row."""

    def release_retracted(self, req: SimReq) -> None:
        """Give a retracted request's slots back without caching them."""

    def release_aborted(self, req: SimReq) -> None:
        """Give an aborted request's slots back."""

    def result_tree(self):
        """The run's final tree, at token level."""

    def check_invariants(self, holders: Sequence[SimReq]) -> None:
        """Pools and tree consistent; ``holders``: the running and chunked requests."""


__all__ = ["AllocationError", "RowsExhaustedError", "SchedulerBug", "SchedulerMemory", "SchedulerStuckError"]
