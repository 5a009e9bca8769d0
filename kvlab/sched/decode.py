"""Decode rounds, one request at a time as SGLang runs them (``update_running_batch``: ``check_decode_mem`` →
``evict_from_tree_cache``, retraction when memory is still short), and the new-token ratio that the prefill budget
reserves for the running requests' future tokens.

:class:`DecodeRounds` is what the loop asks of a decode strategy; :class:`ReferenceDecode` is the reference,
:class:`~kvlab.sched.fast_decode.FastDecode` the event-driven rounds that must give the same rows, totals and tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kvlab.sched.config import RETRACT_DECODE_STEPS, SchedulerConfig
from kvlab.sched.ledger import Ledger
from kvlab.sched.prefill import Blocked
from kvlab.sched.request import SimReq

if TYPE_CHECKING:  # (the memory is SchedulerKV or the page engine's PageKV: neither is imported here)
    from kvlab.sched.kv import SchedulerKV


class NewTokenRatio:
    """SGLang's ``new_token_ratio``: starts at ``init_new_token_ratio`` (at most 1), falls by one decay step per
    decode round that needed no retraction down to ``init * min_new_token_ratio_factor``, and is reset by a
    retraction to what the remaining requests have decoded."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.init = min(config.init_new_token_ratio, 1.0)
        self.min = self.init * config.min_new_token_ratio_factor
        self.decay_step = (self.init - self.min) / config.new_token_ratio_decay_steps
        self.value = self.init

    def decayed(self, value: float) -> float:
        """The ratio one decode round without retraction after ``value``: one decay step lower, to the floor (the
        one place the decay is written; :meth:`decay` and the fast path's look-ahead both use it)."""
        value -= self.decay_step
        return value if value > self.min else self.min

    def decay(self, rounds: int = 1) -> None:
        """``rounds`` decode rounds without retraction, one decay step each (to the floor)."""
        if rounds == 1:  # (a round of the loop; the quiet runs decay many at once)
            if self.value != self.min:  # (the floor decays to itself)
                self.value = self.decayed(self.value)
            return
        value, decayed, floor = self.value, self.decayed, self.min
        for _ in range(rounds):
            if value == floor:  # (the floor decays to itself: the rounds left change nothing)
                break
            value = decayed(value)
        self.value = value

    def after_retraction(self, kept: Sequence[SimReq]) -> None:
        """``retract_decode``'s new ratio: what the kept requests decoded, plus their retract steps, over their plan."""
        decoded = sum(len(r.output_ids) for r in kept)
        planned = sum(r.max_new_tokens for r in kept)
        self.value = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(kept)) / (planned + 1))


class DecodeOutcome(NamedTuple):
    """A decode step's result: the requests still running (in order) and those retracted (back to waiting)."""

    running: list[SimReq]
    retracted: list[SimReq]


class DecodeRounds(Protocol):
    """What the loop asks of a decode strategy (chosen once per run)."""

    def admit(self, req: SimReq) -> None:
        """``req`` starts decoding (its prefill emitted its first token)."""

    def future_tokens(self, running: Sequence[SimReq]) -> int:
        """The tokens the running requests may still decode, each clipped at ``CLIP_MAX_NEW_TOKENS``."""

    def decode(self, running: list[SimReq]) -> DecodeOutcome:
        """One decode round of every running request."""

    def sync(self, running: Sequence[SimReq]) -> None:
        """Write each running request's outputs and row out (before an invariant check)."""

    def quiet_steps(self, running: Sequence[SimReq], waiting: int, until_s: float, max_steps: int,
                    blocked: Blocked | None = None) -> int:
        """After a decode step, when no prefill can be scheduled: run the decode rounds in which nothing but the
        counters moves, up to ``max_steps`` and until the clock reaches ``until_s``, one step and row each; with
        ``blocked`` (the waiting head did not fit the budget), only while its check would fail again. Returns the
        steps run."""


def decode_need(reqs: Sequence[SimReq], page_size: int) -> int:
    """``new_tokens_required_next_decode``: one token each at page 1; a page for each request whose next token
    opens one otherwise."""
    if page_size == 1:
        return len(reqs)
    return page_size * sum(1 for r in reqs if (r.seq_len - 1) % page_size == 0)


class ReferenceDecode:
    """The decode rounds one request at a time, with SGLang's names (the reference the tests compare against)."""

    def __init__(self, config: SchedulerConfig, kv: SchedulerKV, ledger: Ledger, ratio: NewTokenRatio,
                 clip: int) -> None:
        self.kv, self.ledger, self.ratio, self.clip = kv, ledger, ratio, clip
        self.page_size, self.cost = config.page_size, config.cost

    def admit(self, req: SimReq) -> None:
        pass  # the reference rounds read every request from the running list

    def future_tokens(self, running: Sequence[SimReq]) -> int:
        return sum(min(r.max_new_tokens - len(r.output_ids), self.clip) for r in running)

    def sync(self, running: Sequence[SimReq]) -> None:
        pass  # outputs and rows are always written out

    def quiet_steps(self, running: Sequence[SimReq], waiting: int, until_s: float, max_steps: int,
                    blocked: Blocked | None = None) -> int:
        return 0  # the loop runs every round

    def decode(self, running: list[SimReq]) -> DecodeOutcome:
        if not self.kv.reserve(decode_need(running, self.page_size)):  # check_decode_mem
            return self.retract_and_decode(running)
        self.ratio.decay()
        return DecodeOutcome(self.alloc_and_emit(running), [])

    def retract_and_decode(self, running: list[SimReq]) -> DecodeOutcome:
        """``retract_decode`` until the rest fits, then the round for those left."""
        kept, retracted = self.retract(running)
        return DecodeOutcome(self.alloc_and_emit(kept), retracted)

    def retract(self, running: list[SimReq]) -> tuple[list[SimReq], list[SimReq]]:
        """``retract_decode``: fewest decoded tokens first (longest prompt among ties); the last request aborts if it
        cannot run even alone. Returns the kept requests (running order) and the retracted ones."""
        kv, ps = self.kv, self.page_size
        order = sorted(running, key=lambda r: (len(r.output_ids), -r.prompt_len), reverse=True)
        retracted: list[SimReq] = []
        first = True
        while first or not kv.reserve(decode_need(order, ps)):
            first = False
            if len(order) == 1:
                break
            req = order.pop()
            kv.release_retracted(req)
            req.retractions += 1
            retracted.append(req)
            kv.evict(len(order) * RETRACT_DECODE_STEPS)
        if not kv.reserve(decode_need(order, ps)):  # the last one cannot run even alone
            aborted = order.pop()
            kv.release_aborted(aborted)
            self.ledger.note_aborted(aborted)
        kept = [r for r in running if r in order]
        self.ratio.after_retraction(order)
        self.ledger.note_retracted(len(retracted))
        return kept, retracted

    def alloc_and_emit(self, running: list[SimReq]) -> list[SimReq]:
        """Every running request gets a slot for its last token's KV and emits the next; returns those that did not
        finish."""
        if not running:
            return running
        kv, ledger = self.kv, self.ledger
        ledger.note_decode_round()
        kv.alloc_decode(running)
        still_running = []
        for req in running:
            ledger.emit(req)
            if len(req.output_ids) >= req.max_new_tokens:
                kv.finish(req)
            else:
                still_running.append(req)
        return still_running
