"""The Restart & Run All comparison (nbvalues.py) ignores what is not a result and nothing else.

Synthetic executed notebooks, no kernel: two runs that differ only in timings, ids and addresses compare
equal; a single changed number anywhere (text, HTML table, figure JSON, widget state) is reported with its
cell and both values.
"""

from __future__ import annotations

import base64
import copy
import uuid

import nbformat
import numpy as np
import pytest

from .nbvalues import WIDGET_STATE, WIDGET_VIEW, first_difference, notebook_values

SEGMENT = "0x7f0000600000"  # kvlab's simulated allocator address: a result


def _ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def _widgets(ids: list[str], *, trace_y: list[float], bar_value: float, percent: int, meter: str,
             trace_uid: str) -> dict:
    """A VBox holding a FigureWidget (anywidget) and a tqdm.notebook bar (HBox of HTML, FloatProgress, HTML)."""
    vbox, fig, bar, left, progress, right = ids
    ref = "IPY_MODEL_{}".format
    def model(name, **state):
        return {"model_module": "m", "model_module_version": "1", "model_name": name,
                                       "state": {"_model_name": name, **state}}
    state = {
        vbox: model("VBoxModel", children=[ref(fig), ref(bar)]),
        fig: model("AnyModel", _esm="export default {}", _widget_data=[
            {"type": "bar", "uid": trace_uid, "y": {"dtype": "f8", "bdata": base64.b64encode(
                np.asarray(trace_y, dtype="f8").tobytes()).decode()}}]),
        bar: model("HBoxModel", children=[ref(left), ref(progress), ref(right)]),
        left: model("HTMLModel", value=f"simulate\u2007(full):\u2007{percent}%"),
        progress: model("FloatProgressModel", value=bar_value, max=128.0),
        right: model("HTMLModel", value=meter),
    }
    # nbformat writes the models sorted by id: their order carries no meaning
    return {WIDGET_STATE: {"state": dict(sorted(state.items())), "version_major": 2, "version_minor": 0}}


def _notebook(*, seconds: float = 3.0, address: str = "0x7f3a2c1b4d90", hit_rate: float = 0.41636,
              segment: str = SEGMENT, trace_y: tuple = (1.5, 2.25), bar_value: float = 128.0, percent: int = 53,
              meter: str = "68/128 [00:00<00:00, 656.69req/s]", stderr: str = "", extra: bool = False):
    nb = nbformat.v4.new_notebook()
    ids = _ids(6)
    out = nbformat.v4.new_output
    cells = [
        nbformat.v4.new_code_cell("print(...)", outputs=[
            out("stream", name="stdout", text=f"notebook 00 ran in {seconds} s on sim:h200\n"),
            out("stream", name="stderr", text=f"simulate: {percent}%|#####| {percent}/100 [00:0{int(seconds)}<00:01,"
                                              f" 12.{percent}it/s]\r" + stderr)]),
        nbformat.v4.new_code_cell("frame", outputs=[out("execute_result", execution_count=2, data={
            "text/plain": f"<kvlab.Thing object at {address}>\nsegment {segment}",
            "text/html": f"<table>\n<tr><td>hit_rate</td><td>{hit_rate}</td></tr>\n</table>"})]),
        nbformat.v4.new_code_cell("fig.show()", outputs=[out("display_data", data={
            "application/vnd.plotly.v1+json": {"data": [{"y": list(trace_y), "uid": str(uuid.uuid4())}],
                                                "layout": {"title": {"text": "hits"}}}})]),
        nbformat.v4.new_code_cell("panel", outputs=[out("execute_result", execution_count=4, data={
            WIDGET_VIEW: {"model_id": ids[0], "version_major": 2, "version_minor": 0}, "text/plain": "VBox(...)"})]),
    ]
    if extra:
        cells.append(nbformat.v4.new_code_cell("print(1)", outputs=[out("stream", name="stdout", text="1\n")]))
    nb.cells = cells
    nb.metadata["widgets"] = _widgets(ids, trace_y=list(trace_y), bar_value=bar_value, percent=percent,
                                      meter=meter, trace_uid=str(uuid.uuid4()))
    return nb


def _diff(run1, run2) -> str | None:
    return first_difference(notebook_values(run1), notebook_values(run2), run1)


def test_timings_ids_addresses_and_progress_are_not_results():
    run1 = _notebook()
    run2 = _notebook(seconds=5.0, address="0x7f99aa001122", percent=76, meter="97/128 [00:01<00:00, 969.81req/s]")
    assert _diff(run1, run2) is None
    assert _diff(run1, copy.deepcopy(run1)) is None


def test_a_sweeps_clock_rate_is_not_a_result_but_its_point_count_is():
    from .nbvalues import normalise_text

    one = normalise_text("36 points: 36 computed on local × 2, took 43.2 s, 50 points/minute")
    assert one == normalise_text("36 points: 36 computed on local × 2, took 12.0 s, 1,234 points/minute")
    assert one != normalise_text("35 points: 35 computed on local × 2, took 43.2 s, 50 points/minute")


@pytest.mark.parametrize("change, cell, values", [
    ({"hit_rate": 0.41637}, 1, ("0.41636", "0.41637")),
    ({"segment": "0x7f0000800000"}, 1, (SEGMENT, "0x7f0000800000")),
    ({"trace_y": (1.5, 2.5)}, 2, ("2.25", "2.5")),
    ({"bar_value": 127.0}, 3, ("128.0", "127.0")),  # tqdm's final count is kept: only its redraw text varies
    ({"stderr": "UserWarning: something\n"}, 0, ("UserWarning: something",)),
])
def test_one_changed_value_is_reported_with_its_cell_and_both_values(change, cell, values):
    message = _diff(_notebook(), _notebook(**change))
    assert message is not None and message.startswith(f"cell {cell}"), message
    for value in values:
        assert value in message, message
    assert f"cell {cell} starts:" in message


def test_a_number_drawn_only_in_a_widget_figure_counts():
    """The FigureWidget's trace is in the widget state alone; a change there is found and named."""
    run1, run2 = _notebook(), _notebook()
    state2 = run2.metadata["widgets"][WIDGET_STATE]["state"]
    fig = next(m for m in state2.values() if m["model_name"] == "AnyModel")
    fig["state"]["_widget_data"][0]["y"]["bdata"] = base64.b64encode(np.asarray([1.5, 2.0]).tobytes()).decode()
    message = _diff(run1, run2)
    assert message is not None and "w1:AnyModel.state._widget_data[0].y[1]" in message, message
    assert "2.25" in message and "2.0" in message and message.startswith("cell 3"), message


def test_an_extra_output_is_reported():
    message = _diff(_notebook(), _notebook(extra=True))
    assert message is not None and message.startswith("cell 4") and "run 1: nothing there" in message, message


def test_a_print_split_into_two_stream_messages_equals_one():
    """A loaded kernel may flush "text" and "\\n" of one print as two stream outputs: the same printed numbers."""
    one, two = _notebook(), _notebook()
    cell = next(c for c in two.cells if c.cell_type == "code" and c.outputs)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="pool 1,890 tokens"),
                    nbformat.v4.new_output("stream", name="stdout", text="\n")]
    cell1 = next(c for c in one.cells if c.cell_type == "code" and c.outputs)
    cell1.outputs = [nbformat.v4.new_output("stream", name="stdout", text="pool 1,890 tokens\n")]
    assert _diff(one, two) is None
    cell.outputs[1] = nbformat.v4.new_output("stream", name="stdout", text=" 2\n")
    message = _diff(one, two)
    assert message is not None and "1,890 tokens 2" in message, message
