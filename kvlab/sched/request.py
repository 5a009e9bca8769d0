"""What the scheduler reads of a request (:class:`RequestLike`) and what it tracks while serving one (:class:`SimReq`).

``kvlab.workloads.Request`` satisfies :class:`RequestLike`, and so does any object with the four fields (the tests
use a small frozen dataclass). The simulator turns each into a :class:`SimReq`, which has the fields of SGLang's
``Req`` that the tree reads (those of :class:`~kvlab.mem_cache.request_flows.SimpleReq`) plus the scheduler's own
counters. Nothing here imports torch: the page engine (:mod:`kvlab.sched.page_kv`) runs without it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol


class RequestLike(Protocol):
    """A request as it arrives. ``output_len``: tokens to generate (0 runs as 1: a prefill yields one token).

    An object may also carry ``output_token_ids`` (``kvlab.workloads.Request`` does): the tokens the request
    generates, when the workload fixes them so that a later prompt can hit them; without it (or with fewer than
    ``output_len``), the outputs are drawn from the request id (:class:`RandomOutput`)."""

    @property
    def rid(self) -> str: ...

    @property
    def arrival_time_s(self) -> float: ...

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_len(self) -> int: ...


class MatchMemo(NamedTuple):
    """A request's last walked match (``SchedulerKV.match``): the tree's ``structure_version`` after it, the length
    of the ``fill_ids`` it matched, and what it found."""

    version: int
    fill_len: int
    prefix_indices: Any  # torch.Tensor (None on the page engine, which holds no slots)
    last_node: object
    prefix_len: int
    ends: tuple | None = None  # a two-tier tree's ``match_ends(last_node)``, which a replay reads unchanged


@dataclass(slots=True, eq=False)
class HostTierState:
    """A request's HiCache state (the token-level memory with a host tier, :class:`~kvlab.sched.kv.SchedulerKV`)."""

    hit_len: int = 0  # matched on host only at the last match (loaded back at admission)
    best_match_node: object | None = None  # where that load-back ends (HiMatchResult.last_host_node)
    loaded_len: int = 0  # tokens loaded back for it since its last admission (its host hits)
    storage_len: int = 0  # of those, tokens its prefetch read from storage (L3) into host (its storage hits)
    prefetching: bool = False  # a prefetch from storage was started on its arrival and is not yet done with


@dataclass(slots=True, eq=False)
class PageState:
    """A request's page-engine state (:class:`~kvlab.sched.page_kv.PageKV`): the ids of the whole pages of prompt +
    planned outputs read so far, and the planned output tokens (the request emits placeholders: only where a page key
    needs them are the tokens read)."""

    output_tokens: Sequence[int] = ()
    keys: list | None = None


@dataclass(eq=False)
class SimReq:
    """SGLang's ``Req`` fields the tree reads (:class:`~kvlab.mem_cache.request_flows.Req`), plus what the simulator
    tracks."""

    rid: str | int
    origin_input_ids: Sequence[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    fill_ids: Sequence[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    last_node: object | None = None
    cache_protected_len: int = 0
    priority: int = 0
    arrival_time_s: float = 0.0
    prompt: Sequence[int] = ()  # the workload's tokens; copied into origin_input_ids on first admission
    max_new_tokens: int = 1
    planned_output: Sequence[int] = ()
    prefix_len: int = 0  # matched at the last admission (on the device, then with what was loaded back)
    kv_len: int = 0  # tokens of fill_ids whose KV is in the row
    extend_len: int = 0  # tokens this prefill chunk computes
    admitted: bool = False
    retractions: int = 0
    # what the benchmark's client reads of it (kvlab.sched.arrivals.RequestRecord): when its first token came out
    # (-1 before), and SGLang's meta_info.cached_tokens (its prefix reused at first admission, device + host) of which
    # storage_hit_tokens came from the storage tier (L3; 0 without one) and host_hit_tokens from host (loaded back)
    first_token_s: float = -1.0
    cached_tokens: int = 0
    storage_hit_tokens: int = 0
    host_hit_tokens: int = 0
    # fast_decode.DecodeState while the event-driven rounds run it (outputs and row not written out); None otherwise
    decode_state: object | None = None
    # either memory's last match for this request; a match with the same version and length is replayed
    match_memo: MatchMemo | None = None
    # each engine's own state, in its own typed slot (None where that engine does not run the request)
    host: HostTierState | None = None  # the host tier's (HiCache)
    page: PageState | None = None  # the page engine's

    # ``prefix_indices`` (the KV slots of the cached prefix, a tensor; the token-level memory's) is kept as the runs
    # ``cache_unfinished_req`` hands over and concatenated on first read: the loop itself reads it only after the
    # next match, which replaces it (about 21,000 concatenations of a request's whole prefix on the 12k-request
    # conversation trace, for nothing). Never set: an empty tensor.
    @property
    def prefix_indices(self):
        d = self.__dict__
        runs = d.pop("_prefix_runs", None)
        if runs is not None or "_prefix_indices" not in d:
            import torch

            d["_prefix_indices"] = torch.cat(runs) if runs else torch.empty(0, dtype=torch.int64)
        return d["_prefix_indices"]

    @prefix_indices.setter
    def prefix_indices(self, value) -> None:
        self.__dict__.pop("_prefix_runs", None)
        self.__dict__["_prefix_indices"] = value

    def defer_prefix_indices(self, runs: list) -> None:
        """``prefix_indices = torch.cat(runs)``, done when first read (``RadixCache.cache_unfinished_req``'s
        hook); ``runs`` must not change meanwhile (tree values and copies never do)."""
        self.__dict__["_prefix_runs"] = runs

    @classmethod
    def of(cls, request: RequestLike) -> SimReq:
        """The simulator's request for an arriving one (a prefill always yields the first token, so an output
        of 0 runs as 1, prefill only)."""
        return cls(rid=request.rid, origin_input_ids=[], prompt=request.prompt_token_ids,
                   arrival_time_s=float(request.arrival_time_s), max_new_tokens=max(1, request.output_len),
                   planned_output=planned_output(request))

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output_ids)


def planned_output(request: RequestLike) -> Sequence[int]:
    """The tokens ``request`` will emit: its own ``output_token_ids`` when it has enough, else drawn from its id."""
    n = max(1, request.output_len)
    tokens = getattr(request, "output_token_ids", None)  # optional (RequestLike's docstring)
    if tokens is not None and len(tokens) >= n:
        return tokens
    return RandomOutput(f"kvlab-output:{request.rid}", n)


class RandomOutput:
    """Output tokens derived from the request id, drawn only when read, and only as far as read: token ``i`` is
    drawn from the id's random byte stream at bytes ``[4i, 4i + 4)``, and a longer draw from the same seed begins
    with the shorter one's bytes, so the tokens are the same however far each read reaches."""

    def __init__(self, seed: str, n: int) -> None:
        self.seed, self.n, self._tokens = seed, n, []

    def __len__(self) -> int:
        return self.n

    def _draw(self, k: int) -> list[int]:
        """The first ``k`` tokens at least (30-bit tokens >= 1, from C-level random bytes; each new draw at least
        doubles what is drawn, so reading all ``n`` one by one draws O(n) bytes)."""
        tokens = self._tokens
        if len(tokens) < k:
            import numpy as np

            k = min(self.n, max(k, 2 * len(tokens)))
            raw = np.frombuffer(random.Random(self.seed).randbytes(4 * k), dtype=np.uint32)
            tokens = self._tokens = ((raw >> 2) | 1).tolist()
        return tokens

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self.n)
            if step < 0:
                return self._draw(self.n)[i]
            return self._draw(stop)[start:stop:step]  # (absolute bounds: fewer than n tokens may be drawn)
        i = i.__index__()
        if not -self.n <= i < self.n:
            raise IndexError(f"output token {i} out of range for {self.n} tokens")
        return self._draw(i + 1 if i >= 0 else self.n)[i]
