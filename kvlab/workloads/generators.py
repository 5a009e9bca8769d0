"""Seeded synthetic workloads: each returns ``list[Request]`` sorted by ``arrival_time_s``.

Every generator takes ``seed`` (an int) and draws from ``random.Random`` streams derived from it
(``random.Random("kvlab:<stream>:<seed>")``; string seeds go through SHA-512, so the numbers are the same in
every process and on every platform). Separate streams keep the parts independent: changing
``request_rate`` moves arrival times but never changes a token.

``request_rate`` is in requests/s: ``float("inf")`` puts every request at t = 0; otherwise arrivals are a
Poisson process as in ``sglang/benchmark/serving.py::get_request`` (the first request at t = 0, then
exponential gaps of mean ``1 / request_rate``).

Shared prefixes are exact. Tokens are uniform over ``range(vocab_size)``, as SGLang's ``gen_prompt_ids`` draws
them from the tokenizer's vocabulary, but kvlab also re-draws the *first* token of a segment until it differs
from its siblings' (the other system prompts; the other questions under one system prompt). With plain random
tokens two siblings share a first token with probability 1/vocab_size, and a prefix cache would count that
one-token "hit"; here the prompts of a group share exactly their system prompt, and groups share nothing.
"""

from __future__ import annotations

import inspect
import math
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from kvlab.workloads.bounds import (
    Amount,
    WorkloadSize,
    WorkloadTooLarge,
    check_size,
    lengths_size,
    product,
    total,
)
from kvlab.workloads.multiturn import NAME as multiturn_name
from kvlab.workloads.multiturn import multiturn
from kvlab.workloads.request import Request, TokenSequence

Workload = Callable[..., "list[Request]"]
WORKLOADS: dict[str, Workload] = {}
INF = float("inf")


def register_workload(name: str) -> Callable[[Workload], Workload]:
    """Decorator: file a generator under ``name`` in :data:`WORKLOADS` and return it unchanged."""

    def deco(fn: Workload) -> Workload:
        WORKLOADS[name] = fn
        return fn

    return deco


def make_workload(name: str, seed: int = 0, **overrides: Any) -> list[Request]:
    """Build the workload registered as ``name`` with its defaults, ``seed`` and ``overrides``.

    An unknown name or an override the generator does not take raises ``ValueError`` listing what exists, and
    so does a workload that yields no request (the built-in ones refuse counts below 1 themselves; this also
    covers generators added with :func:`register_workload`). A workload beyond the simulator's bounds
    (:mod:`kvlab.workloads.bounds`, the same as a trace's) raises ``WorkloadTooLarge`` naming the parameters, the
    size they make and the limit; the built-in generators refuse it before drawing a token.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(WORKLOADS)}")
    fn = WORKLOADS[name]
    accepted = [p for p in inspect.signature(fn).parameters if p != "seed"]
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise ValueError(f"workload {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                         f"it accepts: {', '.join(accepted)}")
    given = ", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "its defaults"
    try:
        requests = fn(seed=seed, **overrides)
    except ValueError as exc:
        if not overrides:
            raise
        # the defaults are valid, so an override is at fault: say which were given (issue 26: the message named
        # only the generator's own argument)
        kind = WorkloadTooLarge if isinstance(exc, WorkloadTooLarge) else ValueError
        raise kind(f"workload {name!r} with {given[:200]}: {exc}") from None
    if len(requests) == 0:
        raise ValueError(f"workload {name!r} with {given} (seed {seed}) yields no requests")
    # the built-in generators check their sizes before they draw; one added with register_workload is held to the
    # same bounds here, before a simulation starts
    check_size(lengths_size([len(r.prompt_token_ids) for r in requests], [r.output_len for r in requests]),
               f"workload {name!r} with {given[:200]}")
    return requests


def workload_defaults(name: str) -> dict:
    """The default keyword arguments of workload ``name`` (for help texts and notebooks)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(WORKLOADS)}")
    return {p.name: p.default for p in inspect.signature(WORKLOADS[name]).parameters.values()}


# ---------------------------------------------------------------------------------------------------------
# shared helpers


def _check_int(name: str, value: Any, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_common(seed: Any, request_rate: Any, vocab_size: Any) -> None:
    _check_int("seed", seed, -(2**63))
    if isinstance(request_rate, bool) or not isinstance(request_rate, (int, float)) or not request_rate > 0:
        raise ValueError(f"request_rate must be a number > 0 (requests/s; inf = all at t=0), got {request_rate!r}")
    _check_int("vocab_size", vocab_size, 2)


def _stream(seed: int, name: str) -> random.Random:
    return random.Random(f"kvlab:{name}:{seed}")


def _arrival_times(seed: int, n: int, request_rate: float, stream: str = "arrivals") -> list[float]:
    """Poisson arrivals mirroring ``serving.py::get_request``: first at 0, then Exp(request_rate) gaps."""
    if request_rate == INF:
        return [0.0] * n
    rng = _stream(seed, stream)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(request_rate)
    return out


def _random_lens(rng: random.Random, full_len: int, range_ratio: float, num: int) -> list[int]:
    """``datasets/common.py::compute_random_lens``: uniform in [max(int(full*ratio), 1), full]; 0 stays 0."""
    if full_len <= 0:
        return [0] * num
    lo = max(int(full_len * range_ratio), 1)
    return [rng.randint(lo, full_len) for _ in range(num)]


def _sample(rng: random.Random, n: int, vocab_size: int, siblings: set | None = None) -> TokenSequence:
    """``n`` uniform tokens (``gen_prompt_ids``); with ``siblings``, a first token none of them has."""
    toks = rng.choices(range(vocab_size), k=n)
    if siblings is not None and toks:
        while toks[0] in siblings:
            toks[0] = rng.randrange(vocab_size)
        siblings.add(toks[0])
    return TokenSequence.from_segments((tuple(toks),))


def _need_vocab(vocab_size: int, siblings: int, what: str) -> None:
    if siblings > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small to give {siblings} {what} distinct first tokens")


# ---------------------------------------------------------------------------------------------------------
# workloads


@register_workload("generated-shared-prefix")
def generated_shared_prefix(num_groups: int = 64, prompts_per_group: int = 16, system_prompt_len: int = 2048,
                            question_len: int = 128, output_len: int = 256, seed: int = 0,
                            request_rate: float = INF, vocab_size: int = 32000, range_ratio: float = 1.0,
                            ordered: bool = False, group_distribution: str = "uniform",
                            zipf_alpha: float | None = None) -> list[Request]:
    """SGLang bench_serving's ``generated-shared-prefix`` dataset, as token ids.

    Mirrors ``sglang/benchmark/datasets/generated_shared_prefix.py::sample_generated_shared_prefix_requests``
    (0.5.23) with ``--tokenize-prompt`` (prompt = system ids + question ids, exact lengths) and its defaults
    (``--gsp-*``: 64 groups x 16 prompts, 2048-token system prompt, 128-token question, 256-token output,
    range ratio 1.0). In the same order it draws the system-prompt, question and output lengths
    (``compute_random_lens``), then the system prompts, then the questions slot by slot; it builds the
    requests group-major (slot ``g * prompts_per_group + p``) and then **shuffles them** unless ``ordered``
    (``--gsp-ordered``), so the groups interleave in arrival order. ``group_distribution="zipf"`` samples
    each slot's group with probability proportional to ``1 / rank**zipf_alpha`` from an isolated stream, as
    upstream (slot ``s`` keeps question ``s``; only its system prompt changes).

    Differs on purpose: no tokenizer (ids are uniform over ``range(vocab_size)``; SGLang's text mode decodes
    and re-encodes, so its lengths are approximate); Python's ``random`` instead of numpy's global state
    (same seed, different numbers); distinct first tokens between siblings (module docstring); no
    ``num_turns`` (see :func:`multi_turn_chat`). ``rid`` is ``gsp-<slot>``, ``group_id`` ``gsp-group-<g>``.
    """
    _check_common(seed, request_rate, vocab_size)
    for name, value, lo in (("num_groups", num_groups, 1), ("prompts_per_group", prompts_per_group, 1),
                            ("system_prompt_len", system_prompt_len, 0), ("question_len", question_len, 0),
                            ("output_len", output_len, 0)):
        _check_int(name, value, lo)
    if system_prompt_len + question_len == 0:
        raise ValueError("system_prompt_len + question_len must be >= 1 (a prompt needs a token)")
    if isinstance(range_ratio, bool) or not isinstance(range_ratio, (int, float)) or not 0 <= range_ratio <= 1:
        raise ValueError(f"range_ratio must be a number in [0, 1], got {range_ratio!r}")
    check_size(_gsp_size(num_groups, prompts_per_group, system_prompt_len, question_len, output_len))
    num_slots = num_groups * prompts_per_group
    assignment = _group_assignment(seed, num_groups, prompts_per_group, group_distribution, zipf_alpha)

    rng = _stream(seed, "tokens")
    system_lens = _random_lens(rng, system_prompt_len, range_ratio, num_groups)
    question_lens = _random_lens(rng, question_len, range_ratio, num_slots)
    output_lens = _random_lens(rng, output_len, range_ratio, num_slots)
    if system_prompt_len:
        _need_vocab(vocab_size, num_groups, "system prompts")
        _need_vocab(vocab_size, max(Counter(assignment).values()), "questions of one group")
    else:
        _need_vocab(vocab_size, num_slots, "questions (no system prompt)")
    first_of_system: set = set()
    systems = [_sample(rng, n, vocab_size, first_of_system) for n in system_lens]
    # Questions under one system prompt are siblings; with no system prompt every question is a root child.
    first_of_question = [set() for _ in range(num_groups)] if system_prompt_len else [set()] * num_groups
    specs = []
    for slot in range(num_slots):
        g = assignment[slot]
        question = _sample(rng, question_lens[slot], vocab_size, first_of_question[g])
        specs.append((f"gsp-{slot}", systems[g] + question, output_lens[slot], f"gsp-group-{g}"))
    if not ordered:
        rng.shuffle(specs)
    arrivals = _arrival_times(seed, num_slots, request_rate)
    return [Request(rid=rid, arrival_time_s=t, prompt_token_ids=prompt, output_len=out, group_id=group)
            for t, (rid, prompt, out, group) in zip(arrivals, specs)]


def _gsp_size(groups: int, per_group: int, system_len: int, question_len: int, output_len: int) -> WorkloadSize:
    """The most :func:`generated_shared_prefix` can make (lengths drawn below their maxima make less)."""
    n = groups * per_group
    return WorkloadSize(
        requests=product(("num_groups", groups), ("prompts_per_group", per_group)),
        longest_prompt=total(("system_prompt_len", system_len), ("question_len", question_len)),
        longest_output=Amount(output_len, "output_len"),
        prompt_tokens=product(("requests", n), ("(system_prompt_len + question_len)", system_len + question_len)),
        output_tokens=product(("requests", n), ("output_len", output_len)),
        held_tokens=total(("num_groups × system_prompt_len", groups * system_len),
                          ("requests × question_len", n * question_len)))


def _group_assignment(seed: int, num_groups: int, prompts_per_group: int, distribution: str,
                      zipf_alpha: float | None) -> list[int]:
    """Group of each slot: ``[0]*P + [1]*P + ...`` (uniform) or Zipf by rank (``_zipf_group_probs``)."""
    if distribution == "uniform":
        if zipf_alpha is not None:
            raise ValueError("zipf_alpha is only meaningful with group_distribution='zipf'")
        return [g for g in range(num_groups) for _ in range(prompts_per_group)]
    if distribution != "zipf":
        raise ValueError(f"group_distribution must be 'uniform' or 'zipf', got {distribution!r}")
    if isinstance(zipf_alpha, bool) or not isinstance(zipf_alpha, (int, float)) or not (
            math.isfinite(zipf_alpha) and zipf_alpha > 0):
        raise ValueError(f"group_distribution='zipf' needs zipf_alpha, a finite number > 0; got {zipf_alpha!r}")
    weights = [1.0 / rank**zipf_alpha for rank in range(1, num_groups + 1)]
    return _stream(seed, "zipf").choices(range(num_groups), weights=weights, k=num_groups * prompts_per_group)


@register_workload("multi-turn-chat")
def multi_turn_chat(num_sessions: int = 64, turns: int = 4, system_prompt_len: int = 256, user_len: int = 128,
                    output_len: int = 256, think_time_s: float = 10.0, seed: int = 0,
                    request_rate: float = INF, vocab_size: int = 32000) -> list[Request]:
    """Conversations whose every turn re-sends the whole history.

    Turn ``k`` of a session has prompt = system prompt (shared by all sessions) + ``u_0 + o_0 + ... +
    o_{k-1} + u_k``, where ``u_i`` is a ``user_len``-token user message and ``o_i`` the ``output_len`` tokens
    turn ``i`` generates (fixed by the seed and given as ``output_token_ids``): the prompt of turn ``k`` is
    exactly the prompt + output of turn ``k-1`` plus a new message. Sessions start as a Poisson process of
    ``request_rate`` sessions/s (all at t = 0 for ``inf``); turn ``k+1`` arrives an exponential think time of
    mean ``think_time_s`` after turn ``k`` (0: at the same time). Arrivals are open loop: a simulator that
    wants the output reuse should not start turn ``k+1`` before turn ``k`` finished (``session_id``, ``turn``).

    Like the upstream ``--gsp-num-turns`` / Mooncake multi-round modes, but with real history reuse.
    ``rid`` is ``chat-<session>-<turn>``, ``session_id`` ``chat-<session>``.
    """
    _check_common(seed, request_rate, vocab_size)
    for name, value, lo in (("num_sessions", num_sessions, 1), ("turns", turns, 1),
                            ("system_prompt_len", system_prompt_len, 0), ("user_len", user_len, 1),
                            ("output_len", output_len, 0)):
        _check_int(name, value, lo)
    if isinstance(think_time_s, bool) or not isinstance(think_time_s, (int, float)) or not (
            math.isfinite(think_time_s) and think_time_s >= 0):
        raise ValueError(f"think_time_s must be a finite number >= 0, got {think_time_s!r}")
    check_size(_chat_size(num_sessions, turns, system_prompt_len, user_len, output_len))
    _need_vocab(vocab_size, num_sessions, "sessions")
    rng = _stream(seed, "tokens")
    think = _stream(seed, "think")
    system = _sample(rng, system_prompt_len, vocab_size)
    first_of_session: set = set()
    starts = _arrival_times(seed, num_sessions, request_rate)
    out: list[Request] = []
    for s, t in enumerate(starts):
        history = system
        for k in range(turns):
            prompt = history + _sample(rng, user_len, vocab_size, first_of_session if k == 0 else None)
            reply = _sample(rng, output_len, vocab_size)
            out.append(Request(rid=f"chat-{s}-{k}", arrival_time_s=t, prompt_token_ids=prompt,
                               output_len=output_len, session_id=f"chat-{s}", turn=k, output_token_ids=reply))
            history = prompt + reply
            if think_time_s > 0:
                t += think.expovariate(1.0 / think_time_s)
    out.sort(key=lambda r: r.arrival_time_s)  # stable: ties keep session-major, turn order
    return out


def _chat_size(sessions: int, turns: int, system_len: int, user_len: int, output_len: int) -> WorkloadSize:
    """What :func:`multi_turn_chat` makes: turn ``k``'s prompt is the system prompt, ``k + 1`` messages and ``k``
    outputs, held as ``2k + 2`` pieces."""
    turn_len = user_len + output_len
    per_session = turns * system_len + turns * (turns + 1) // 2 * user_len + turns * (turns - 1) // 2 * output_len
    return WorkloadSize(
        requests=product(("num_sessions", sessions), ("turns", turns)),
        longest_prompt=Amount(system_len + turns * user_len + (turns - 1) * output_len,
                              "system_prompt_len + turns × user_len + (turns - 1) × output_len"),
        longest_output=Amount(output_len, "output_len"),
        prompt_tokens=Amount(sessions * per_session, "every turn's whole history, num_sessions × (turns × "
                                                     "system_prompt_len + turns² / 2 × (user_len + output_len))"),
        output_tokens=product(("num_sessions", sessions), ("turns", turns), ("output_len", output_len)),
        held_tokens=total(("num_sessions × turns × (user_len + output_len)", sessions * turns * turn_len),
                          ("num_sessions × turns × (turns + 1) pieces", sessions * turns * (turns + 1))))


@register_workload("few-shot")
def few_shot(num_requests: int = 256, num_examples: int = 5, example_len: int = 256, question_len: int = 64,
             output_len: int = 32, seed: int = 0, request_rate: float = INF,
             vocab_size: int = 32000) -> list[Request]:
    """Few-shot prompting (an MMLU/GSM8K-style benchmark): one shared prefix of ``num_examples`` examples of
    ``example_len`` tokens each, then a distinct ``question_len``-token question per request.

    Every prompt shares exactly ``num_examples * example_len`` tokens. ``rid`` is ``few-shot-<i>``,
    ``group_id`` ``few-shot``; requests arrive in index order.
    """
    _check_common(seed, request_rate, vocab_size)
    for name, value, lo in (("num_requests", num_requests, 1), ("num_examples", num_examples, 0),
                            ("example_len", example_len, 0), ("question_len", question_len, 1),
                            ("output_len", output_len, 0)):
        _check_int(name, value, lo)
    check_size(_few_shot_size(num_requests, num_examples, example_len, question_len, output_len))
    _need_vocab(vocab_size, num_requests, "questions")
    rng = _stream(seed, "tokens")
    prefix = TokenSequence()
    for _ in range(num_examples):
        prefix = prefix + _sample(rng, example_len, vocab_size)
    first_of_question: set = set()
    questions = [_sample(rng, question_len, vocab_size, first_of_question) for _ in range(num_requests)]
    out_lens = [output_len] * num_requests
    arrivals = _arrival_times(seed, num_requests, request_rate)
    return [Request(rid=f"few-shot-{i}", arrival_time_s=t, prompt_token_ids=prefix + q, output_len=n,
                    group_id="few-shot")
            for i, (t, q, n) in enumerate(zip(arrivals, questions, out_lens))]


def _few_shot_size(n: int, examples: int, example_len: int, question_len: int, output_len: int) -> WorkloadSize:
    """What :func:`few_shot` makes: each prompt holds the shared examples as ``num_examples`` pieces."""
    prompt_len = examples * example_len + question_len
    return WorkloadSize(
        requests=Amount(n, "num_requests"),
        longest_prompt=Amount(prompt_len, "num_examples × example_len + question_len"),
        longest_output=Amount(output_len, "output_len"),
        prompt_tokens=product(("num_requests", n), ("(num_examples × example_len + question_len)", prompt_len)),
        output_tokens=product(("num_requests", n), ("output_len", output_len)),
        held_tokens=total(("num_examples × example_len", examples * example_len),
                          ("num_requests × question_len", n * question_len),
                          ("num_requests × num_examples pieces", n * examples)))


# SGLang's benchmark/hicache/bench_multiturn.py clients (a closed loop: the sender settings travel with the list)
WORKLOADS[multiturn_name] = multiturn
