"""Everything an executed notebook shows, as a flat list of comparable values, for Restart & Run All checks.

    diff = first_difference(notebook_values(run1), notebook_values(run2))
    assert diff is None, diff

``notebook_values`` walks every code cell's outputs (stream text, text/plain, text/html, text/markdown, error
tracebacks, plotly figure JSON) and the widget state nbclient stores in ``nb.metadata.widgets`` (FigureWidget
traces included: numbers drawn in figures count). Text becomes one value per line; JSON becomes one value per
leaf, with plotly's base64 typed arrays (``{"dtype", "bdata"}``) decoded to numbers. Each value carries the
index of the cell that showed it and where in that cell it sits, so a difference names its cell.

What legitimately varies between two runs and is not a result is normalised, nothing else:

* wall-clock durations in text (``ran in 3.0 s``), throughputs measured by the clock (``135 points/minute``,
  a sweep's cost) and tqdm's meters (``[00:01<00:02, 5.20it/s]``, its
  ``\\r``-separated redraws on stderr, and the counters a ``tqdm.notebook`` bar froze at when it closed, which
  depend on when its last redraw happened);
* memory addresses in Python's default reprs (``<Foo object at 0x7f...>``; other hex numbers, such as kvlab's
  simulated segment addresses, are results), uuids (plotly's trace ``uid``) and 32-hex ids, ipykernel's
  per-kernel cell file names in tracebacks;
* widget model ids: each model is renamed by the order in which a walk from the cell outputs reaches it
  (nbformat stores the models sorted by their random ids, so their stored order is no order).

Everything else, every digit of every float included, must match exactly.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import nbformat

from .nbrun import strip_ansi

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PLOTLY = "application/vnd.plotly.v1+json"
TEXT_MIMES = ("text/plain", "text/html", "text/markdown", "text/latex")
CODE_KEYS = frozenset({"_esm", "_css"})  # anywidget's JS/CSS bundle: code, compared verbatim without normalising

# CPython's default repr, "<Foo object at 0x7f3a2c1b4d90>": only after " at ", since kvlab's simulated allocator
# shows segment addresses such as 0x7f0000600000, which are results and must match
_ADDRESS = re.compile(r"(?<= at )0x[0-9a-fA-F]+\b")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b|\b[0-9a-f]{32}\b")
_IPYKERNEL_FILE = re.compile(r"/tmp/ipykernel_\d+/\d+\.py")
# "ran in 3.0 s", "took 12 ms", "elapsed 0.52 s": a duration right after a word that says it is one
_DURATION = re.compile(
    r"\b(ran in|took|elapsed:?|in)\s+\d+(?:[.,]\d+)?\s*(?:ns|µs|us|ms|s|sec|secs|seconds?|min|minutes?|h)\b"
)
# a rate measured by the wall clock: "1,234 points/minute" (kvlab sweep's cost line)
_CLOCK_RATE = re.compile(r"\b\d[\d,]*(?:\.\d+)?(?= points?/min(?:ute)?\b)")
# tqdm's meter: "[00:01<00:02, 5.20it/s]", "[00:00<?, ?req/s]", or without a total "[00:01, 3.90it/s]"
_TQDM_TIMES = re.compile(r"\[(?:\d+:)?\d+:\d+[<,][^\]]*\]")


@dataclass(frozen=True)
class Value:
    """One thing a notebook showed. ``cell``: index in ``nb.cells`` (None: a widget no output displays)."""

    cell: int | None
    where: str
    value: Any


def normalise_text(text: str) -> str:
    text = _IPYKERNEL_FILE.sub("<ipykernel cell>", strip_ansi(text))
    text = _ADDRESS.sub("<address>", text)
    text = _UUID.sub("<uuid>", text)
    text = _TQDM_TIMES.sub("[<tqdm times>]", text)
    text = _CLOCK_RATE.sub("<rate>", text)
    return _DURATION.sub(lambda m: f"{m.group(1)} <duration>", text)


def _stderr_without_progress(text: str) -> str:
    """Stderr with tqdm's text redraws (split by ``\\r`` or newlines) taken out; everything else kept."""
    kept = [part for part in re.split(r"[\r\n]", text) if part.strip() and not _TQDM_TIMES.search(part)]
    return "\n".join(kept)


def _text_values(cell: int, where: str, text: Any) -> Iterator[Value]:
    if isinstance(text, list):
        text = "".join(text)
    for number, line in enumerate(normalise_text(str(text)).splitlines()):
        yield Value(cell, f"{where} line {number}", line)


def _decode_typed_array(node: dict) -> list:
    """plotly's ``{"dtype": "f8", "bdata": "<base64>", "shape": "2, 3"}`` as a flat list of Python numbers."""
    import numpy as np

    return np.frombuffer(base64.b64decode(node["bdata"]), dtype=np.dtype(node["dtype"])).tolist()


def _json_leaves(node: Any, path: str, rename: dict[str, str] | None = None) -> Iterator[tuple[str, Any]]:
    """(path, leaf) for every leaf; typed arrays decoded; widget ids renamed through ``rename``."""
    if isinstance(node, dict):
        if isinstance(node.get("bdata"), str) and isinstance(node.get("dtype"), str):
            if "shape" in node:
                yield f"{path}.shape", node["shape"]
            node = _decode_typed_array(node)
        else:
            if not node:
                yield path, "{}"
            for key in sorted(node):
                sub = f"{path}.{key}"
                if key in CODE_KEYS:
                    yield sub, node[key]
                else:
                    yield from _json_leaves(node[key], sub, rename)
            return
    if isinstance(node, list):
        if not node:
            yield path, "[]"
        for index, item in enumerate(node):
            yield from _json_leaves(item, f"{path}[{index}]", rename)
        return
    if isinstance(node, str):
        if rename is not None:
            node = _rename_refs(node, rename)
        yield path, normalise_text(node)
        return
    yield path, node


def _rename_refs(text: str, rename: dict[str, str]) -> str:
    if text.startswith("IPY_MODEL_") and text[len("IPY_MODEL_"):] in rename:
        return "IPY_MODEL_" + rename[text[len("IPY_MODEL_"):]]
    return rename.get(text, text)


def _output_values(cell: int, number: int, out: dict, rename: dict[str, str]) -> Iterator[Value]:
    kind = out.get("output_type")
    where = f"output {number}"
    if kind == "stream":
        text = out.get("text", "")
        text = "".join(text) if isinstance(text, list) else text
        if out.get("name") == "stderr":
            text = _stderr_without_progress(text)
        yield from _text_values(cell, f"{where} {out.get('name')}", text)
        return
    if kind == "error":
        yield Value(cell, f"{where} error", f"{out.get('ename')}: {normalise_text(str(out.get('evalue')))}")
        yield from _text_values(cell, f"{where} traceback", "\n".join(out.get("traceback", [])))
        return
    data = out.get("data", {})
    for mime in sorted(data):
        content = data[mime]
        if mime in TEXT_MIMES or mime.startswith("text/"):
            yield from _text_values(cell, f"{where} {mime}", content)
        elif mime == WIDGET_VIEW:
            for path, leaf in _json_leaves(content, "", rename):
                yield Value(cell, f"{where} {mime}{path}", leaf)
        elif mime == PLOTLY or mime.endswith("json"):
            for path, leaf in _json_leaves(content, ""):
                yield Value(cell, f"{where} {mime}{path}", leaf)
        else:  # images and other binary payloads: compared whole
            yield Value(cell, f"{where} {mime}", content)


# ---------------------------------------------------------------------------------------------- widgets


def _widget_state(nb: nbformat.NotebookNode) -> dict[str, dict]:
    return dict(nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {}))


def _refs(node: Any, models: dict[str, dict]) -> Iterator[str]:
    """Model ids that ``node`` points at, in document order (``IPY_MODEL_<id>`` strings and bare ids)."""
    if isinstance(node, dict):
        for key in sorted(node):
            if key not in CODE_KEYS:
                yield from _refs(node[key], models)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item, models)
    elif isinstance(node, str):
        bare = node[len("IPY_MODEL_"):] if node.startswith("IPY_MODEL_") else node
        if bare in models:
            yield bare


def _walk_widgets(nb: nbformat.NotebookNode, models: dict[str, dict]) -> tuple[dict[str, str], dict[str, int]]:
    """Canonical names for the models (by the order a walk from the outputs reaches them) and their cells."""
    rename: dict[str, str] = {}
    home: dict[str, int] = {}

    def visit(model_id: str, cell: int) -> None:
        stack = [model_id]
        while stack:
            current = stack.pop()
            if current in rename:
                continue
            rename[current] = f"w{len(rename)}:{models[current].get('model_name', '?')}"
            home[current] = cell
            stack.extend(reversed(list(_refs(models[current].get("state", {}), models))))

    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for out in cell.get("outputs", []):
                for model_id in _refs(out.get("data", {}).get(WIDGET_VIEW, {}), models):
                    visit(model_id, index)
    return rename, home


def _tqdm_bars(models: dict[str, dict]) -> dict[str, str]:
    """The models of tqdm.notebook bars (an HBox of HTML, FloatProgress, HTML) -> their role in the bar."""
    roles: dict[str, str] = {}
    for model in models.values():
        state = model.get("state", {})
        children = [c[len("IPY_MODEL_"):] for c in state.get("children", []) if isinstance(c, str)]
        if state.get("_model_name") != "HBoxModel" or len(children) != 3 or any(c not in models for c in children):
            continue
        names = [models[c].get("state", {}).get("_model_name") for c in children]
        if names == ["HTMLModel", "FloatProgressModel", "HTMLModel"]:
            roles.update(zip(children, ("tqdm description", "tqdm bar", "tqdm meter")))
    return roles


_TQDM_PERCENT = re.compile(r"[\s\u2007]*\d+%$")


def _normalise_tqdm(state: dict, role: str) -> dict:
    """A closed tqdm.notebook bar froze at its last redraw (timing): keep its description, drop the counters.

    On close, tqdm sets the bar's ``value`` to the final count, which is a result and stays; the percentage
    after the description and the right-hand meter (count, times, rate) are from whenever the last redraw ran.
    """
    state = dict(state)
    if role == "tqdm description":
        state["value"] = _TQDM_PERCENT.sub("", str(state.get("value", "")))
    elif role == "tqdm meter":
        state["value"] = "<tqdm meter>"
    return state


def _widget_values(nb: nbformat.NotebookNode, models: dict[str, dict], rename: dict[str, str],
                   home: dict[str, int]) -> Iterator[Value]:
    tqdm = _tqdm_bars(models)
    ordered = sorted(rename, key=lambda model_id: int(rename[model_id].split(":")[0][1:]))
    for model_id in ordered:
        model = models[model_id]
        state = model.get("state", {})
        if model_id in tqdm:
            state = _normalise_tqdm(state, tqdm[model_id])
        body = {k: v for k, v in model.items() if k != "state"} | {"state": state}
        for path, leaf in _json_leaves(body, "", rename):
            yield Value(home[model_id], f"widget {rename[model_id]}{path}", leaf)
    # Models no output displays (e.g. kept alive by Python only): compared as a set of contents.
    unreached = [model for model_id, model in models.items() if model_id not in rename]
    flattened = sorted(
        (repr(list(_json_leaves(model, "", rename))), model.get("model_name", "?")) for model in unreached
    )
    for number, (leaves, name) in enumerate(flattened):
        yield Value(None, f"undisplayed widget {number}:{name}", leaves)


# ---------------------------------------------------------------------------------------------- API


def coalesce_streams(outputs: list[dict]) -> list[dict]:
    """Consecutive stream outputs of one name merged into one, as JupyterLab shows them.

    The kernel flushes stdout on a timer, so one ``print`` can reach the notebook as two messages ("text" and
    "\\n") on a loaded machine and as one on an idle one; the numbers printed are the same either way.
    """
    merged: list[dict] = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (out.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream"
                and prev.get("name") == out.get("name")):
            text = out.get("text", "")
            prev_text = prev.get("text", "")
            merged[-1] = {**prev, "text": ("".join(prev_text) if isinstance(prev_text, list) else prev_text)
                          + ("".join(text) if isinstance(text, list) else text)}
        else:
            merged.append(out)
    return merged


def notebook_values(nb: nbformat.NotebookNode) -> list[Value]:
    """Every output value of ``nb`` (cells in order) followed by its widget state, normalised."""
    models = _widget_state(nb)
    rename, home = _walk_widgets(nb, models)
    values: list[Value] = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for number, out in enumerate(coalesce_streams(cell.get("outputs", []))):
                values.extend(_output_values(index, number, out, rename))
    values.extend(_widget_values(nb, models, rename, home))
    return values


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _show(value: Any, around: int | None = None, width: int = 160) -> str:
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= width:
        return repr(text) if isinstance(value, str) else text
    start = max(0, (around or 0) - width // 2)
    clip = text[start:start + width]
    return f"{'…' if start else ''}{clip!r}{'…' if start + width < len(text) else ''} (chars {start}.. of {len(text)})"


def _first_char_difference(a: str, b: str) -> int:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return min(len(a), len(b))


def _cell_line(nb: nbformat.NotebookNode | None, cell: int | None) -> str:
    if nb is None or cell is None or not 0 <= cell < len(nb.cells):
        return ""
    lines = [line for line in nb.cells[cell].source.splitlines() if line.strip()]
    return f"\n  cell {cell} starts: {lines[0][:120]!r}" if lines else ""


def _only_in(extra: Value, name: str, nb: nbformat.NotebookNode | None) -> str:
    where = f"cell {extra.cell}" if extra.cell is not None else "widget state"
    shown = {name: _show(extra.value), ("run 2" if name == "run 1" else "run 1"): "nothing there"}
    return (f"{where}, {extra.where}:\n  run 1: {shown['run 1']}\n  run 2: {shown['run 2']}"
            f"{_cell_line(nb, extra.cell)}")


def first_difference(run1: list[Value], run2: list[Value], nb: nbformat.NotebookNode | None = None) -> str | None:
    """None when the runs showed the same values; else a message naming the first difference.

    ``nb`` (either run) adds the first line of the differing cell's source to the message.
    """
    for index, (a, b) in enumerate(zip(run1, run2)):
        if a.cell != b.cell or a.where != b.where:
            # One run shows something the other does not (at least not here): name that one.
            if (a.cell, a.where) in {(v.cell, v.where) for v in run2[index:]}:
                return _only_in(b, "run 2", nb)
            return _only_in(a, "run 1", nb)
        if not _same(a.value, b.value):
            at = (_first_char_difference(a.value, b.value)
                  if isinstance(a.value, str) and isinstance(b.value, str) else None)
            where = f"cell {a.cell}" if a.cell is not None else "widget state"
            return (f"{where}, {a.where}:\n  run 1: {_show(a.value, at)}\n  run 2: {_show(b.value, at)}"
                    f"{_cell_line(nb, a.cell)}")
    if len(run1) > len(run2):
        return _only_in(run1[len(run2)], "run 1", nb)
    if len(run2) > len(run1):
        return _only_in(run2[len(run1)], "run 2", nb)
    return None
