"""How much one workload may ask of the simulator: one bound for Mooncake traces and generated workloads alike.

A trace is checked once its records are read, before any request is built; a generator checks its parameters
before it draws a token (:func:`check_size` on the sizes its parameters imply, upper bounds when lengths are
drawn at random). Anything beyond a bound is refused with :class:`WorkloadTooLarge`, naming the parameters (or
the trace), the value they make and the limit: a run that could not finish, or whose requests would not fit in
memory, is never started.

The limits sit far beyond any workload kvlab's scenarios use (Mooncake's conversation trace, the largest: 12,031
requests, 145 M prompt tokens, 4.1 M output tokens) and within what one core simulates in minutes:

- :data:`MAX_LENGTH` tokens in one prompt or one output (a trace record's own bound, the longest context any model
  offers);
- :data:`MAX_REQUESTS` requests (about 200 µs and 4 KB each in the simulator);
- :data:`MAX_PROMPT_TOKENS` prompt tokens in all (each prefilled or matched in the prefix cache);
- :data:`MAX_OUTPUT_TOKENS` output tokens in all (each one request's row in one decode step);
- :data:`MAX_HELD_TOKENS` token ids and prompt pieces a generated workload holds in memory (sampled tokens are
  Python ints, about 36 bytes each; a trace's blocks are ``range`` objects and hold none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvlab.errors import KvlabError

MAX_LENGTH = 10 ** 7
MAX_REQUESTS = 1 << 18  # 262,144
MAX_PROMPT_TOKENS = 1_073_741_824  # 2^30 tokens
MAX_OUTPUT_TOKENS = 1 << 25  # 33,554,432
MAX_HELD_TOKENS = 1 << 24  # 16,777,216: about 600 MB of Python ints


class WorkloadTooLarge(KvlabError, ValueError):
    """A workload beyond one of this module's bounds; the message names what made it, the value and the limit."""


class Amount(NamedTuple):
    """One size of a workload and how it came about, e.g. ``Amount(1_000_000, "num_groups × prompts_per_group =
    1,000 × 1,000")``; ``how`` is empty when the value speaks for itself."""

    value: int
    how: str = ""


class WorkloadSize(NamedTuple):
    """What a workload asks of the simulator (see the module docstring for each bound)."""

    requests: Amount
    longest_prompt: Amount
    longest_output: Amount
    prompt_tokens: Amount
    output_tokens: Amount
    held_tokens: Amount = Amount(0)


_LIMITS = (  # (field, limit, its name here, what the value counts)
    ("requests", MAX_REQUESTS, "MAX_REQUESTS", "requests"),
    ("longest_prompt", MAX_LENGTH, "MAX_LENGTH", "tokens in one prompt"),
    ("longest_output", MAX_LENGTH, "MAX_LENGTH", "tokens in one output"),
    ("prompt_tokens", MAX_PROMPT_TOKENS, "MAX_PROMPT_TOKENS", "prompt tokens in all"),
    ("output_tokens", MAX_OUTPUT_TOKENS, "MAX_OUTPUT_TOKENS", "output tokens in all"),
    ("held_tokens", MAX_HELD_TOKENS, "MAX_HELD_TOKENS", "token ids and prompt pieces held in memory"),
)


def check_size(size: WorkloadSize, where: str = "") -> None:
    """Raise :class:`WorkloadTooLarge` for the first of ``size``'s amounts beyond its bound, naming how it came
    about (``where``: the trace or workload, put first)."""
    for name, limit, constant, what in _LIMITS:
        value, how = getattr(size, name)
        if value > limit:
            shown = f"{how} = {value:,}" if how else f"{value:,}"
            raise WorkloadTooLarge(f"{where + ': ' if where else ''}{shown} {what}, more than the {limit:,} a "
                                   f"simulation takes (kvlab.workloads.bounds.{constant})")


def product(*terms: tuple[str, int]) -> Amount:
    """``Amount(a × b × ...)`` showing each term's name and value: ``product(("num_groups", 1000), ("x", 3))``."""
    value = 1
    for _, v in terms:
        value *= v
    names = " × ".join(name for name, _ in terms)
    return Amount(value, names if len(terms) == 1 else f"{names} = {' × '.join(f'{v:,}' for _, v in terms)}")


def total(*terms: tuple[str, int]) -> Amount:
    """``Amount(a + b + ...)`` showing each term's name and value: ``total(("num_groups × system_prompt_len",
    2048000), ...)``."""
    value = sum(v for _, v in terms)
    return Amount(value, f"{' + '.join(name for name, _ in terms)} = {' + '.join(f'{v:,}' for _, v in terms)}")


def lengths_size(prompt_lens: Sequence[int], output_lens: Sequence[int], what: str = "requests") -> WorkloadSize:
    """The size of requests with these prompt and output lengths (a trace's columns: ``what="records"``)."""
    n = len(prompt_lens)
    return WorkloadSize(requests=Amount(n, f"its {what}" if what != "requests" else ""),
                        longest_prompt=Amount(max(prompt_lens, default=0), "its longest prompt"),
                        longest_output=Amount(max(output_lens, default=0), "its longest output"),
                        prompt_tokens=Amount(sum(prompt_lens), f"the prompts of its {n:,} {what}"),
                        output_tokens=Amount(sum(output_lens), f"the outputs of its {n:,} {what}"))
