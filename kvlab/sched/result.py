"""What a simulation returns: the run's typed :class:`Totals`, its per-step rows and the final tree.

``SimResult.totals()`` is the JSON (docs/architecture.md#public-contracts) of ``kvlab simulate`` (the CLI prints it, experiments and widgets
read it); it is built from :class:`Totals` plus the config and the modelled clock, so every counter has one
name, checked by the type checker and by ``dataclasses.fields``, not a string key spelled at each use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvlab.mem_cache.radix_cache import RadixCache
    from kvlab.sched.scheduler import SchedulerConfig


@dataclass(slots=True)
class Totals:
    """Counters a run accumulates (tokens unless the name says pages or counts something else)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens matched in the tree at first admission
    prompt_pages: int = 0  # sum of each prompt's pages (rounded up)
    hit_pages: int = 0  # whole pages of the prompt matched at first admission
    evicted_tokens: int = 0
    over_evicted_tokens: int = 0  # evicted beyond the shortfall (the bug's extra losses)
    overshoot_tokens: int = 0  # evicted beyond the request, because leaves go whole
    prefill_tokens_computed: int = 0
    reprefill_tokens: int = 0  # of prefill_tokens_computed: computed again after a retraction (prompt + outputs so far)
    output_tokens: int = 0
    retractions: int = 0
    aborted: int = 0
    steps: int = 0
    pressure_events: int = 0  # evict_from_tree_cache calls that found the pool short

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class SimResult:
    config: SchedulerConfig
    counts: Totals
    simulated_s: float  # time on the modelled server's clock (the cost model), not wall-clock time
    rows: list[dict] = field(repr=False)
    tree: RadixCache = field(repr=False)

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
        """The JSON totals (docs/architecture.md#public-contracts) of ``kvlab simulate``, plus throughput figures (key order is the CLI's)."""
        c = self.counts
        return {
            "requests": c.requests,
            "prompt_tokens": c.prompt_tokens,
            "cached_prompt_tokens": c.cached_prompt_tokens,
            "hit_rate": round(self.hit_rate, 6),
            "hit_pages": c.hit_pages,
            "prompt_pages": c.prompt_pages,
            "evicted_tokens": c.evicted_tokens,
            "over_evicted_tokens": c.over_evicted_tokens,
            "overshoot_tokens": c.overshoot_tokens,
            "prefill_tokens_computed": c.prefill_tokens_computed,
            "reprefill_tokens": c.reprefill_tokens,
            "retractions": c.retractions,
            "aborted": c.aborted,
            "pressure_events": c.pressure_events,
            "steps": c.steps,
            "output_tokens": c.output_tokens,
            "simulated_s": round(self.simulated_s, 6),
            "output_tokens_per_s": round(c.output_tokens / self.simulated_s, 3) if self.simulated_s else 0.0,
            "eviction": self.config.eviction,
            "page_size": self.config.page_size,
            "kv_tokens": self.config.kv_tokens,
            "policy": self.config.policy,
        }
