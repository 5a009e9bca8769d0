"""Synthetic Mooncake-format traces shaped like Mooncake's public conversation trace (:func:`generate_trace`);
write them with ``kvlab.workloads.mooncake.write_trace``."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvlab.workloads.mooncake_records import MOONCAKE_BLOCK_SIZE, MooncakeRecord, check_block_size

if TYPE_CHECKING:
    import numpy as np

# ---------------------------------------------------------------------------------------------------------
# generating


# generate_trace keywords that give the shape of Mooncake's public conversation trace (12,031 requests over 59
# minutes, prompts mean/median/p90/max 12,035/6,909/27,367/126,195 tokens, 182,790 distinct of 288,500 blocks):
# ``generate_trace(12_031, **CONVERSATION_TRACE_SHAPE)``; ``benchmarks/make_mooncake_trace.py --preset
# conversation`` prints how close it comes.
CONVERSATION_TRACE_SHAPE = dict(mean_input_len=12_035, num_roots=2000, root_median_len=1200, turn_continue_prob=0.27,
                                message_sigma=1.45, max_message_len=118_000, mean_output_len=343, output_sigma=0.45,
                                max_output_len=2000, request_rate=3.4)


def _lognormal_len(rng: random.Random, median: float, sigma: float, hi: int) -> int:
    return min(hi, max(1, round(median * rng.lognormvariate(0.0, sigma))))


def generate_trace(num_requests: int, *, seed: int = 0, mean_input_len: int = 12000, system_prompt_len: int = 512,
                   num_roots: int = 300, root_zipf_alpha: float = 1.0, root_median_len: int = 2000,
                   turn_continue_prob: float = 0.4, mean_think_time_s: float = 90.0,
                   followup_median_len: int = 300, mean_output_len: int = 350, max_output_len: int = 2048,
                   max_message_len: int = 32768, request_rate: float = 3.34, message_sigma: float = 1.0,
                   output_sigma: float = 0.8, block_size: int = MOONCAKE_BLOCK_SIZE) -> list[MooncakeRecord]:
    """A synthetic trace shaped like Mooncake's conversation trace (12,031 requests over one hour, ~12k-token
    prompts that share prefixes); write it with :func:`write_trace`.

    Model (every draw from ``random.Random("kvlab:mooncake-trace:<seed>")``):

    - every prompt starts with one ``system_prompt_len``-token system prompt (the published trace's block 0);
    - conversations start as a Poisson process of ``request_rate * (1 - turn_continue_prob)`` per second, so
      requests arrive at about ``request_rate``/s (the published 12,031 per hour is 3.34/s). Each picks one of
      ``num_roots`` root prefixes (documents, tool or persona prompts; lengths log-normal with median
      ``root_median_len``) with Zipf(``root_zipf_alpha``) popularity, then adds a first user message;
    - after each turn the conversation continues with probability ``turn_continue_prob``, after an exponential
      think time of mean ``mean_think_time_s``: the next prompt is the previous prompt + its output + a
      follow-up message (log-normal, median ``followup_median_len``);
    - output lengths are log-normal (``output_sigma``) with mean ``mean_output_len``, clipped to
      ``[1, max_output_len]``;
    - first messages are log-normal (``message_sigma``) and scaled (bisection on the scale) so the mean prompt is
      ``mean_input_len`` tokens (to about a token); messages are clipped to ``max_message_len``.

    Hash ids are assigned as Mooncake's are: chained over each block's content and its predecessor, numbered
    0, 1, 2, ... in order of first appearance. So the blocks of a shared root or an earlier turn repeat their
    ids, the block where two prompts diverge (or where a partial last block is later filled) gets a new one.
    """
    check_block_size(block_size)
    for name, value, lo in (("num_requests", num_requests, 1), ("mean_input_len", mean_input_len, 1),
                            ("system_prompt_len", system_prompt_len, 0), ("num_roots", num_roots, 1),
                            ("root_median_len", root_median_len, 1), ("followup_median_len", followup_median_len, 1),
                            ("mean_output_len", mean_output_len, 1), ("max_output_len", max_output_len, 1),
                            ("max_message_len", max_message_len, 1)):
        if type(value) is not int or value < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    if type(seed) is not int:
        raise ValueError(f"seed must be an int, got {seed!r}")
    for name, value, ok in (("root_zipf_alpha", root_zipf_alpha, lambda v: v >= 0),
                            ("turn_continue_prob", turn_continue_prob, lambda v: 0 <= v < 1),
                            ("mean_think_time_s", mean_think_time_s, lambda v: v > 0),
                            ("request_rate", request_rate, lambda v: v > 0),
                            ("message_sigma", message_sigma, lambda v: v >= 0),
                            ("output_sigma", output_sigma, lambda v: v >= 0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
            raise ValueError(f"{name} out of range: {value!r}")

    rng = random.Random(f"kvlab:mooncake-trace:{seed}")
    root_lens = [_lognormal_len(rng, root_median_len, 0.75, 16384) for _ in range(num_roots)]
    root_cum = list(_accumulate_weights(num_roots, root_zipf_alpha))
    out_median = mean_output_len / math.exp(output_sigma**2 / 2)
    session_rate = request_rate * (1 - turn_continue_prob)

    # 1. The plan: sessions and their turns, in arrival order. No draw depends on mean_input_len.
    sessions = []  # (root, first_raw, outputs[k], followups[k]; followups[0] = 0)
    heap: list = []  # (arrival_s, seq, session, turn)
    plan: list = []
    t_next, seq = 0.0, 0
    while len(plan) < num_requests:
        sid, t = len(sessions), t_next
        root = rng.choices(range(num_roots), cum_weights=root_cum)[0]
        first_raw = rng.lognormvariate(0.0, message_sigma)
        outputs, followups = [], [0]
        while True:
            heapq.heappush(heap, (t, seq, sid, len(outputs)))
            seq += 1
            outputs.append(_lognormal_len(rng, out_median, output_sigma, max_output_len))
            if rng.random() >= turn_continue_prob:
                break
            t += rng.expovariate(1.0 / mean_think_time_s)
            followups.append(_lognormal_len(rng, followup_median_len, 1.0, max_message_len))
        sessions.append((root, first_raw, outputs, followups))
        t_next += rng.expovariate(session_rate)
        while heap and heap[0][0] <= t_next and len(plan) < num_requests:  # nothing later can precede these
            plan.append(heapq.heappop(heap))

    # 2. Scale first messages so the mean prompt length is mean_input_len.
    import numpy as np

    base_total = 0
    for _, _, sid, k in plan:
        root, _, outputs, followups = sessions[sid]
        base_total += system_prompt_len + root_lens[root] + sum(outputs[:k]) + sum(followups[1 : k + 1])
    raw = np.array([first_raw for _, first_raw, _, _ in sessions])
    first_lens = _first_lens(_solve_scale(base_total, raw[[sid for _, _, sid, _ in plan]],
                                          mean_input_len * len(plan), max_message_len), raw, max_message_len)

    # 3. Hash ids, chained over block contents, numbered by first appearance. Turn k repeats turn k-1's
    #    prompt, so its whole blocks are reused and only the blocks from there on are cut.
    ids: dict = {}
    done: dict = {}  # session -> (prompt length, hash ids) of its latest turn
    records = []
    for t, _, sid, k in plan:
        root, _, outputs, followups = sessions[sid]
        pieces = [(("sys",), system_prompt_len), (("root", root), root_lens[root]),
                  (("msg", sid, 0), int(first_lens[sid]))]
        for j in range(k):
            pieces += [(("out", sid, j), outputs[j]), (("msg", sid, j + 1), followups[j + 1])]
        prev_len, prev_hashes = done.get(sid, (0, ()))
        keep = prev_len // block_size
        hashes = list(prev_hashes[:keep])
        parent = hashes[-1] if hashes else -1
        for content in _block_contents(pieces, block_size, keep * block_size):
            parent = ids.setdefault((parent, content), len(ids))
            hashes.append(parent)
        input_len = sum(n for _, n in pieces)
        done[sid] = (input_len, hashes)
        records.append(MooncakeRecord(round(t * 1000), input_len, outputs[k], tuple(hashes)))
    return records


def _accumulate_weights(n: int, alpha: float) -> Iterator[float]:
    total = 0.0
    for rank in range(1, n + 1):
        total += 1.0 / rank**alpha
        yield total


def _first_lens(scale: float, raw: np.ndarray, hi: int) -> np.ndarray:
    """First-message lengths: round(scale * raw) (half to even, as Python's round), clipped to [1, hi]."""
    import numpy as np

    return np.clip(np.rint(scale * raw), 1, hi).astype(np.int64)


def _solve_scale(base_total: int, raw: np.ndarray, target_total: int, hi: int) -> float:
    """The scale s with base_total + sum(_first_lens(s, raw)) closest to target_total (monotone in s)."""

    def total(s: float) -> int:
        return base_total + int(_first_lens(s, raw, hi).sum())

    n = len(raw)
    lo_total, hi_total = total(0.0), base_total + hi * n
    if not lo_total <= target_total <= hi_total:
        raise ValueError(f"mean_input_len {target_total / n:.0f} is out of reach for these parameters: the mean "
                         f"prompt is between {lo_total / n:.0f} and {hi_total / n:.0f} tokens")
    lo, up = 0.0, 1.0
    while total(up) < target_total:
        up *= 2
    for _ in range(60):
        mid = (lo + up) / 2
        lo, up = (mid, up) if total(mid) < target_total else (lo, mid)
    return up if abs(total(up) - target_total) <= abs(total(lo) - target_total) else lo


def _block_contents(pieces: list[tuple], block_size: int, start: int = 0) -> Iterator[tuple]:
    """Cut a prompt given as (piece, length) runs into blocks, from token ``start`` (a multiple of
    ``block_size``) on; each block is a tuple of (piece, first, end) runs."""
    block, room, pos = [], block_size, 0
    for piece, n in pieces:
        if pos + n <= start:
            pos += n
            continue
        a = max(0, start - pos)
        pos += n
        if room == block_size:  # whole blocks inside this piece: no list building
            while n - a >= block_size:
                yield ((piece, a, a + block_size),)
                a += block_size
        while a < n:
            take = min(room, n - a)
            block.append((piece, a, a + take))
            a += take
            room -= take
            if room == 0:
                yield tuple(block)
                block, room = [], block_size
    if block:
        yield tuple(block)
