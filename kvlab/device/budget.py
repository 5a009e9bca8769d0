"""Pure KV-budget arithmetic: a memory reading + a model's cell size + fractions -> KVBudget.

Mirrors SGLang 0.5.23:
- ``mem_cache/kv_cache_configurator.py::_profile_available_bytes`` (in GiB floats, as upstream):
  ``rest = available − pre_model_load × (1 − mem_fraction_static)``; ``rest ≤ 0`` raises;
- ``model_executor/pool_configurator.py::calculate_pool_sizes``: tokens = rest_bytes // cell_size,
  floored to the page;
- ``managers/tp_worker.py``: ``max_req_len = min(context_len − 1, max_total_num_tokens − 1)``,
  ``max_req_input_len = max_req_len − 5``;
- ``managers/utils.py::validate_input_length``: refuse when ``len(input_ids) >= max_req_input_len``.

kvlab differs on purpose in one way: every intermediate term is a field, so the budget plots as a
waterfall and each term can be unit-tested. Multimodal reservations and Mamba state carving are
left out (text models only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab.units import GiB


class NoKVMemoryError(ValueError):
    """SGLang's "Loaded weights leave no GPU memory for the KV cache" error."""


def check_fraction(mem_fraction_static: float) -> None:
    """Raise ``ValueError`` naming the value unless ``mem_fraction_static`` is a number in (0, 1)."""
    if not isinstance(mem_fraction_static, (int, float)) or not 0 < mem_fraction_static < 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static!r}")


@dataclass(frozen=True)
class KVBudget:
    pre_model_load_bytes: int  # free memory before weights were loaded
    available_bytes: int  # free memory read after loading (the impure reading)
    mem_fraction_static: float
    slack_bytes: int  # pre_model_load × (1 − f): kept for activations, CUDA graphs, ...
    rest_bytes: int  # available − slack: the KV pool's bytes
    cell_size_bytes: int  # KV bytes per token on one rank
    page_size: int
    context_len: int
    max_total_num_tokens: int

    @property
    def max_req_len(self) -> int:
        return min(self.context_len - 1, self.max_total_num_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - 5

    @property
    def kv_pool_bytes(self) -> int:
        return self.max_total_num_tokens * self.cell_size_bytes

    def validate_input_length(self, prompt_tokens: int) -> str | None:
        """SGLang's refusal text for a prompt of ``prompt_tokens`` tokens, or None when accepted."""
        if not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
            raise ValueError(f"prompt length must be a positive number of tokens, got {prompt_tokens!r}")
        if prompt_tokens >= self.max_req_input_len:
            return (
                f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
                f"({self.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        return None

    def terms(self) -> list[tuple[str, int]]:
        """The budget as signed terms, for a waterfall: pre-load free, − resident after load, − slack."""
        return [
            ("free before load", self.pre_model_load_bytes),
            ("resident after load", self.available_bytes - self.pre_model_load_bytes),
            ("slack (1 − f)", -self.slack_bytes),
            ("KV pool (rest)", self.rest_bytes),
        ]


def pool_rest_gib(pre_model_load_gib: float, available_gib: float, mem_fraction_static: float) -> float:
    """SGLang's ``rest = available − pre_model_load × (1 − mem_fraction_static)``, in GiB floats as upstream
    computes it (kvlab.serving applies it to a log's printed readings)."""
    return available_gib - pre_model_load_gib * (1 - mem_fraction_static)


def pool_tokens(rest_gib: float, cell_size_bytes: int, page_size: int = 1, max_total_tokens: int | None = None) -> int:
    """The pool's tokens for ``rest_gib``: ``int(rest × 2^30) // cell``, capped at ``--max-total-tokens``, floored to
    the page; 0 where the rest is not positive (SGLang refuses to start)."""
    if rest_gib <= 0:
        return 0
    tokens = int(rest_gib * GiB) // cell_size_bytes
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return tokens // page_size * page_size


def kv_budget(
    *,
    pre_model_load_bytes: int,
    available_bytes: int,
    mem_fraction_static: float,
    cell_size_bytes: int,
    context_len: int,
    page_size: int = 1,
    max_total_tokens: int | None = None,
) -> KVBudget:
    """Compute the KV budget from two readings. Raises :class:`NoKVMemoryError` like SGLang."""
    check_fraction(mem_fraction_static)
    for name, value, minimum in (
        ("pre_model_load_bytes", pre_model_load_bytes, 1),
        ("available_bytes", available_bytes, 0),
        ("cell_size_bytes", cell_size_bytes, 1),
        ("context_len", context_len, 1),
        ("page_size", page_size, 1),
    ):
        if not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    pre_gb = pre_model_load_bytes / GiB
    available_gb = available_bytes / GiB
    slack_gb = pre_gb * (1 - mem_fraction_static)
    rest_gb = pool_rest_gib(pre_gb, available_gb, mem_fraction_static)
    if rest_gb <= 0:
        minimum = 1 - available_gb / pre_gb
        suggested = math.ceil(minimum * 1000) / 1000
        raise NoKVMemoryError(
            f"Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={mem_fraction_static}. Raise --mem-fraction-static above "
            f"{suggested:.3f} (minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative "
            f"decoding, draft weights are now counted."
        )
    rest_bytes = int(rest_gb * GiB)
    tokens = pool_tokens(rest_gb, cell_size_bytes, page_size, max_total_tokens)
    if tokens <= 0:
        raise NoKVMemoryError("Not enough memory. Please try to increase --mem-fraction-static.")
    return KVBudget(
        pre_model_load_bytes=pre_model_load_bytes,
        available_bytes=available_bytes,
        mem_fraction_static=mem_fraction_static,
        slack_bytes=int(slack_gb * GiB),
        rest_bytes=rest_bytes,
        cell_size_bytes=cell_size_bytes,
        page_size=page_size,
        context_len=context_len,
        max_total_num_tokens=tokens,
    )
