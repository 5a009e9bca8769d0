"""SGLang's pool arithmetic on printed readings, with the range the 2-decimal print rounding allows.

``sglang_tokens`` is ``profile_max_num_token`` as every version read computes it (GiB floats, both readings
the minimum over ranks): ``rest = after − before × (1 − f)``; ``tokens = int(rest × 2^30) // cell``; then
the ``--max-total-tokens`` cap and the page floor — the one formula of :mod:`kvlab.device.budget`
(``pool_rest_gib``, ``pool_tokens``), applied to the printed readings. A printed "21.52 GB" is any free memory in
[21.515, 21.525) GiB, so the pool the log allows is a range: the lowest takes the smallest ``after``, the
largest ``before`` and the largest cell, the highest the opposite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab.device.budget import pool_rest_gib, pool_tokens
from kvlab.units import GiB

HALF_STEP = 0.005  # half the last printed digit of "%.2f GB"


@dataclass(frozen=True)
class Pool:
    before_gib: float
    after_gib: float
    mem_fraction_static: float
    cell_size_bytes: int
    page_size: int = 1
    max_total_tokens: int | None = None

    @property
    def slack_gib(self) -> float:
        return self.before_gib * (1 - self.mem_fraction_static)

    @property
    def rest_gib(self) -> float:
        return pool_rest_gib(self.before_gib, self.after_gib, self.mem_fraction_static)

    @property
    def tokens(self) -> int:
        return sglang_tokens(self.before_gib, self.after_gib, self.mem_fraction_static, self.cell_size_bytes,
                             self.page_size, self.max_total_tokens)

    @property
    def min_viable_fraction(self) -> float:
        """SGLang's "minimum viable = 1 - available/pre"."""
        return 1 - self.after_gib / self.before_gib

    def replace(self, **changes) -> Pool:
        import dataclasses

        return dataclasses.replace(self, **changes)


def sglang_tokens(before_gib: float, after_gib: float, fraction: float, cell_size_bytes: int, page_size: int = 1,
                  max_total_tokens: int | None = None) -> int:
    """The pool size SGLang computes (kvlab.device.budget's arithmetic on the printed GiB readings); 0 where it
    would refuse to start (rest ≤ 0)."""
    if cell_size_bytes <= 0:
        raise ValueError(f"cell size must be positive, got {cell_size_bytes}")
    return pool_tokens(pool_rest_gib(before_gib, after_gib, fraction), cell_size_bytes, page_size, max_total_tokens)


def sglang_tokens_range(before_gib: float, after_gib: float, fraction: float, cell_lo: int, cell_hi: int,
                        page_size: int = 1, max_total_tokens: int | None = None,
                        half_step: float = HALF_STEP) -> tuple[int, int]:
    """[lo, hi] pool sizes consistent with readings printed to 2 decimals and a cell in [cell_lo, cell_hi]."""
    lo = sglang_tokens(before_gib + half_step, after_gib - half_step, fraction, cell_hi, page_size, max_total_tokens)
    # the upper end: the true readings lie strictly inside (x − h, x + h); take the supremum
    hi = sglang_tokens(max(before_gib - half_step, 0.0), after_gib + half_step, fraction, cell_lo, page_size,
                       max_total_tokens)
    return lo, hi


def cell_from_logged_sizes(total_gib: float, slots: int, n_rounded: int) -> tuple[int, int, int]:
    """(estimate, lo, hi) bytes per token from a printed K+V size: ``n_rounded`` numbers each ±0.005 GiB,
    over ``slots`` token slots (the pool's tokens + its page_size padding slots)."""
    if slots <= 0 or total_gib <= 0:
        raise ValueError(f"cannot derive a cell size from {total_gib} GiB over {slots} slots")
    err = n_rounded * HALF_STEP
    lo = max(1, math.ceil((total_gib - err) * GiB / slots))
    hi = math.floor((total_gib + err) * GiB / slots)
    return round(total_gib * GiB / slots), lo, max(lo, hi)
