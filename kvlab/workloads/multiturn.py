"""SGLang's ``benchmark/hicache/bench_multiturn.py`` workload (docs/semantics.md, "The multi-turn benchmark"), with
the script's own parameter names and defaults.

``num_clients`` clients each hold one conversation of ``num_rounds`` rounds. Round 0 sends ``request_length`` fresh
tokens; each later round resends the whole history: the previous prompt, the previous output (``output_length``
tokens: ``max_new_tokens`` with ``ignore_eos``) and a new sub-question of ``sub_question_input_length`` tokens (0:
the request length). So prompt(r) = L + r·(O + S), exact token ids, and clients share no prefix.

The requests carry their client (``session_id``) and round (``turn``); their arrival times are 0 because the run
decides them: the benchmark is a closed loop (a client's next round is sent only after its previous response), run
by :class:`kvlab.sched.arrivals.ClientArrivals` from the sender settings the returned list carries
(:attr:`ClientWorkload.closed_loop`: ``max_parallel``, ``request_rate``, ``ready_queue_policy``,
``enable_round_barrier``).
"""

from __future__ import annotations

import random
from typing import Any

from kvlab.units import POW2_40
from kvlab.workloads.bounds import Amount, WorkloadSize, check_size, product
from kvlab.workloads.request import Request, TokenSequence

VOCAB_SIZE = 32_000  # the random-sample mode's tokens (the script draws them from the model's tokenizer)
NAME = "multiturn"
#: the sender's settings: workload parameters, run by the closed loop rather than turned into tokens
SENDER_PARAMS = ("max_parallel", "request_rate", "ready_queue_policy", "enable_round_barrier")


class ClientWorkload(list):
    """The benchmark's requests (client-major, round order) and, in :attr:`closed_loop`, the sender's settings."""

    closed_loop: dict[str, Any]


def multiturn(num_clients: int = 256, num_rounds: int = 5, request_length: int = 512,
              sub_question_input_length: int = 0, output_length: int = 64, max_parallel: int = 128,
              request_rate: float = 1.0, ready_queue_policy: str = "random", enable_round_barrier: bool = False,
              disable_random_sample: bool = False, seed: int = 0) -> ClientWorkload:
    """``bench_multiturn.py``'s clients, with its defaults. ``disable_random_sample``: each piece is a run of
    consecutive token ids from a seeded offset (else seeded random tokens, each client's first token distinct).
    ``rid`` is ``mt-<client>-<round>``, ``session_id`` ``client-<client>``, ``turn`` the round."""
    for name, value, lo in (("num_clients", num_clients, 1), ("num_rounds", num_rounds, 1),
                            ("request_length", request_length, 1),
                            ("sub_question_input_length", sub_question_input_length, 0),
                            ("output_length", output_length, 1), ("seed", seed, -(2**63))):
        if type(value) is not int or value < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    if not isinstance(disable_random_sample, bool):
        raise ValueError(f"disable_random_sample must be true or false, got {disable_random_sample!r}")
    sub = sub_question_input_length or request_length
    check_size(_size(num_clients, num_rounds, request_length, sub, output_length))
    rng = random.Random(f"kvlab:multiturn-tokens:{seed}")
    piece = _Pieces(rng, disable_random_sample)
    out = ClientWorkload()
    firsts: set = set()
    for c in range(num_clients):
        history = piece(request_length, firsts)
        for r in range(num_rounds):
            if r:
                history = history + piece(sub)
            reply = piece(output_length)
            out.append(Request(rid=f"mt-{c}-{r}", arrival_time_s=0.0, prompt_token_ids=history,
                               output_len=output_length, session_id=f"client-{c}", turn=r,
                               output_token_ids=reply))
            history = history + reply
    out.closed_loop = dict(max_parallel=max_parallel, request_rate=request_rate,
                           ready_queue_policy=ready_queue_policy, enable_round_barrier=enable_round_barrier)
    return out


def prompt_length(round_: int, request_length: int, output_length: int, sub_question_input_length: int = 0) -> int:
    """prompt(r) = L + r·(O + S) (S = 0 means the request length)."""
    return request_length + round_ * (output_length + (sub_question_input_length or request_length))


class _Pieces:
    """The workload's token pieces: consecutive ids from a seeded offset, or seeded random tokens."""

    def __init__(self, rng: random.Random, consecutive: bool) -> None:
        self.rng, self.consecutive = rng, consecutive
        self.next_id = rng.randrange(1, POW2_40)

    def __call__(self, n: int, firsts: set | None = None) -> TokenSequence:
        if self.consecutive:
            start, self.next_id = self.next_id, self.next_id + n
            return TokenSequence(range(start, start + n))
        tokens = self.rng.choices(range(VOCAB_SIZE), k=n)
        if firsts is not None:  # no two clients share a first token, so no prefix at all
            while tokens[0] in firsts:
                tokens[0] = self.rng.randrange(VOCAB_SIZE)
            firsts.add(tokens[0])
        return TokenSequence.from_segments((tuple(tokens),))


def _size(clients: int, rounds: int, length: int, sub: int, output: int) -> WorkloadSize:
    """What :func:`multiturn` makes, before it draws a token."""
    step = output + sub
    return WorkloadSize(
        requests=product(("num_clients", clients), ("num_rounds", rounds)),
        longest_prompt=Amount(length + (rounds - 1) * step,
                              "request_length + (num_rounds - 1) × (output_length + sub_question_input_length)"),
        longest_output=Amount(output, "output_length"),
        prompt_tokens=Amount(clients * (rounds * length + rounds * (rounds - 1) // 2 * step),
                             "num_clients × Σ_r (request_length + r × (output_length + sub_question_input_length))"),
        output_tokens=product(("num_clients", clients), ("num_rounds", rounds), ("output_length", output)),
        held_tokens=Amount(clients * (length + rounds * output + (rounds - 1) * sub),
                           "num_clients × (request_length + num_rounds × output_length + (num_rounds - 1) × "
                           "sub_question_input_length)"))
