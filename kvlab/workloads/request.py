"""One arriving request, and the immutable token sequence its prompt is.

Token storage. A Mooncake-shaped trace is ~12,000 requests of ~12,000 prompt tokens: 144M tokens, 1.15 GB as int64
if every prompt owned a flat array. But prompts are built from a few shared pieces (a system prompt, 512-token
hashed blocks, the earlier turns of a conversation), so a :class:`TokenSequence` is a tuple of *segments*,
each an immutable int sequence that many requests hold by reference:

- ``range``: a synthesised block (Mooncake block ``h`` is ``range(h*512, h*512 + 512)``), O(1) memory;
- ``tuple[int, ...]``: sampled tokens (a system prompt, a question, one turn's output).

It reads as one ``Sequence[int]`` (``len``, indexing, slicing without copying blocks, iteration, ``==`` with
any int sequence). ``to_array()`` materialises a flat ``array('q')`` (what ``kvlab.mem_cache.RadixCache`` keys
are) and ``to_numpy()`` an int64 array, on demand, one request at a time: 0.1-0.3 ms for a 12k-token
trace prompt (about 3 s for all 144M tokens of a 12k-request trace, never all held at once).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import TYPE_CHECKING, Any

from kvlab.units import div_ceil

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

_TOKEN_LIMIT = 2**63  # token ids are stored as int64


def _check_token_ids(tokens: Any, field: str) -> tuple:
    if isinstance(tokens, (str, bytes)):
        raise ValueError(f"{field} must be a sequence of ints, got {type(tokens).__name__}")
    if hasattr(tokens, "tolist"):  # array('q'), numpy, torch: one C call instead of element objects
        tokens = tokens.tolist()
    out = tuple(tokens)
    for i, t in enumerate(out):
        if type(t) is not int or not 0 <= t < _TOKEN_LIMIT:
            raise ValueError(f"{field}[{i}] must be an int in [0, 2**63), got {t!r}")
    return out


class TokenSequence(Sequence[int]):
    """An immutable ``Sequence[int]`` of token ids stored as shared segments (see the module docstring).

    ``TokenSequence(tokens)`` validates and copies ``tokens`` into one segment (a ``range`` stays lazy);
    ``a + b`` concatenates without copying. Equality is by value with any sequence of ints; the hash
    equals ``hash(tuple(self))`` (computed once).
    """

    __slots__ = ("_segments", "_ends", "_hash")

    def __init__(self, tokens: Iterable[int] = (), *, field: str = "tokens"):
        if isinstance(tokens, TokenSequence):
            segments: tuple = tokens._segments
        elif isinstance(tokens, range):
            if len(tokens) and (min(tokens[0], tokens[-1]) < 0 or max(tokens[0], tokens[-1]) >= _TOKEN_LIMIT):
                raise ValueError(f"{field} must be ints in [0, 2**63), got {tokens!r}")
            segments = (tokens,)
        else:
            segments = (_check_token_ids(tokens, field),)
        self._set(segments)

    def _set(self, segments: tuple, ends: tuple | None = None) -> None:
        if ends is None:
            lens = tuple(map(len, segments))
            if 0 in lens:
                segments = tuple(s for s in segments if len(s))
                lens = tuple(n for n in lens if n)
            ends = tuple(accumulate(lens))
        self._segments = segments
        self._ends = ends
        self._hash: int | None = None

    @classmethod
    def from_segments(cls, segments: Iterable[Sequence[int]], ends: tuple | None = None) -> TokenSequence:
        """Trusted constructor, with no checks: segments are ranges or tuples of valid token ids the caller
        built or checked itself (the workload generators and trace readers); ``ends`` (cumulative lengths of
        non-empty segments) may be given when the caller knows them. Token ids from a user go through
        ``TokenSequence(tokens)``, which checks them."""
        obj = cls.__new__(cls)
        obj._set(tuple(segments), ends)
        return obj

    @property
    def segments(self) -> tuple:
        """The shared segments (``range`` or ``tuple``), in order; empty segments are dropped."""
        return self._segments

    @property
    def ends(self) -> tuple:
        """The cumulative lengths of :attr:`segments` (where each ends in the sequence)."""
        return self._ends

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._segments)

    def __contains__(self, token: object) -> bool:
        return any(token in s for s in self._segments)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return TokenSequence.from_segments((tuple(self)[index],))
            return self._slice(start, stop)
        n = len(self)
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"TokenSequence index {index} out of range for length {n}")
        k = bisect_right(self._ends, i)
        return self._segments[k][i - (self._ends[k - 1] if k else 0)]

    def _slice(self, start: int, stop: int) -> TokenSequence:
        if start >= stop:
            return TokenSequence.from_segments(())
        first = bisect_right(self._ends, start)
        last = bisect_left(self._ends, stop)  # segment holding token stop-1
        out = []
        for k in range(first, last + 1):
            base = self._ends[k - 1] if k else 0
            seg = self._segments[k]
            lo, hi = max(start - base, 0), min(stop - base, len(seg))
            out.append(seg if (lo, hi) == (0, len(seg)) else seg[lo:hi])
        return TokenSequence.from_segments(out)

    def __add__(self, other: TokenSequence) -> TokenSequence:
        if not isinstance(other, TokenSequence):
            return NotImplemented
        return TokenSequence.from_segments(self._segments + other._segments)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenSequence):
            if len(self) != len(other):
                return False
            if self._ends == other._ends and all(a is b or a == b for a, b in zip(self._segments, other._segments)):
                return True  # note range(3) != (0, 1, 2): a segment mismatch proves nothing, so compare values
            return self.to_array() == other.to_array()
        if isinstance(other, (str, bytes)) or not isinstance(other, (Sequence, array)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def __repr__(self) -> str:
        head = list(self[:6])
        more = ", ..." if len(self) > 6 else ""
        return f"TokenSequence({str(head)[:-1]}{more}], len={len(self)}, segments={len(self._segments)})"

    def __reduce__(self):
        return (TokenSequence.from_segments, (self._segments,))

    def to_array(self) -> array:
        """A new flat ``array('q')`` of the tokens (``range`` segments expand through numpy)."""
        import numpy as np

        segs = self._segments
        if segs and all(type(seg) is range and seg.step == 1 for seg in segs):
            width = len(segs[0])
            if len(segs[-1]) <= width and all(len(seg) == width for seg in segs[:-1]):  # a trace's blocks: one
                # broadcast add writes them all
                n_full = len(segs) - 1
                out, flat = _blank(self._ends[-1])
                offsets = np.arange(width, dtype=np.int64)
                starts = np.fromiter([seg.start for seg in segs], dtype=np.int64, count=n_full + 1)
                np.add(starts[:-1, None], offsets, out=flat[: n_full * width].reshape(n_full, width))
                np.add(starts[-1], offsets[: len(segs[-1])], out=flat[n_full * width :])
                return out
            lens = np.fromiter((len(seg) for seg in segs), dtype=np.int64, count=len(segs))
            starts = np.fromiter((seg.start for seg in segs), dtype=np.int64, count=len(segs))
            ends = np.cumsum(lens)  # token i of range k is starts[k] + i - (ends[k] - lens[k])
            out, flat = _blank(int(ends[-1]))
            np.add(np.repeat(starts - (ends - lens), lens), np.arange(int(ends[-1]), dtype=np.int64), out=flat)
            return out
        out = array("q")
        for seg in segs:
            if type(seg) is range:
                out.frombytes(memoryview(np.arange(seg.start, seg.stop, seg.step, dtype=np.int64)).cast("B"))
            else:
                out.fromlist(list(seg))
        return out

    def to_numpy(self) -> np.ndarray:
        """A new int64 numpy array of the tokens (``torch.from_numpy`` turns it into a tensor)."""
        import numpy as np

        return np.frombuffer(self.to_array(), dtype=np.int64)

    def tolist(self) -> list:
        return list(self)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


@dataclass(frozen=True)
class Request:
    """One request as it arrives: who, when, which prompt tokens, how many tokens to generate.

    Fields (units in the names; lengths are token counts):

    - ``rid``: unique id within a workload (e.g. ``"gsp-17"``, ``"conversation_trace-4031"``).
    - ``arrival_time_s``: seconds from the workload's origin, finite and >= 0.
    - ``prompt_token_ids``: a :class:`TokenSequence` (any sequence of ints is converted and validated).
    - ``output_len``: tokens the request generates (SGLang's ``max_new_tokens`` with ``ignore_eos``).
    - ``group_id``: requests built on the same shared prefix (a system prompt, a few-shot set).
    - ``session_id`` / ``turn``: a multi-turn conversation and the 0-based turn in it.
    - ``output_token_ids``: the tokens this request "generates", when the workload fixes them (multi-turn chat:
      the next turn's prompt contains them, so a simulator that caches prompt + output, as SGLang's
      ``cache_finished_req`` does, gets those hits); ``None`` when only the count matters.
    - ``block_hashes`` / ``block_size``: for trace requests, one hash id per ``block_size`` prompt tokens (the
      last block may be partial). Equal ids mean equal token blocks, so a scheduler with a KV page size of
      ``block_size`` can key pages by these ids instead of token tuples.
    """

    rid: str
    arrival_time_s: float
    prompt_token_ids: TokenSequence
    output_len: int
    group_id: str | None = None
    session_id: str | None = None
    turn: int | None = None
    output_token_ids: TokenSequence | None = None
    block_hashes: tuple | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        where = f"Request {self.rid!r}"
        if not isinstance(self.rid, str) or not self.rid:
            raise ValueError(f"Request rid must be a non-empty str, got {self.rid!r}")
        t = self.arrival_time_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"{where}: arrival_time_s must be a finite number >= 0, got {t!r}")
        object.__setattr__(self, "arrival_time_s", float(t))
        if self.prompt_token_ids is None:
            raise ValueError(f"{where}: prompt_token_ids is missing (None)")
        if not isinstance(self.prompt_token_ids, TokenSequence):
            object.__setattr__(self, "prompt_token_ids", TokenSequence(self.prompt_token_ids, field="prompt_token_ids"))
        if len(self.prompt_token_ids) == 0:
            raise ValueError(f"{where}: prompt_token_ids must be non-empty (prompt_len 0)")
        if not _is_count(self.output_len):
            raise ValueError(f"{where}: output_len must be an int >= 0, got {self.output_len!r}")
        if self.turn is not None and not _is_count(self.turn):
            raise ValueError(f"{where}: turn must be an int >= 0 or None, got {self.turn!r}")
        if self.output_token_ids is not None:
            if not isinstance(self.output_token_ids, TokenSequence):
                tokens = TokenSequence(self.output_token_ids, field="output_token_ids")
                object.__setattr__(self, "output_token_ids", tokens)
            if len(self.output_token_ids) != self.output_len:
                raise ValueError(f"{where}: output_token_ids has {len(self.output_token_ids)} tokens "
                                 f"but output_len is {self.output_len}")
        self._check_blocks(where)

    def _check_blocks(self, where: str) -> None:
        if self.block_hashes is None:
            if self.block_size is not None:
                raise ValueError(f"{where}: block_size {self.block_size!r} given without block_hashes")
            return
        if type(self.block_size) is not int or self.block_size <= 0:
            raise ValueError(f"{where}: block_size must be an int > 0 when block_hashes is given, "
                             f"got {self.block_size!r}")
        if not isinstance(self.block_hashes, tuple):
            object.__setattr__(self, "block_hashes", tuple(self.block_hashes))
        need = div_ceil(self.prompt_len, self.block_size)
        if len(self.block_hashes) != need:
            raise ValueError(f"{where}: block_hashes has {len(self.block_hashes)} ids but prompt_len "
                             f"{self.prompt_len} needs div_ceil({self.prompt_len}, {self.block_size}) = {need}")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @classmethod
    def from_checked(cls, rid: str, arrival_time_s: float, prompt_token_ids: TokenSequence, output_len: int,
                     block_hashes: tuple | None = None, block_size: int | None = None) -> Request:
        """Trusted constructor, with no checks (a fifth of the cost of ``Request(...)``): for a caller that built
        every field in the form ``__post_init__`` leaves it (``arrival_time_s`` a float, ``prompt_token_ids`` a
        non-empty :class:`TokenSequence`, ``block_hashes`` a tuple of the right length) and checked it, as the
        trace loader does; the fields it does not take are ``None``. Input from a user goes through
        ``Request(...)``."""
        obj = _new(cls)
        fields = obj.__dict__
        fields["rid"] = rid
        fields["arrival_time_s"] = arrival_time_s
        fields["prompt_token_ids"] = prompt_token_ids
        fields["output_len"] = output_len
        fields["group_id"] = fields["session_id"] = fields["turn"] = fields["output_token_ids"] = None
        fields["block_hashes"] = block_hashes
        fields["block_size"] = block_size
        return obj


_new = object.__new__


def requests_to_frame(requests: Sequence[Request]) -> pd.DataFrame:
    """One row per request: ``rid, arrival_time_s, prompt_len, output_len, group_id, session_id, turn``."""
    import pandas as pd

    return pd.DataFrame(
        {
            "rid": [r.rid for r in requests],
            "arrival_time_s": [r.arrival_time_s for r in requests],
            "prompt_len": [r.prompt_len for r in requests],
            "output_len": [r.output_len for r in requests],
            "group_id": [r.group_id for r in requests],
            "session_id": [r.session_id for r in requests],
            "turn": pd.array([r.turn for r in requests], dtype="Int64"),
        }
    )


def _blank(n: int) -> tuple[array, np.ndarray]:
    """A new ``array('q')`` of ``n`` tokens (zeros) and a writable int64 numpy view of it: numpy writes the tokens
    in place (no second buffer to fill and copy: a trace's prompts are ~150 million tokens, 1.2 GB)."""
    import numpy as np

    out = array("q", _ZERO) * n
    return out, np.frombuffer(out, dtype=np.int64)


_ZERO = array("q", [0])
