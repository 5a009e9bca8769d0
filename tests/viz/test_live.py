"""LiveFigure: the synced widget state is always the whole current figure.

plotly's FigureWidget keeps the figure it was built with in its synced state and sends later edits as one-off
messages, so a view that attaches later (Voila, a reload, saved widget state) drew the first figure. These
tests read the state a newly attaching view (or nbclient's saved widget state) gets, never the Python object.
"""

import json

import nbformat
import plotly.graph_objects as go
import pytest

from kvlab.experiments import kv_pool_sizing
from kvlab.notebook_exec import execute_notebook
from kvlab.viz import plots
from kvlab.viz.live import LiveFigure, PlotlyJS, library

GIB = float(1 << 30)


def _synced(w: LiveFigure) -> dict:
    """The state a view attaching now receives (ipywidgets' serialised state, as sent on the wire)."""
    return json.loads(json.dumps(w.get_state()))


def test_draw_replaces_the_synced_figure_whole():
    w = LiveFigure(go.Figure(go.Scatter(x=[0, 1], y=[1, 2], name="a")))
    w.draw(go.Figure([go.Bar(x=["p", "q", "r"], y=[3, 4, 5], name="b")]).update_layout(title="two"))
    state = _synced(w)
    assert [(t["type"], t["x"], t["y"]) for t in state["_widget_data"]] == [("bar", ["p", "q", "r"], [3, 4, 5])]
    assert state["_widget_layout"]["title"]["text"] == "two"
    assert list(w.data[0].y) == [3, 4, 5] and w.figure.layout.title.text == "two"


def test_state_is_the_figures_json_and_numpy_arrays_travel_as_plotly_base64():
    import numpy as np

    fig = go.Figure(go.Scatter(x=np.arange(4), y=np.array([0.5, 1.5, 2.5, 3.5])))
    w = LiveFigure(fig)
    assert _synced(w)["_widget_data"] == json.loads(fig.to_json())["data"]
    assert _synced(w)["_widget_data"][0]["y"]["dtype"] == "f8"  # plotly.js decodes {dtype, bdata}


def test_every_figure_shares_one_plotly_js_and_the_module_is_small():
    a, b = LiveFigure(), LiveFigure()
    assert a._plotly is b._plotly is library() and isinstance(library(), PlotlyJS)
    assert library().source.startswith("/**\n* plotly.js v") and len(library().source) > 1_000_000
    assert _synced(a)["_plotly"] == f"IPY_MODEL_{library().model_id}"
    assert len(a._esm) < 10_000 and a._plotly_version == library().version


def test_on_a_page_that_brings_plotly_js_the_source_is_sent_only_when_a_view_asks(monkeypatch):
    """kvlab app --workshop (KVLAB_PAGE_PLOTLY=1): the page loads plotly.js as a file; 4.8 MB in the widget state
    held every page's live panel up. A view that finds no plotly.js on the page asks for it."""
    import kvlab.viz.live as live

    monkeypatch.setenv(live.PAGE_PLOTLY_ENV, "1")
    monkeypatch.setattr(live, "_LIBRARY", None)
    lib = library()
    assert lib.source == "" and lib.version and len(json.dumps(_synced(LiveFigure()))) < 20_000
    lib._on_request(lib, {"send": "source"}, [])
    assert lib.source.startswith("/**\n* plotly.js v")
    assert "change:source" in LiveFigure._esm and "kvlab.page.plotly" in LiveFigure._esm  # the view's side
    monkeypatch.setattr(live, "_LIBRARY", None)  # the next test's library is a whole one again


def test_a_key_redraws_from_cache_without_building_again():
    w = LiveFigure()
    built = []

    def build(n):
        built.append(n)
        return go.Figure(go.Scatter(x=list(range(n)), y=list(range(n))))

    w.draw(lambda: build(3), key="three")
    w.draw(lambda: build(3), key="three")  # drawn already: nothing to do
    w.draw(lambda: build(5), key="five")
    w.draw(lambda: build(3), key="three")  # back: from the cache
    assert built == [3, 5] and len(_synced(w)["_widget_data"][0]["x"]) == 3 and w.key == "three"
    w.draw(build(2))  # no key: always drawn
    assert len(_synced(w)["_widget_data"][0]["x"]) == 2 and w.key is None


def test_draw_refuses_what_is_not_a_figure():
    w = LiveFigure()
    with pytest.raises(TypeError, match="expected a plotly go.Figure, got dict"):
        w.draw({"data": []})
    with pytest.raises(TypeError, match="expected a plotly go.Figure, got list"):
        w.draw(lambda: [], key="k")


@pytest.mark.slow
def test_kv_pool_panel_state_follows_the_toggle():
    from kvlab.viz.widgets import KVPoolPanel

    panel = KVPoolPanel("llama-8b-l4")
    for gc in (True, False, True):
        panel.gc_toggle.value = gc
        expected = kv_pool_sizing.run("llama-8b-l4", gc_before_measure=gc)
        waterfall = _synced(panel.waterfall)["_widget_data"][0]
        assert sum(waterfall["y"]) == pytest.approx(expected.budget.rest_bytes / GIB, abs=1e-3)
        assert waterfall["x"] == [name for name, _ in expected.budget_terms()] + ["KV pool budget"]
    timelines = _synced(panel.timelines)["_widget_data"]
    assert len(timelines) == 2 * plots.TRACES_PER_TIMELINE and all(len(t["x"]) >= 2 for t in timelines)


@pytest.mark.slow
def test_headless_run_saves_the_panels_current_figures(tmp_path):
    """What ``kvlab report`` and ``jupyter nbconvert --execute`` keep: nbclient's saved widget state holds the
    figures as they were at the end of the run (not as the panel was built), and the report's static export
    draws them."""
    from kvlab.viz.export import static_widget_outputs

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('from kvlab.viz.widgets import KVPoolPanel\n'
                                          'panel = KVPoolPanel("llama-8b-l4")\npanel.widget'),
                nbformat.v4.new_code_cell("panel.gc_toggle.value = False")]
    nbformat.write(nb, tmp_path / "panel.ipynb")
    nb = execute_notebook(tmp_path / "panel.ipynb", timeout=300)
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    by_class = {c: m["state"] for m in states.values() for c in m["state"].get("_dom_classes", [])}
    no_gc = kv_pool_sizing.run("llama-8b-l4", gc_before_measure=False)
    waterfall = by_class["kvlab-waterfall"]
    assert sum(waterfall["_widget_data"][0]["y"]) == pytest.approx(no_gc.budget.rest_bytes / GIB, abs=1e-3)
    assert waterfall["_widget_layout"]["title"]["text"].startswith("KV budget without gc.collect()")
    assert all(len(t["x"]) >= 2 for t in by_class["kvlab-timelines"]["_widget_data"])
    assert f"data-max-total-num-tokens='{no_gc.max_total_num_tokens}'" in by_class["kvlab-verdict"]["value"]

    html = "".join(o.get("data", {}).get("text/html", "") for c in static_widget_outputs(nb).cells
                   for o in c.get("outputs", []))
    assert html.count("plotly-graph-div") >= 2 and "KV budget without gc.collect()" in html


def test_static_export_keeps_pasted_text_as_text():
    """A panel's text areas in the static report: the pasted log as an escaped, scrolling <pre> with its line
    breaks (not one bold run-on line), an empty one as its placeholder, an upload button as its file count."""
    import ipywidgets as widgets

    from kvlab.viz.export import _widget_html

    log = widgets.Textarea(value="line one <b>\nline two", placeholder="paste a log")
    empty = widgets.Textarea(placeholder="or paste a config.json")
    upload = widgets.FileUpload(description="upload log")
    box = widgets.VBox([log, empty, upload])
    states = {w.model_id: {"model_name": w._model_name, "state": w.get_state()} for w in (log, empty, upload, box)}
    html = _widget_html(box.model_id, states)
    assert "<pre" in html and "line one &lt;b&gt;\nline two</pre>" in html
    assert "<i>or paste a config.json</i>" in html
    assert "upload log: <b>0 files</b>" in html
    assert "Textarea:" not in html
