"""What a simulation returns: the run's typed :class:`Totals`, its per-step rows and the final tree.

``SimResult.totals()`` is the JSON (docs/architecture.md#public-contracts) of ``kvlab simulate`` (the CLI prints it,
experiments, sweeps and widgets read it). Its keys are declared once, here: the :class:`Totals` fields in their
order, ``hit_rate`` beside the counter it derives from, the modelled clock and throughput (:data:`RESULT_KEYS`),
then the four config fields a run is keyed by (:data:`CONFIG_KEYS`). The host tier's six counters
(``device_hit_tokens`` ... ``transfer_s``) and the storage tier's four (``storage_hit_tokens`` ...
``written_to_storage_tokens``, 0 without it) come last among the counters; ``hit_rate`` counts device, host and
storage hits. ``kvlab sweep``'s columns are
:data:`RESULT_KEYS`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, NamedTuple

from kvlab.sched.config import SchedulerConfig

if TYPE_CHECKING:
    from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
    from kvlab.mem_cache.radix_cache import RadixCache


@dataclass(slots=True)
class Totals:
    """Counters a run accumulates (tokens unless the name says pages or counts something else), in the order of
    the JSON totals."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens matched in the tree at first admission
    hit_pages: int = 0  # whole pages of the prompt matched at first admission
    prompt_pages: int = 0  # sum of each prompt's pages (rounded up)
    evicted_tokens: int = 0
    over_evicted_tokens: int = 0  # evicted beyond the shortfall (the bug's extra losses)
    overshoot_tokens: int = 0  # evicted beyond the request, because leaves go whole
    prefill_tokens_computed: int = 0
    reprefill_tokens: int = 0  # of prefill_tokens_computed: computed again after a retraction (prompt + outputs so far)
    retractions: int = 0
    aborted: int = 0
    pressure_events: int = 0  # evict_from_tree_cache calls that found the pool short
    steps: int = 0
    output_tokens: int = 0
    # the host tier (HiCache; all 0 without it but device_hit_tokens): cached_prompt_tokens = device + host hits
    device_hit_tokens: int = 0  # prompt tokens found on the device at first admission
    host_hit_tokens: int = 0  # prompt tokens found on host only at first admission and loaded back
    loaded_back_tokens: int = 0  # every load-back host -> device (first admissions, re-admissions, later chunks)
    written_to_host_tokens: int = 0  # device -> host copies (write-through backups and write-back evictions)
    host_evicted_tokens: int = 0  # host copies freed by host eviction
    transfer_s: float = 0.0  # seconds of host<->device copies issued (both directions; overlapped, see cost.py)
    # the storage tier (L3; all 0 without it): cached_prompt_tokens = device + host + storage hits
    storage_hit_tokens: int = 0  # prompt tokens its prefetch read from storage, loaded back at first admission
    prefetched_tokens: int = 0  # tokens prefetches read from storage into host
    prefetch_aborted_tokens: int = 0  # tokens found in storage but not read (prefetch stopped early, no host room)
    written_to_storage_tokens: int = 0  # tokens backed up host -> storage (keys set when each backup lands)

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


COUNTER_KEYS = tuple(f.name for f in fields(Totals))
_AFTER_CACHED = COUNTER_KEYS.index("cached_prompt_tokens") + 1
# what a run measured: the counters, hit_rate after cached_prompt_tokens, then the modelled clock and throughput
RESULT_KEYS = (*COUNTER_KEYS[:_AFTER_CACHED], "hit_rate", *COUNTER_KEYS[_AFTER_CACHED:], "simulated_s",
               "output_tokens_per_s")
CONFIG_KEYS = ("eviction", "page_size", "kv_tokens", "policy")  # what the run was asked (SchedulerConfig fields)
TOTALS_KEYS = RESULT_KEYS + CONFIG_KEYS  # SimResult.totals(), in this order


class StepRow(NamedTuple):
    """One step's row as the ledger writes it (:meth:`as_dict` makes the row dict when the rows are read):
    the step's eviction (tokens: shortfall, requested, evicted, over-evicted, overshoot), pool sizes (``PoolSizes``) and host-tier traffic (``Transfers``)
    stay the objects they are."""

    step: int
    time_s: float
    kind: str
    hit_tokens: int
    prefill_tokens: int
    pressure_events: int
    evict: tuple
    sizes: tuple
    running: int
    waiting: int
    retracted: int
    finished: int
    cached_prompt_tokens: int
    host_hit_tokens: int
    moved: tuple
    storage_hit_tokens: int = 0

    def as_dict(self) -> dict:
        """The per-step metrics row (``SimResult.rows``)."""
        ev, sizes, moved = self.evict, self.sizes, self.moved
        return {
            "step": self.step, "time_s": self.time_s, "kind": self.kind, "hit_tokens": self.hit_tokens,
            "prefill_tokens": self.prefill_tokens, "pressure_events": self.pressure_events,
            "shortfall_tokens": ev[0], "evicted_tokens": ev[2], "over_evicted_tokens": ev[3],
            "overshoot_tokens": ev[4],
            "available_tokens": sizes[0], "evictable_tokens": sizes[1], "protected_tokens": sizes[2],
            "running": self.running, "waiting": self.waiting, "retracted": self.retracted, "finished": self.finished,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "device_hit_tokens": self.hit_tokens - self.host_hit_tokens - self.storage_hit_tokens,
            "host_hit_tokens": self.host_hit_tokens,
            "loaded_back_tokens": moved[0], "written_to_host_tokens": moved[1], "host_evicted_tokens": moved[2],
            "transfer_s": moved[3], "storage_hit_tokens": self.storage_hit_tokens,
            "prefetched_tokens": moved[4], "prefetch_aborted_tokens": moved[5], "written_to_storage_tokens": moved[6],
        }


class QuietRun(NamedTuple):
    """``steps`` quiet decode steps written as one record (``Ledger.quiet_decode_steps``): each one's row is
    ``template`` with ``step`` counted on from ``first_step`` and ``time_s`` advanced by ``dt_s`` from ``start_s``
    (the same float additions as the clock's)."""

    template: StepRow
    first_step: int
    start_s: float
    dt_s: float
    steps: int


def expand_rows(log: list) -> list[dict]:
    """The per-step rows of a step log (:class:`StepRow` and :class:`QuietRun` records), one dict per step."""
    rows: list[dict] = []
    append = rows.append
    for entry in log:
        if type(entry) is not QuietRun:
            append(entry.as_dict())
            continue
        template, step, now, dt, n = entry
        template = template.as_dict()
        for _ in range(n):
            step += 1
            now += dt
            row = template.copy()
            row["step"], row["time_s"] = step, now
            append(row)
    return rows


@dataclass
class SimResult:
    config: SchedulerConfig
    counts: Totals
    simulated_s: float  # time on the modelled server's clock (the cost model), not wall-clock time
    step_log: list = field(repr=False)  # Ledger.step_log: the rows as written (expanded on first read of rows)
    # the run's memory (kvlab.sched.kv.SchedulerKV or the page engine's PageKV), asked for its final tree when
    # ``tree`` is first read (the page engine rebuilds it at token level; ``kvlab simulate --json`` reads none)
    memory: object = field(repr=False)
    # each finished request as the benchmark's client sees it (kvlab.sched.arrivals.RequestRecord), in finish order
    records: list = field(default_factory=list, repr=False, compare=False)
    _tree: RadixCache | HiRadixCache | None = field(default=None, init=False, repr=False, compare=False)
    _rows: list[dict] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def tree(self) -> RadixCache | HiRadixCache:
        """The run's final tree (token keys, as the reference loop's)."""
        if self._tree is None:
            self._tree = self.memory.result_tree()
        return self._tree

    @property
    def rows(self) -> list[dict]:
        """The per-step rows, one dict per step (built on first read: ``kvlab simulate --json`` reads none)."""
        if self._rows is None:
            self._rows = expand_rows(self.step_log)
        return self._rows

    @property
    def hit_rate(self) -> float:
        return self.counts.cached_prompt_tokens / max(1, self.counts.prompt_tokens)

    def steps_frame(self):
        import pandas as pd

        frame = pd.DataFrame(self.rows)
        if len(frame):
            frame["hit_rate"] = frame["cached_prompt_tokens"] / max(1, self.counts.prompt_tokens)
        return frame

    def totals(self) -> dict:
        """The JSON totals (docs/architecture.md#public-contracts) of ``kvlab simulate``: :data:`TOTALS_KEYS`."""
        c = self.counts
        derived = {
            "hit_rate": round(self.hit_rate, 6),
            "simulated_s": round(self.simulated_s, 6),
            "transfer_s": round(c.transfer_s, 6),
            "output_tokens_per_s": round(c.output_tokens / self.simulated_s, 3) if self.simulated_s else 0.0,
        }
        measured = {key: derived[key] if key in derived else getattr(c, key) for key in RESULT_KEYS}
        return {**measured, **{key: getattr(self.config, key) for key in CONFIG_KEYS}}
