"""Read an SGLang start-up log (any version from 0.1.17 on; formats in kvlab.serving.sglang_formats).

Lines are found by their message, anywhere on a line: users paste logs with tqdm bars, docker-compose
prefixes (``sglang-1  | ``) and shell prompts in front. The rank comes from the tag just before the
message (``[gpu_id=2]``, ``[gpu=2]``, ``[... TP3]``, ``[... DP1 TP3]``; none = rank 0). A line that starts
a known message but does not carry its number is an error naming the line, never skipped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.serving.provenance import parse_reconstructed

#: the most GPUs one tensor-, data- or pipeline-parallel group spans as kvlab reads a log or a ``tp=`` what-if (a
#: tp_size of 0, -2 or 10^30 read from a log was accepted: issue 26)
MAX_PARALLEL = 4096


class LogError(KvlabError, ValueError):
    """A log kvlab cannot explain; the message names the file (and line) and what is missing."""


class NoStartupReadings(LogError):
    """A log without the start-up memory readings (a log of runtime lines alone is still explained: issue 36)."""


_NUM = r"(\d+(?:\.\d+)?)"
MESSAGES = {  # name -> (anchor, full pattern); the anchor alone on a line without the pattern is an error
    "begin": ("Load weight begin.", re.compile(r"Load weight begin\.\s+avail mem=" + _NUM + r" GB", re.I)),
    "end": ("Load weight end.", re.compile(r"Load weight end\.\s*(?P<rest>.*?)avail mem=" + _NUM + r" ?GB", re.I)),
    "pool_end": ("Memory pool end.", re.compile(r"Memory pool end\.\s+avail mem=" + _NUM + r" GB")),
    "kv": ("KV Cache is allocated.", re.compile(
        r"KV Cache is allocated\.(?:\s+dtype: (?P<dtype>[\w.]+),)?(?:\s+#tokens: (?P<tokens>\d+),)?\s+"
        r"(?:K size: (?P<k>\d+\.\d+) GB, V size: (?P<v>\d+\.\d+) GB|KV size: (?P<kv>\d+\.\d+) GB)")),
    # (?![\w.]): the whole number ("1e30" or "0.00" is no token count, not 1 or 0)
    "tokens": ("max_total_num_token", re.compile(r"(?:^|\]\s|:\s)max_total_num_tokens?=(\d+)(?![\w.])")),
    "init": ("Init torch distributed ends.", re.compile(r"Init torch distributed ends\..*?mem usage=" + _NUM + " GB")),
}
_TOKENS_AT = re.compile(r"(?:^|\]\s|:\s)max_total_num_tokens?=")  # where SGLang's pool line starts
_KV_DTYPE = re.compile(r"Using KV cache dtype: ([\w.]+)")
_RANK_TAG = re.compile(r"\[([^\[\]]*)\]\s*$")
_RANK_MSG = re.compile(r"Rank (\d+): $")
_PAIRS = re.compile(r"\b(\w+)=([^,\s]+(?: GB)?)")  # \b: linear on a long run of word characters
_VERSION_LINES = (  # (pattern, what it is)
    (re.compile(r"\bsglang\s*(?:==|:)\s*v?(\d+\.\d+\.\d+(?:\.?post\d+|rc\d+|\.dev\d+)?)", re.I), "version line"),
    (re.compile(r"^\s*sglang\s+(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)\s*$", re.I), "pip list"),
    (re.compile(r"lmsysorg/sglang:v?(\d+\.\d+\.\d+(?:\.post\d+)?)", re.I), "docker image tag"),
)
_GPU_LINE = re.compile(r"^\s*GPU [\d,]+:\s*(.+?)\s*$")
_LAUNCH = re.compile(r"sglang\.launch_server\b(.*)$")


@dataclass
class RankReadings:
    label: str  # as printed: "TP0", "DP1 TP3", "gpu_id=2", "rank0"
    tp_rank: int
    before_gib: float | None = None
    after_gib: float | None = None
    pool_end_gib: float | None = None
    weights_usage_gib: float | None = None
    kv_tokens: int | None = None
    k_gib: float | None = None
    v_gib: float | None = None
    kv_gib: float | None = None
    max_total_num_tokens: int | None = None
    lines: dict = field(default_factory=dict)  # message -> 1-based line number
    texts: dict = field(default_factory=dict)  # message -> the matched text, to tell a repeat from a copy


@dataclass
class SGLangStartup:
    path: str
    n_lines: int
    ranks: dict[str, RankReadings] = field(default_factory=dict)
    version: str | None = None
    version_source: str | None = None
    server_args: dict[str, str] = field(default_factory=dict)
    server_args_line: int | None = None
    launch_args: dict[str, str] = field(default_factory=dict)
    launch_line: int | None = None
    tokens_fields: dict[str, str] = field(default_factory=dict)  # context_len, chunked_prefill_size, ...
    arch: str | None = None
    model_dtype: str | None = None
    kv_dtype: str | None = None
    gpu_name: str | None = None
    rocm: bool = False
    format_hints: list[str] = field(default_factory=list)
    # A log holding several server starts (a server restarted, its output appended to one file): each
    # server_args line after the first (SGLang prints one as it starts) begins a new start, and the last is read.
    start_line: int = 1  # the first line of the start that is read
    earlier_starts: list[tuple[int, int]] = field(default_factory=list)  # (first, last line) of each set aside
    # the same message printed again by one rank within one start, with another value: (rank label, message
    # anchor, line kept, line set aside); the first is kept (a second model loaded later, e.g. a speculative draft)
    repeats: list[tuple[str, str, int, int]] = field(default_factory=list)
    reconstructed: dict[str, str] = field(default_factory=dict)  # kvlab.serving.provenance: rebuilt readings

    def where(self, message: str) -> str:
        lines = [r.lines[message] for r in self.ranks.values() if message in r.lines]
        return f"{self.path}:{min(lines)}" if lines else self.path

    def setting(self, *names: str) -> tuple[str | None, str | None]:
        """(value, where) from server_args, else the launch command line."""
        for name in names:
            if self.server_args.get(name) not in (None, "None"):
                return self.server_args[name], f"server_args {name}={self.server_args[name]} (line {self.server_args_line})"
        for name in names:
            flag = name.replace("_", "-")
            if flag in self.launch_args:
                return self.launch_args[flag], f"command line --{flag} {self.launch_args[flag]} (line {self.launch_line})"
        return None, None


def _rank_of(prefix: str) -> tuple[str, int]:
    m = _RANK_TAG.search(prefix)
    tag = m.group(1) if m else ""
    for pattern in (r"gpu_id=(\d+)", r"gpu=(\d+)", r"\bTP(\d+)"):
        found = re.search(pattern, tag)
        if found:
            label = " ".join(re.findall(r"\b(?:DP|PP|TP|EP|ATTN_CP|MOE_DP)\d+", tag)) or found.group(0)
            return label, int(found.group(1))
    m = _RANK_MSG.search(prefix)
    if m:
        return f"Rank {m.group(1)}", int(m.group(1))
    return "rank0", 0


def split_top_level(text: str) -> list[str]:
    """``a=1, b='x, y', c=[1, 2]`` -> items split on top-level commas (quotes and brackets respected)."""
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return [item for item in items if item]


def _server_args(line: str, where: str) -> dict[str, str]:
    body = line.split("ServerArgs(", 1)[1]
    body = body[: body.rfind(")")] if ")" in body else body
    pairs = []
    for item in split_top_level(body):
        key, sep, value = item.partition("=")
        key = key.strip().lstrip(". ")  # pasted excerpts elide fields with "..."
        if sep and re.fullmatch(r"[A-Za-z_]\w*", key):
            pairs.append((key, value.strip().rstrip(". ").strip().strip("'\"")))
    return _once_each(pairs, where, "server_args")


def _once_each(pairs, where: str, what: str) -> dict[str, str]:
    """``pairs`` (key, value) as a dict; a LogError naming ``where`` (file:line), the key and both values where a key
    comes twice. SGLang prints each field of a line once: a second one is an edited or spliced line, and which value
    the server ran with is unclear (a trace key given twice is refused the same way)."""
    fields: dict[str, str] = {}
    for key, value in pairs:
        if key in fields:
            raise LogError(f"{where}: {what} gives {key!r} twice ({key}={_cut(fields[key])}, then "
                           f"{key}={_cut(value)}): which one the server ran with is unclear")
        fields[key] = value
    return fields


def _launch_args(tail: str) -> dict[str, str]:
    args, words = {}, tail.replace("`", " ").split()
    for i, word in enumerate(words):
        if word.startswith("--"):
            key, sep, value = word[2:].partition("=")
            if not sep:
                value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "True"
            args[{"tp": "tp-size", "tensor-parallel-size": "tp-size", "dp": "dp-size",
                  "data-parallel-size": "dp-size"}.get(key, key)] = value
    return args


def parse_sglang_log(text: str, path: str = "<log>") -> SGLangStartup:
    log = SGLangStartup(path=path, n_lines=text.count("\n") + 1)
    for number, line in enumerate(text.splitlines(), start=1):
        _read_line(log, line, number)
    log.reconstructed = parse_reconstructed(text, path)
    return log


def _new_start(log: SGLangStartup, number: int) -> None:
    """Line ``number`` starts the server again: set aside everything read from the current start."""
    log.earlier_starts.append((log.start_line, number - 1))
    log.start_line = number
    log.ranks, log.repeats, log.tokens_fields = {}, [], {}
    log.server_args, log.server_args_line, log.launch_args, log.launch_line = {}, None, {}, None
    log.arch = log.model_dtype = log.kv_dtype = None


def _read_line(log: SGLangStartup, line: str, number: int) -> None:
    if "ServerArgs(" in line:
        fields = _server_args(line, f"{log.path}:{number}")
        if log.server_args_line is not None:
            if fields == log.server_args and not log.ranks:
                return  # the same line twice, nothing between: a copy, not a new start
            _new_start(log, number)
        log.server_args, log.server_args_line = fields, number
        return
    # the launch command is no start marker: users paste it again after the log (an issue's "Command:" line)
    if (m := _LAUNCH.search(line)) and log.launch_line is None:
        log.launch_args, log.launch_line = _launch_args(m.group(1)), number
    if log.version is None:
        for pattern, what in _VERSION_LINES:
            if m := pattern.search(line):
                log.version, log.version_source = m.group(1), f"{what} at line {number}"
                break
    if (m := _GPU_LINE.match(line)) and log.gpu_name is None:
        log.gpu_name = m.group(1)
    if re.search(r"\bROCM|\bHIP|AMD Instinct|gfx9\d\d", line):
        log.rocm = True
    if m := _KV_DTYPE.search(line):
        log.kv_dtype = m.group(1)
        log.format_hints.append("0.5.4")
    if "KV cache pool leak" in line or "available_size=" in line:
        return
    for name, (anchor, pattern) in MESSAGES.items():
        start = line.find(anchor)
        if start < 0:
            continue
        m = pattern.search(line, max(0, start - 2))
        if m is None and name == "tokens" and not _TOKENS_AT.search(line):
            continue  # the name inside another message (a warning), not SGLang's pool line
        if m is None:
            raise LogError(f"{log.path}:{number}: '{anchor}' line without a readable number: {line.strip()[:160]!r}")
        label, tp_rank = _rank_of(line[: m.start()] if name != "tokens" else line[: start])
        rank = log.ranks.setdefault(label, RankReadings(label, tp_rank))
        if name in rank.lines:  # printed again by this rank in this start: keep the first
            if m.group(0).strip() != rank.texts[name]:
                log.repeats.append((label, anchor, rank.lines[name], number))
            continue
        rank.lines[name], rank.texts[name] = number, m.group(0).strip()
        _store(log, rank, name, m, line)


_HINTS = (  # (message, text on its line, lowest version printing it that way)
    ("end", "elapsed=", "0.5.10.post1"), ("end", "mem usage=", "0.4.3.post3"), ("end", "dtype=", "0.2.0"),
    ("kv", "dtype:", "0.5.16"), ("kv", "#tokens", "0.4.3.post3"), ("kv", "K", "0.4.2.post3"),
    ("tokens", "available_gpu_mem", "0.4.7.post1"), ("tokens", "chunked_prefill_size", "0.4.2.post3"),
    ("tokens", "max_running_requests", "0.2.0"), ("begin", "[gpu=", "0.2.9"),
)


def _hint(log: SGLangStartup, name: str, line: str) -> None:
    for message, text, version in _HINTS:
        if message == name and text in line and version not in log.format_hints:
            log.format_hints.append(version)
    if name == "begin" and re.search(r"\[\d{4}-\d{2}-\d{2} ", line) and "0.3.6" not in log.format_hints:
        log.format_hints.append("0.3.6")
    elif name == "begin" and re.search(r"\[\d{2}:\d{2}:\d{2} TP", line) and "0.2.15" not in log.format_hints:
        log.format_hints.append("0.2.15")


def _store(log: SGLangStartup, rank: RankReadings, name: str, m: re.Match, line: str) -> None:
    _hint(log, name, line)
    where = f"{log.path}:{rank.lines.get(name, '?')}"

    def gib(text: str) -> float:  # a memory reading: finite, under a million GiB (a 400-digit one is no reading)
        value = float(text)
        if not (math.isfinite(value) and 0 <= value < 1e6):
            raise LogError(f"{where}: reading {_cut(text)!r} GiB is not a memory size kvlab can use")
        return value

    def count(text: str) -> int:  # a token count: under 10^12
        if len(text) > 13 or int(text) >= 10 ** 12:
            raise LogError(f"{where}: token count {_cut(text)!r} is not one kvlab can use (expected under 10^12)")
        return int(text)

    if name == "begin":
        rank.before_gib = gib(m.group(1))
    elif name == "end":
        rank.after_gib = gib(m.group(2))
        if usage := re.search(r"mem usage=" + _NUM, line):
            rank.weights_usage_gib = gib(usage.group(1))
        if arch := re.search(r"type=(\w+)", m.group("rest"), re.I):
            log.arch = arch.group(1)
        if dtype := re.search(r"dtype=(torch\.\w+)", m.group("rest")):
            log.model_dtype = dtype.group(1)
    elif name == "pool_end":
        rank.pool_end_gib = gib(m.group(1))
    elif name == "kv":
        rank.kv_tokens = count(m.group("tokens")) if m.group("tokens") else None
        rank.k_gib, rank.v_gib = (gib(m.group("k")), gib(m.group("v"))) if m.group("k") else (None, None)
        rank.kv_gib = gib(m.group("kv")) if m.group("kv") else None
        if m.group("dtype"):
            log.kv_dtype = m.group("dtype")
    elif name == "tokens":
        rank.max_total_num_tokens = count(m.group(1))
        pairs = [(key, value.removesuffix(" GB")) for key, value in _PAIRS.findall(line[m.end():])]
        for key, value in _once_each(pairs, where, "the max_total_num_tokens line").items():
            log.tokens_fields.setdefault(key, value)


def _cut(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def read_sglang_log(path: str | Path) -> SGLangStartup:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise LogError(f"{path}: cannot read the log ({exc.strerror or exc})") from None
    return parse_sglang_log(text, str(path))
