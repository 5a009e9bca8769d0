"""Mooncake-format JSONL traces: load (with token synthesis), write, describe, and generate realistic ones.

The format (``kvcache-ai/Mooncake: FAST25-release/traces/*.jsonl``; SGLang reads it in
``sglang/benchmark/datasets/mooncake.py``) is one JSON object per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2353, 2354]}

- ``timestamp``: arrival in milliseconds from the trace origin (int);
- ``input_length`` / ``output_length``: prompt tokens / generated tokens;
- ``hash_ids``: one id per 512-token block of the prompt, the last block possibly partial, so
  ``len(hash_ids) == div_ceil(input_length, 512)``. The ids are chained (a block's id depends on every block
  before it, like SGLang/vLLM page hashes) and remapped to small ints: equal ids mean equal prefixes.

Token synthesis. Block ``h`` becomes ``range(h * block_size, (h + 1) * block_size)``, the last block truncated so
the prompt has exactly ``input_length`` tokens. So equal ids give equal blocks (a partial block is a prefix of the
full one), different ids give blocks that differ at every position, the first included; with a KV page size of
``block_size``, page ``i`` of a prompt *is* block ``hash_ids[i]``, and a token-level radix cache sees exactly the
trace's block hits, never a spurious match inside a block. Each block is one ``range`` object shared by every
request that names it (O(1) memory); ``Request.block_hashes`` keeps the ids for block-keyed schedulers.
These token ids run far past any vocabulary (block 100,000 starts at 51,200,000): they are identities for
caching, and nothing in kvlab embeds them. (SGLang instead writes text, ``f"{hash_id}"`` + 128 x ``" hi"`` per
block, and re-tokenises it, so its prompt lengths drift from ``input_length``.)

Loading never materialises prompts: a 12,000-request trace of ~12k-token prompts loads in about 0.2 s and
holds ~45 MiB (``benchmarks/make_mooncake_trace.py --benchmark`` prints the figures). :func:`load_trace` reads a
well-formed file column-wise (:func:`_load_well_formed`) and anything else line by line, which names the first
bad line.
"""

from __future__ import annotations

import gc
import heapq
import json
import math
import operator
import os
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate, chain, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kvlab.errors import KvlabError
from kvlab.input_limits import reading
from kvlab.units import div_ceil
from kvlab.workloads.bounds import MAX_LENGTH, check_size, lengths_size
from kvlab.workloads.request import Request, TokenSequence

if TYPE_CHECKING:
    import numpy as np

MOONCAKE_BLOCK_SIZE = 512  # tokens per hash id in the published traces
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_TOKEN_LIMIT = 2**63
PathLike = str | Path


class TraceFormatError(KvlabError, ValueError):
    """A trace line (or record) that is not a valid Mooncake record, or a trace file with no record at all;
    the message starts ``<where>: `` (``trace.jsonl:7`` for a file line, ``trace.jsonl`` for the whole file,
    ``records[3]`` for an in-memory record)."""

    def __init__(self, where: str, message: str, field: str | None = None):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.field = field


@dataclass(frozen=True)
class MooncakeRecord:
    """One trace line. ``timestamp_ms`` is the JSON ``timestamp``; the other names are the JSON keys."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple

    def to_dict(self) -> dict:
        return {"timestamp": self.timestamp_ms, "input_length": self.input_length,
                "output_length": self.output_length, "hash_ids": list(self.hash_ids)}

    def to_json(self) -> str:
        """The line as the published traces spell it (``json.dumps`` defaults: ``", "`` and ``": "``)."""
        return json.dumps(self.to_dict())


# ---------------------------------------------------------------------------------------------------------
# validation


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Upper bounds on a record's numbers: a timestamp within ~300 years of the trace's start, and no request longer
# than 10M tokens (MAX_LENGTH, kvlab.workloads.bounds: the longest context any model offers), so no record asks for
# unbounded work or overflows; the whole trace is held to the same bounds as a generated workload (check_size)
MAX_TIMESTAMP_MS = 10 ** 13


def _int_field(where: str, name: str, value: Any, minimum: int, unit: str = "", maximum: int = MAX_LENGTH) -> int:
    if type(value) is not int or value < minimum:
        raise TraceFormatError(where, f"field {name!r} must be an integer >= {minimum}{unit}, got {_show(value)}",
                               name)
    if value > maximum:
        raise TraceFormatError(where, f"field {name!r} must be at most {maximum:,}{unit}, got {_show(value)}", name)
    return value


class _DuplicateKey(ValueError):
    def __init__(self, key: str, first: Any, second: Any):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def _no_duplicate_keys(pairs: list) -> dict:
    """``object_pairs_hook``: a JSON object as a dict, refusing a key given twice (``json`` keeps the last one
    silently). :func:`iter_records` pays for it only on a line with more colons than keys: every key of every
    object has one colon, so a line whose colon count is its key count (every line kvlab or Mooncake writes) has
    no key twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: dict = {}
        for key, value in pairs:
            if key in seen:
                raise _DuplicateKey(key, seen[key], value)
            seen[key] = value
    return obj


_STRICT_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys)


def _check_block_size(block_size: Any) -> None:
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1 (tokens per hash id), got {block_size!r}")


def _fast_record(obj: Any, block_size: int) -> MooncakeRecord | None:
    """The record of a decoded line that is a valid one (the common case), checked with inline tests and C-level
    scans of ``hash_ids``; None for anything else, which :func:`_parse_record` then checks and names."""
    if type(obj) is not dict:
        return None
    ts, n_in, n_out, ids = (obj.get("timestamp"), obj.get("input_length"), obj.get("output_length"),
                            obj.get("hash_ids"))
    if not (type(ts) is int and type(n_in) is int and type(n_out) is int and type(ids) is list
            and 0 <= ts <= MAX_TIMESTAMP_MS and 1 <= n_in <= MAX_LENGTH and 0 <= n_out <= MAX_LENGTH
            and len(ids) == -(-n_in // block_size)):
        return None
    if set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) > _TOKEN_LIMIT // block_size - 1:
        return None  # n_in >= 1, so ids is not empty
    return MooncakeRecord(ts, n_in, n_out, tuple(ids))


def _parse_record(obj: Any, where: str, block_size: int) -> MooncakeRecord:
    """Check one decoded JSON value (or a mapping given in memory); extra keys are ignored."""
    if not isinstance(obj, Mapping):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(obj), "number")
        raise TraceFormatError(where, f"expected a JSON object, got {kind}")
    for name in _FIELDS:
        if name not in obj:
            raise TraceFormatError(where, f"missing field {name!r}", name)
    ts = _int_field(where, "timestamp", obj["timestamp"], 0, " (milliseconds)", MAX_TIMESTAMP_MS)
    n_in = _int_field(where, "input_length", obj["input_length"], 1)
    n_out = _int_field(where, "output_length", obj["output_length"], 0)
    ids = obj["hash_ids"]
    if not isinstance(ids, (list, tuple)):
        raise TraceFormatError(where, f"field 'hash_ids' must be a list of integers, got {_show(ids)}", "hash_ids")
    max_id = _TOKEN_LIMIT // block_size - 1  # so every synthesised token id fits int64
    if (ids and set(map(type, ids)) != {int}) or (ids and not (min(ids) >= 0 and max(ids) <= max_id)):
        i, h = next((i, h) for i, h in enumerate(ids) if type(h) is not int or not 0 <= h <= max_id)
        raise TraceFormatError(where, f"field 'hash_ids' must be a list of integers in [0, {max_id}]; "
                                      f"element {i} is {_show(h)}", "hash_ids")
    need = div_ceil(n_in, block_size)
    if len(ids) != need:
        raise TraceFormatError(where, f"field 'hash_ids' has {len(ids)} ids but input_length {n_in} needs "
                                      f"div_ceil({n_in}, {block_size}) = {need}", "hash_ids")
    return MooncakeRecord(ts, n_in, n_out, tuple(ids))


def _coerce(record: Any, where: str, block_size: int) -> MooncakeRecord:
    if isinstance(record, MooncakeRecord):
        record = record.to_dict()
    return _parse_record(record, where, block_size)


# ---------------------------------------------------------------------------------------------------------
# reading and writing


def iter_records(path: PathLike, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> Iterator[MooncakeRecord]:
    """The records of a trace file, in file order; blank lines are skipped (as SGLang does).

    Raises :class:`TraceFormatError` naming ``<path>:<line>`` and the field for the first bad line, and naming
    ``<path>`` for a file with no record (0 bytes, or only blank lines): a run on no requests would report
    zeros that look like results.
    """
    _check_block_size(block_size)
    _check_path(path)
    lineno = found = 0
    for lineno, obj in _decode_lines(path):
        if obj is _BLANK:
            continue
        found += 1
        yield _fast_record(obj, block_size) or _parse_record(obj, f"{path}:{lineno}", block_size)
    if not found:
        plural = "s" if lineno > 1 else ""
        what = "the file is 0 bytes" if lineno == 0 else f"{lineno} blank line{plural}, nothing else"
        raise TraceFormatError(str(path), f"empty trace: no requests ({what}); a Mooncake-format trace has one "
                                          "JSON object per line")


def _check_path(path: PathLike) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: trace file not found")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a Mooncake-format JSONL trace file")


_BLANK = object()  # what _decode_lines gives for a blank line
_DECODER = json.JSONDecoder()  # json.loads' own settings
_WHITESPACE = " \t\n\r"  # JSON's


def _decode_lines(path: PathLike) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON value or ``_BLANK``) for each line of ``path``; raises :class:`TraceFormatError`
    naming ``<path>:<line>`` for a line that is not one JSON value.

    The fast path reads the file as one UTF-8 string and runs the decoder's scanner on each line (what
    ``json.loads`` does, less its per-call checks: a third of the time); any line the scanner does not read whole,
    and a file that is not UTF-8, go through ``json.loads`` line by line, whose error names the line and column.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        yield from _decode_slowly(path, _lines(data, b"\n"), 1)
        return
    lines = _lines(text, "\n")
    scan, ws = _DECODER.scan_once, _WHITESPACE
    for i, line in enumerate(lines):
        body = line.strip(ws)
        if not body:
            yield i + 1, _BLANK
            continue
        try:
            obj, end = scan(body, 0)
        except (StopIteration, ValueError, RecursionError):
            end = -1
        if end != len(body):  # not one JSON value: json.loads says why
            yield from _decode_slowly(path, [s.encode("utf-8", "surrogatepass") for s in lines[i:]], i + 1)
            return
        yield i + 1, _no_key_twice(obj, body, f"{path}:{i + 1}")


def _no_key_twice(obj: Any, line: str | bytes, where: str) -> Any:
    """``obj`` (``line`` decoded), refused naming ``where`` if one of its keys is given twice. A well-formed record
    has one colon per key, so only a line with more colons than keys is decoded again, by the checking decoder."""
    if type(obj) is dict and line.count(":" if isinstance(line, str) else b":") != len(obj):
        try:
            _STRICT_DECODER.decode(line if isinstance(line, str) else line.decode("utf-8-sig"))
        except _DuplicateKey as e:
            raise TraceFormatError(where, f"key {_show(e.key)} given twice ({_show(e.first)}, then "
                                          f"{_show(e.second)}): which one is meant is unclear", e.key) from None
    return obj


def _lines(text: str | bytes, newline: str | bytes) -> list:
    """``text``'s lines, as a file reads them: a final line end ends the last line, it starts none."""
    lines = text.split(newline)
    if not lines[-1]:
        lines.pop()
    return lines


def _decode_slowly(path: PathLike, raw_lines: list[bytes], first_lineno: int) -> Iterator[tuple[int, Any]]:
    """:func:`_decode_lines` one ``json.loads`` per line (``raw_lines`` numbered from ``first_lineno``)."""
    for lineno, raw in enumerate(raw_lines, first_lineno):
        if not raw.strip():
            yield lineno, _BLANK
            continue
        where = f"{path}:{lineno}"
        try:
            line = raw.rstrip(b"\r\n")  # so an error's column is on this line
            obj = _no_key_twice(json.loads(line), line, where)
        except json.JSONDecodeError as e:
            raise TraceFormatError(where, f"not valid JSON: {e.msg} (column {e.colno})") from None
        except ValueError as e:  # bytes that are not UTF-8
            raise TraceFormatError(where, f"not valid JSON: {e}") from None
        except RecursionError:
            raise TraceFormatError(where, "not a trace record: JSON nested too deeply to read") from None
        yield lineno, obj


def read_records(path: PathLike, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> list[MooncakeRecord]:
    """All records of a trace file, in file order (see :func:`iter_records`)."""
    return list(iter_records(path, block_size=block_size))


def load_trace(path: PathLike, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> list[Request]:
    """A Mooncake trace as requests sorted by arrival (ties keep file order).

    ``arrival_time_s = timestamp / 1000`` (the trace's own origin: published traces start at 0). ``rid`` is
    ``<file stem>-<record index in file order>``; prompts are synthesised from ``hash_ids`` (module docstring).
    """
    _check_block_size(block_size)
    _check_path(path)
    with _no_gc_pauses(), reading(path):  # a MemoryError names the file (kvlab.input_limits)
        fast = _load_well_formed(path, block_size, Path(path).stem)
        if fast is not None:
            return fast
        records = read_records(path, block_size=block_size)
        _check_records_size(records, str(path))
        return _to_requests(records, block_size, Path(path).stem)


def _check_records_size(records: Sequence[MooncakeRecord], where: str) -> None:
    """Refuse records beyond the simulator's bounds (kvlab.workloads.bounds), naming ``where``."""
    check_size(lengths_size([r.input_length for r in records], [r.output_length for r in records], "records"), where)


@contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """The cyclic garbage collector held off while a trace loads: loading makes ~10 container objects per request
    and no reference cycle, so the collections its allocations trigger (young ones every 700 objects, older and
    full ones as those fill) walk what the load made again and again and find nothing: about a third of the load
    time. One collection still walks the new objects once after the load. Restored on the way out, errors
    included; a collector already off stays off (as ``kvlab.device.measure.automatic_gc_paused``, which this layer
    cannot import)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


_GET_FIELDS = operator.itemgetter(*_FIELDS)
_INT = {int}


def _load_well_formed(path: PathLike, block_size: int, rid_prefix: str) -> list[Request] | None:
    """:func:`load_trace`'s requests for a file of well-formed records (every file kvlab or Mooncake writes), or
    None on any doubt, for the line-by-line reader to read and name the first bad line exactly.

    Well-formed: UTF-8, one JSON object per line with no blank line and no space around it, each with valid
    fields (the checks of :func:`_fast_record`) and no key twice (one colon per key in the whole file). The
    checks run on whole columns in C-level calls (``map``, ``set``, ``min``), then one short Python loop builds
    the requests with the trusted constructors: two thirds of the time of records then requests, most of it in
    the JSON scanner, the one ``range`` per distinct block and the requests themselves."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = _lines(text, "\n")
    try:
        objs, ends = zip(*map(_DECODER.scan_once, lines, repeat(0)))
    except (StopIteration, ValueError, RecursionError):  # a blank line, bad JSON, or nothing at all
        return None
    if (ends != tuple(map(len, lines)) or set(map(type, objs)) != {dict}
            or text.count(":") != sum(map(len, objs))):
        return None
    try:
        ts, n_in, n_out, ids = zip(*map(_GET_FIELDS, objs))
    except KeyError:
        return None
    if not (set(map(type, ts)) == set(map(type, n_in)) == set(map(type, n_out)) == _INT
            and set(map(type, ids)) == {list}
            and min(ts) >= 0 and max(ts) <= MAX_TIMESTAMP_MS and min(n_in) >= 1 and max(n_in) <= MAX_LENGTH
            and min(n_out) >= 0 and max(n_out) <= MAX_LENGTH):
        return None
    check_size(lengths_size(n_in, n_out, "records"), str(path))  # before a request is built
    n_blocks = tuple(map(len, ids))
    if n_blocks != tuple(map(operator.floordiv, map(operator.add, n_in, repeat(block_size - 1)), repeat(block_size))):
        return None
    flat = list(chain.from_iterable(ids))  # not empty: every prompt has a block
    if set(map(type, flat)) != _INT or min(flat) < 0 or max(flat) > _TOKEN_LIMIT // block_size - 1:
        return None
    # the requests: segment lists sliced from one flat list of every prompt's blocks, last blocks truncated
    top = max(flat)
    if top < 2 * len(flat):  # ids numbered from 0 up, as published traces and generate_trace number them: a
        # list of every id's block (no set, no dict: half the time)
        table = list(map(range, range(0, (top + 1) * block_size, block_size),
                         range(block_size, (top + 2) * block_size, block_size)))
        segs = list(map(table.__getitem__, flat))
        del table  # the blocks of ids no prompt names go with it
    else:
        segs = list(map(_shared_blocks([flat], block_size).__getitem__, flat))
    stops = list(accumulate(n_blocks))
    full_ends = tuple(range(block_size, max(n_blocks) * block_size, block_size))
    new_seq, new_request = TokenSequence.from_segments, Request.from_checked
    out = []
    for i, (stop, n, length) in enumerate(zip(stops, n_blocks, n_in)):
        tail = length - (n - 1) * block_size
        if tail != block_size:
            segs[stop - 1] = segs[stop - 1][:tail]
        prompt = new_seq(segs[stop - n:stop], full_ends[: n - 1] + (length,))
        out.append(new_request(f"{rid_prefix}-{i}", ts[i] / 1000, prompt, n_out[i], tuple(ids[i]), block_size))
    order = sorted(range(len(out)), key=ts.__getitem__)
    return list(map(out.__getitem__, order))


def records_to_requests(records: Iterable[MooncakeRecord | Mapping], *,
                        block_size: int = MOONCAKE_BLOCK_SIZE, rid_prefix: str = "trace") -> list[Request]:
    """Like :func:`load_trace` for in-memory records (``MooncakeRecord`` or mappings with the JSON keys)."""
    _check_block_size(block_size)
    checked = [_coerce(r, f"records[{i}]", block_size) for i, r in enumerate(records)]
    _check_records_size(checked, "records")
    return _to_requests(checked, block_size, rid_prefix)


def _shared_blocks(id_lists: Iterable[Sequence[int]], block_size: int) -> dict[int, range]:
    """hash id -> its full block, one shared ``range`` per distinct id in ``id_lists``, built by C-level maps (a
    Python call per block, as a ``__missing__`` hook makes, was half of a 12k-request trace's load time)."""
    ids = list(set().union(*id_lists))
    starts = list(map(operator.mul, ids, repeat(block_size)))
    return dict(zip(ids, map(range, starts, map(operator.add, starts, repeat(block_size)))))


def _to_requests(records: Sequence[MooncakeRecord], block_size: int, rid_prefix: str) -> list[Request]:
    block = _shared_blocks([rec.hash_ids for rec in records], block_size).__getitem__
    longest = max((len(rec.hash_ids) for rec in records), default=0)
    full_ends = tuple(range(block_size, longest * block_size, block_size))  # every prompt's block ends but its last
    out = []
    for i, rec in enumerate(records):
        segs = list(map(block, rec.hash_ids))
        n = len(segs)
        if rec.input_length != n * block_size:
            segs[-1] = segs[-1][: rec.input_length - (n - 1) * block_size]
        ends = full_ends[: n - 1] + (rec.input_length,)
        out.append(Request(rid=f"{rid_prefix}-{i}", arrival_time_s=rec.timestamp_ms / 1000,
                           prompt_token_ids=TokenSequence.from_segments(segs, ends), output_len=rec.output_length,
                           block_hashes=rec.hash_ids, block_size=block_size))
    order = sorted(range(len(out)), key=lambda i: records[i].timestamp_ms)
    return [out[i] for i in order]


def block_tokens(hash_id: int, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> range:
    """The synthesised tokens of full block ``hash_id`` (the rule :func:`load_trace` uses)."""
    return range(hash_id * block_size, (hash_id + 1) * block_size)


def write_trace(path: PathLike, records: Iterable[MooncakeRecord | Mapping], *, overwrite: bool = False,
                block_size: int = MOONCAKE_BLOCK_SIZE) -> Path:
    """Write records as Mooncake JSONL (``\\n`` line ends, UTF-8). Every record is checked before the file is
    opened; an existing file is refused (``FileExistsError``) unless ``overwrite=True``."""
    _check_block_size(block_size)
    lines = [_coerce(r, f"records[{i}]", block_size).to_json() for i, r in enumerate(records)]
    text = "".join(line + "\n" for line in lines)
    try:
        with open(path, "w" if overwrite else "x", encoding="utf-8", newline="\n") as f:
            f.write(text)
    except FileExistsError:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it") from None
    return Path(path)


# ---------------------------------------------------------------------------------------------------------
# describing


class TraceStats(NamedTuple):
    """Shape of a trace. ``ideal_hit_rate``: prompt tokens an infinite prefix cache with page size
    ``block_size`` would hit if it cached every prompt (whole blocks only, longest cached prefix), over all
    prompt tokens: the ceiling for ``kvlab simulate --trace ... --page-size 512``."""

    num_requests: int
    duration_s: float
    mean_input_len: float
    max_input_len: int
    mean_output_len: float
    unique_blocks: int
    total_blocks: int
    ideal_hit_rate: float


def trace_stats(records: Sequence[MooncakeRecord], *, block_size: int = MOONCAKE_BLOCK_SIZE) -> TraceStats:
    recs = sorted(records, key=lambda r: r.timestamp_ms)
    n = len(recs)
    if n == 0:
        return TraceStats(0, 0.0, 0.0, 0, 0.0, 0, 0, 0.0)
    trie: dict = {}  # (parent node, hash id) -> node: the full blocks cached so far, as prefix paths
    hit = total = 0
    for r in recs:
        node, matching = -1, True
        for _j, h in enumerate(r.hash_ids[: r.input_length // block_size]):
            child = trie.get((node, h))
            if child is None:
                matching = False
                child = trie[(node, h)] = len(trie)
            elif matching:
                hit += block_size
            node = child
        total += r.input_length
    return TraceStats(
        num_requests=n,
        duration_s=(recs[-1].timestamp_ms - recs[0].timestamp_ms) / 1000,
        mean_input_len=total / n,
        max_input_len=max(r.input_length for r in recs),
        mean_output_len=sum(r.output_length for r in recs) / n,
        unique_blocks=len({h for r in recs for h in r.hash_ids}),
        total_blocks=sum(len(r.hash_ids) for r in recs),
        ideal_hit_rate=hit / total,
    )


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
    _check_block_size(block_size)
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
