"""Mutation fuzz over every reader, through the real CLI (tests/test_cli_fuzz.py runs it).

Real inputs (the shipped and shared snapshots, traces, start-up logs, configs, and a sweep file written by
``kvlab sweep --out``) are mutated at random: cut short, bytes flipped or inserted, lines dropped or doubled,
keys dropped, renamed, doubled or retyped (huge, NaN, infinite, negative, unicode, nested values), and a few
hostile pickles (huge FRAME and BINBYTES8 lengths, shared-reference bombs). Each case runs ``kvlab`` on the
mutated file and must end with exit 0, or exit 2 and a ``kvlab: error:`` line naming the input; never another
exit code, never a traceback, never past the per-case time limit, and never with the input file changed.

Cases run in a long-lived worker process that calls ``kvlab.cli.main`` (the real CLI, without an interpreter
start per case); a case that passes its time limit kills the worker, which is restarted for the next case. The
worker's address space is capped (``WORKER_MEMORY``), so an input that makes a reader allocate without bound
fails as a ``MemoryError`` (exit 3) instead of taking the machine down.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import random
import select
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASE_TIMEOUT_S = 20.0  # a case over this is a hang (the slowest real input replays in ~2 s on a loaded machine)
WORKER_MEMORY = 6 << 30  # bytes of address space for the worker (torch's import maps ~2 GiB)

WORKER = r"""
import contextlib, io, json, os, resource, sys, traceback, warnings
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
warnings.simplefilter("default")
from kvlab.cli import main
reply = os.fdopen(os.dup(1), "w")  # the replies' own channel; anything written to fd 1 goes nowhere
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
for line in sys.stdin:
    argv = json.loads(line)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 - reported to the parent as the failure it is
        code = "raised"
        err.write(traceback.format_exc())
    text = err.getvalue()
    reply.write(json.dumps({"code": code, "err": text if len(text) < 6000 else text[:3000] + text[-3000:]}) + "\n")
    reply.flush()
"""


@dataclass
class Case:
    kind: str  # snapshot, trace, log, config, sweep
    mutation: str  # what was done to the file, for the report
    argv: list[str]
    path: Path  # the mutated input (its hash must not change, except an --out the command may write)
    is_output: bool = False  # the sweep file: rewritten on exit 0, untouched on exit 2


@dataclass
class Outcome:
    case: Case
    code: int | str  # an exit code, "raised" (escaped main) or "hang"
    err: str
    problem: str | None = None


@dataclass
class Worker:
    """The long-lived process that runs cases through ``kvlab.cli.main``."""
    env: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    restarts: int = 0

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(WORKER_MEMORY)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
                                     env={**os.environ, "PYTHONPATH": str(REPO), "KVLAB_PROGRESS": "0", **self.env})

    def run(self, argv: list[str], timeout: float = CASE_TIMEOUT_S) -> tuple[int | str, str]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:  # past the limit (a hang), or the worker died (a crash the CLI did not catch)
            died = self.proc.poll()
            self.stop()
            self.restarts += 1
            return ("hang" if died is None else f"worker died ({died})"), ""
        reply = json.loads(line)
        return reply["code"], reply["err"]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"


def check(case: Case, code: int | str, err: str, before: str, after: str) -> str | None:
    """What is wrong with the outcome of ``case``, or None."""
    if code not in (0, 2):
        return f"exit {code}"
    if "Traceback (most recent call last)" in err:
        return "a traceback on stderr"
    if code == 2:
        lines = [line for line in err.splitlines() if line.startswith("kvlab: error: ")]
        if not lines:
            return "exit 2 without a 'kvlab: error:' line"
        # the file, or (for an error about what the file asks, such as a request too big for the pool) the
        # request ids the reader derives from its name
        if not any(case.path.name in line or f"'{case.path.stem}-" in line for line in lines):
            return "the error does not name the input"
        if max(map(len, lines)) > 2000:
            return "an error line of more than 2,000 characters"
    if before != after and not (case.is_output and code == 0):
        return "the input file was changed"
    return None


# ---------------------------------------------------------------------------------------------- mutations

WEIRD: tuple = (None, True, False, "", "x", "\u202e\x00\U0001f4a5", "\x1b[2J", "12", "nan", -1, 0, 1, 2 ** 63,
                10 ** 400, 1e308, -1e308, 1.5, math.nan, math.inf, -math.inf, [], {}, [1, 2], {"a": 1}, "9" * 400)


def weird(rng: random.Random):
    return rng.choice(WEIRD)


def mutate_tree(rng: random.Random, root, extra_values: tuple = ()) -> str:
    """Change one place in a JSON- or pickle-shaped tree, in place (a random walk down from the root picks it).
    Returns what was done."""
    node, trail = root, "root"
    for _ in range(12):
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) \
            if isinstance(node, list) else []
        if not children:
            break
        key, child = rng.choice(children)
        if isinstance(child, (dict, list)) and child and rng.random() < 0.7:
            node, trail = child, f"{trail}[{key!r}]"
            continue
        op = rng.choice(("drop", "retype", "retype", "retype", "rename", "add"))
        if op == "drop":
            del node[key]
        elif op == "retype":
            node[key] = rng.choice(WEIRD + extra_values)
        elif op == "rename" and isinstance(node, dict):
            node[f"{key}_{rng.randrange(9)}" if rng.random() < 0.5 else str(key).upper()] = node.pop(key)
        elif isinstance(node, dict):
            node[rng.choice(("extra", "\u00e9t\u00e9", "size", "action"))] = weird(rng)
        else:
            node.insert(rng.randrange(len(node) + 1), weird(rng))
        return f"{op} {trail}[{key!r}]"
    return "none"


def mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    op = rng.choice(("truncate", "flip", "flip", "insert", "delete", "empty", "append"))
    n = len(data)
    if op == "truncate" and n:
        cut = rng.randrange(n)
        return data[:cut], f"truncate at {cut}"
    if op == "flip" and n:
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(n)] = rng.randrange(256)
        return bytes(out), "flip bytes"
    if op == "insert":
        at = rng.randrange(n + 1)
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + data[at:], f"insert at {at}"
    if op == "delete" and n:
        at = rng.randrange(n)
        return data[:at] + data[at + rng.randint(1, 64):], f"delete at {at}"
    if op == "append":
        return data + rng.choice((b"\x00" * 64, "\U0001f4a5\n".encode(), b"\xff\xfe", b"\n" * 5)), "append junk"
    return b"", "empty"


def mutate_lines(rng: random.Random, text: str) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    if not lines:
        return text, "none"
    i = rng.randrange(len(lines))
    op = rng.choice(("duplicate", "drop", "swap", "number", "number", "number", "unicode", "long"))
    if op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "drop":
        del lines[i]
    elif op == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "number":  # one number on a line that has one: huge, zero, negative, NaN, inf, 400 digits
        import re

        numbered = [k for k, line in enumerate(lines) if re.search(r"\d", line)]
        if numbered:
            i = rng.choice(numbered)
            spans = [m.span() for m in re.finditer(r"\d+(\.\d+)?", lines[i])]
            a, b = rng.choice(spans)
            value = rng.choice(("0", "0.0", "-1", "nan", "NaN", "inf", "1e30", "9" * 400, "1e-300", "\u0663", "x"))
            lines[i] = lines[i][:a] + value + lines[i][b:]
    elif op == "unicode":
        lines[i] = lines[i][: len(lines[i]) // 2] + "\u202e\U0001f4a5\x1b[2J" + lines[i][len(lines[i]) // 2:]
    else:
        lines[i] = lines[i].rstrip("\n") + "a" * 100_000 + "\n"
    return "".join(lines), f"{op} line {i + 1}"


def mutate_json_text(rng: random.Random, text: str, *, lines: bool) -> tuple[str, str]:
    """A JSON document (or one line of a JSON-lines file): a tree mutation, a duplicated key, deep nesting."""
    rows = text.splitlines() if lines else [text]
    i = rng.randrange(len(rows))
    try:
        obj = json.loads(rows[i])
    except ValueError:
        return text, "none"
    op = rng.random()
    if op < 0.08:
        rows[i] = "[" * 50_000 + "]" * 50_000 if rng.random() < 0.5 else '{"a":' * 20_000 + "1" + "}" * 20_000
        what = "deep nesting"
    elif op < 0.16 and isinstance(obj, dict) and obj:
        key = rng.choice(list(obj))
        rows[i] = rows[i].rstrip().rstrip("}") + f", {json.dumps(key)}: {json.dumps(weird(rng))}}}"
        what = f"duplicate key {key!r}"
    else:
        what = mutate_tree(rng, obj)
        rows[i] = json.dumps(obj)
    return "\n".join(rows) + ("\n" if lines else ""), f"{what} (line {i + 1})" if lines else what


# ---------------------------------------------------------------------------------------------- hostile pickles

def hostile_pickles() -> Iterator[tuple[str, bytes]]:
    """Pickles that make an unguarded unpickler or reader allocate or loop without bound."""
    yield "huge FRAME", b"\x80\x04\x95" + struct.pack("<Q", 1 << 60) + b"}."
    yield "huge BINBYTES8", b"\x80\x04" + b"\x8e" + struct.pack("<Q", 1 << 60) + b"abc."
    yield "huge BINUNICODE8", b"\x80\x04" + b"\x8d" + struct.pack("<Q", 1 << 62) + b"abc."
    yield "huge LONG4", b"\x80\x02" + b"\x8b" + struct.pack("<i", 1 << 30) + b"\x01."
    block = {"address": 1 << 20, "size": 512, "requested_size": 512, "state": "active_allocated"}
    blocks = [block] * 1000
    segment = {"device": 0, "address": 1 << 20, "total_size": 512 * 1000, "allocated_size": 512 * 1000,
               "active_size": 512 * 1000, "stream": 0, "segment_type": "small", "blocks": blocks}
    yield "shared-reference bomb (segments)", pickle.dumps({"segments": [segment] * 100_000, "device_traces": [[]]},
                                                           protocol=4)
    event = {"action": "alloc", "addr": 1 << 20, "size": 512, "stream": 0, "frames": [{}] * 1000}
    yield "shared-reference bomb (trace)", pickle.dumps({"segments": [], "device_traces": [[event] * 1_000_000]},
                                                        protocol=4)
    yield "deep nesting", _deep_list_pickle(100_000)


def _deep_list_pickle(depth: int) -> bytes:
    """``[[[...]]]`` ``depth`` deep, written by hand (``pickle.dumps`` itself would recurse too deep)."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


# ---------------------------------------------------------------------------------------------- the corpus

def shared(name: str) -> Path | None:
    from shared_data import real_data

    return real_data(name)


def snapshot_sources() -> list[Path]:
    found = [REPO / "data" / "snapshots" / "example.pickle"]
    folder = shared("snapshots")
    # the largest shared snapshot (2 MB) takes seconds a case: the smaller two are mutated
    found += sorted(p for p in folder.glob("*.pickle") if p.stat().st_size < 1_000_000) if folder else []
    return found


def log_sources(tmp: Path) -> list[Path]:
    found = sorted((REPO / "data" / "examples" / "server_logs").glob("*.log"))
    examples = shared("sglang_logs_examples.jsonl")
    if examples:
        for line in examples.read_text().splitlines():
            record = json.loads(line)
            lines = record.get("lines")
            if isinstance(lines, list) and lines:
                path = tmp / f"shared-{record['id']}.log"
                path.write_text("\n".join(map(str, lines)) + "\n")
                found.append(path)
        found.append(examples)  # not a log at all
    return found


def config_sources() -> list[Path]:
    return [REPO / "data" / "tiny-llama" / "config.json",
            *sorted((REPO / "data" / "examples" / "models").glob("*/config.json"))]


TRACE = REPO / "data" / "traces" / "mooncake_tiny.jsonl"
SWEEP_ARGS = ["--kv-pages", "30,40", "--eviction", "shortfall", "--workers", "1"]


def cases(rng: random.Random, count: int, tmp: Path) -> Iterator[Case]:
    """``count`` cases, the kinds in fixed shares (snapshots 30%, traces 25%, logs 25%, configs 10%, sweep
    files 10%), each on a fresh mutated copy in ``tmp``."""
    snapshots = snapshot_sources()
    originals = {p: pickle.loads(p.read_bytes()) for p in snapshots}  # our own trusted files
    logs = log_sources(tmp)
    log_for_config = REPO / "data" / "examples" / "server_logs" / "qwen3-235b-fp8-4xh100-sglang-0.4.9.log"
    configs = config_sources()
    traces = [TRACE, REPO / "data" / "traces" / "mooncake_small.jsonl"]
    sweep_file = tmp / "sweep-original.csv"
    hostile = list(hostile_pickles())
    for n in range(count):
        share = n % 20
        name = f"case{n:05d}"
        if share < 6:  # snapshots
            source = rng.choice(snapshots)
            path = tmp / f"{name}.pickle"
            pick = rng.random()
            if pick < 0.04:
                what, data = hostile[n % len(hostile)]
            elif pick < 0.4:
                data, what = mutate_bytes(rng, source.read_bytes())
            else:
                obj = _copy(originals[source])
                what = mutate_tree(rng, obj, extra_values=(b"\x00", (1, 2), {1, 2}, frozenset(), 3 + 4j))
                data = pickle.dumps(obj, protocol=rng.randint(2, 5))
            path.write_bytes(data)
            what_if = rng.choice(([], ["--what-if", "expandable_segments=False"],
                                  ["--what-if", "max_split_size_mb=20", "--what-if", "roundup_power2_divisions=4"]))
            yield Case("snapshot", f"{source.name}: {what}", ["replay", str(path), "--json", *what_if], path)
        elif share < 11:  # traces
            source = TRACE if rng.random() < 0.8 else traces[1]
            path = tmp / f"{name}.jsonl"
            text = source.read_text()
            if rng.random() < 0.3:
                data, what = mutate_bytes(rng, text.encode())
                path.write_bytes(data)
            else:
                text, what = (mutate_json_text(rng, text, lines=True) if rng.random() < 0.7
                              else mutate_lines(rng, text))
                path.write_text(text)
            extra = ["--kv-pages", "60"] if rng.random() < 0.5 else []
            yield Case("trace", f"{source.name}: {what}", ["simulate", "--trace", str(path), "--json", *extra], path)
        elif share < 16:  # start-up logs
            source = rng.choice(logs)
            path = tmp / f"{name}.log"
            if rng.random() < 0.3:
                data, what = mutate_bytes(rng, source.read_bytes())
                path.write_bytes(data)
            else:
                text, what = mutate_lines(rng, source.read_text(errors="replace"))
                for _ in range(rng.randint(0, 2)):
                    text, more = mutate_lines(rng, text)
                    what += f", {more}"
                path.write_text(text)
            yield Case("log", f"{source.name}: {what}", ["explain-log", str(path), "--json"], path)
        elif share < 18:  # configs
            source = rng.choice(configs)
            path = tmp / f"{name}-config.json"
            if rng.random() < 0.25:
                data, what = mutate_bytes(rng, source.read_bytes())
                path.write_bytes(data)
            else:
                text, what = mutate_json_text(rng, source.read_text(), lines=False)
                path.write_text(text)
            log = log_for_config if "qwen" in str(source) else REPO / "data" / "examples" / "server_logs" / \
                "llama-3.1-8b-h100-sglang-0.5.23.log"
            yield Case("config", f"{source.parent.name}/config.json: {what}",
                       ["explain-log", str(log), "--model-config", str(path), "--json"], path)
        else:  # sweep files, resumed
            if not sweep_file.exists():
                yield Case("sweep", "the original", ["sweep", "--trace", str(TRACE), *SWEEP_ARGS, "--out",
                                                     str(sweep_file)], sweep_file, is_output=True)
                continue
            path = tmp / f"{name}.csv"
            text = sweep_file.read_text()
            if rng.random() < 0.3:
                data, what = mutate_bytes(rng, text.encode())
                path.write_bytes(data)
            else:
                text, what = _mutate_csv(rng, text)
                path.write_text(text)
            yield Case("sweep", what, ["sweep", "--trace", str(TRACE), *SWEEP_ARGS, "--out", str(path)], path,
                       is_output=True)


def _mutate_csv(rng: random.Random, text: str) -> tuple[str, str]:
    lines = text.splitlines()
    if rng.random() < 0.3:
        out, what = mutate_lines(rng, text)
        return out, what
    i = rng.randrange(len(lines))
    cells = lines[i].split(",")
    j = rng.randrange(len(cells))
    cells[j] = rng.choice(("", "nan", "inf", "-1", "1e400", "9" * 400, "\U0001f4a5", '"', "1.5", "x,y"))
    lines[i] = ",".join(cells)
    return "\n".join(lines) + "\n", f"cell {i + 1}:{j + 1}"


def _copy(obj):
    return pickle.loads(pickle.dumps(obj))


def run(count: int, seed: int, tmp: Path, *, on_case: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run ``count`` cases; every outcome (a problem or not) in order."""
    rng = random.Random(seed)
    worker = Worker()
    outcomes = []
    try:
        for case in cases(rng, count, tmp):
            before = sha(case.path)
            code, err = worker.run(case.argv)
            outcome = Outcome(case, code, err, check(case, code, err, before, sha(case.path)))
            outcomes.append(outcome)
            if on_case is not None:
                on_case(outcome)
            if case.path.name.startswith("case") and outcome.problem is None:
                case.path.unlink(missing_ok=True)
    finally:
        worker.stop()
    return outcomes
