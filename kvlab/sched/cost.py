"""A documented step-time model, so the simulator can report time and throughput.

Serving steps are memory- or compute-bound in simple ways: a prefill step costs a fixed launch
overhead plus a time per token computed (attention over the prefix is ignored: prefix tokens
that hit the cache cost nothing, which is the point of caching); a decode step costs a fixed
overhead plus a little per running request. Defaults are the order of an 8B model on one H100
(~20k prefill tokens/s, ~12 ms per decode step at small batch). Only ratios between the two
eviction modes are meant to be read from it, not absolute latencies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    prefill_step_s: float = 0.004
    prefill_token_s: float = 1 / 20_000
    decode_step_s: float = 0.012
    decode_req_s: float = 0.00005

    def prefill_time_s(self, tokens_computed: int) -> float:
        return self.prefill_step_s + tokens_computed * self.prefill_token_s

    def decode_time_s(self, batch_size: int) -> float:
        return self.decode_step_s + batch_size * self.decode_req_s
