"""``LiveFigure``: the one way panels show a plotly figure that changes.

Why not plotly's ``go.FigureWidget``: it syncs its figure (``_widget_data`` / ``_widget_layout``) to the
frontend once, when it is built; every later change (``batch_update``, ``trace.x = ...``, ``update_layout``)
is sent as a one-off restyle/relayout *message* to the views open at that moment, and the synced state keeps
the first figure. A view that attaches later — Voila (it draws after the notebook ran), JupyterLab after a
reload, a second tab, an executed notebook's saved widget state — draws that first figure (for a panel built
empty: nothing) and then applies later diffs to it.

A ``LiveFigure`` has no messages: its synced state *is* the figure. ``draw(fig)`` replaces it whole with the
JSON of a figure built from data by the pure functions in :mod:`kvlab.viz.plots`, and every view draws
exactly that state with ``Plotly.react`` (when it attaches and on every change), so all views, early or late,
show the current figure. The state keeps FigureWidget's names (``_widget_data``, ``_widget_layout``,
``_config``), so tools that read saved widget state (e.g. ``kvlab report``'s static pages) read it as before.

plotly.js itself (about 4.8 MB, plotly.py's own bundled copy) is synced once per kernel, by a view-less
:class:`PlotlyJS` widget that every ``LiveFigure`` references; the figure's module is a few lines.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import anywidget
import ipywidgets as widgets
import plotly.graph_objects as go
import traitlets

_ESM = r"""
// Load plotly.js once per page (per version) from the kvlab PlotlyJS widget model this figure references.
const CACHE = Symbol.for("kvlab.plotly.js");
const PAGE = Symbol.for("kvlab.page.plotly");

async function libraryModel(model) {
  const ref = model.get("_plotly");
  const id = typeof ref === "string" ? ref.replace(/^IPY_MODEL_/, "") : ref && ref.model_id;
  // A restored page may create the models in any order: wait (up to 30 s) for the library's model.
  const deadline = Date.now() + 30000;
  for (let delay = 25; ; delay = Math.min(2 * delay, 500)) {
    try {
      return await model.widget_manager.get_model(id);
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }
}

function loadPlotly(model) {
  const cache = (globalThis[CACHE] = globalThis[CACHE] || new Map());
  const version = model.get("_plotly_version");
  if (!cache.has(version)) {
    const loading = (async () => {
      const page = globalThis[PAGE];  // the kvlab-app page's plotly.js, when it loads one (kvlab app --workshop)
      if (page) {
        const Plotly = await page.catch(() => null);
        if (Plotly && Plotly.version === version) return Plotly;
      }
      const lib = await libraryModel(model);
      if (!lib.get("source")) {  // sent on request only (KVLAB_PAGE_PLOTLY: the page was to bring plotly.js)
        const arrived = new Promise((resolve) => lib.once("change:source", resolve));
        lib.send({ send: "source" });
        await arrived;
      }
      // plotly.min.js is a UMD bundle: give it a CommonJS `module` to fill, and no AMD `define`.
      const source = ["const module = {exports: {}}; const exports = module.exports; const define = undefined;\n",
                      lib.get("source"),
                      "\nexport default module.exports.react ? module.exports : globalThis.Plotly;\n"];
      const url = URL.createObjectURL(new Blob(source, {type: "text/javascript"}));
      try {
        return (await import(url)).default;
      } finally {
        URL.revokeObjectURL(url);
      }
    })();
    loading.catch(() => cache.delete(version));
    cache.set(version, loading);
  }
  return cache.get(version);
}

async function render({ model, el }) {
  const Plotly = await loadPlotly(model);
  const gd = document.createElement("div");
  el.classList.add("kvlab-live-figure");
  el.appendChild(gd);
  let drawing = Promise.resolve();
  let queued = false;
  const draw = () => {
    // Copies: plotly.js writes into what it is given, and the model's state must stay what Python sent.
    const data = structuredClone(model.get("_widget_data"));
    const layout = structuredClone(model.get("_widget_layout"));
    if (!layout.height) layout.height = 360;
    return Plotly.react(gd, data, layout, structuredClone(model.get("_config")));
  };
  const redraw = () => {  // one draw for the traits that change together, after the one before it
    if (queued) return;
    queued = true;
    el.classList.add("kvlab-drawing");  // the old figure greyed out (kvlab.viz.widgets.PANEL_CSS) until redrawn
    drawing = drawing.then(() => { queued = false; return draw(); }).catch((err) => console.error(err))
      .finally(() => { if (!queued) el.classList.remove("kvlab-drawing"); });
  };
  model.on("change:_widget_data", redraw);
  model.on("change:_widget_layout", redraw);
  model.on("change:_config", redraw);
  const resize = new ResizeObserver(() => {  // a figure without a set width follows its container
    if (gd.layout && !model.get("_widget_layout").width && gd.clientWidth > 0) {
      Promise.resolve(Plotly.Plots.resize(gd)).catch(() => {});
    }
  });
  resize.observe(el);
  drawing = Promise.resolve(draw());
  await drawing;
  return () => {
    resize.disconnect();
    Plotly.purge(gd);
  };
}

export default { render };
"""


class PlotlyJS(anywidget.AnyWidget):
    """plotly.js for the LiveFigures of this kernel, as a view-less widget (created once, see :func:`library`)."""

    _esm = "export default {};"
    source = traitlets.Unicode().tag(sync=True)
    version = traitlets.Unicode().tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_msg(self._on_request)

    def _on_request(self, _widget, content, _buffers) -> None:
        """A view that found ``source`` empty asks for it (``{"send": "source"}``)."""
        if isinstance(content, dict) and content.get("send") == "source" and not self.source:
            from plotly.offline import get_plotlyjs

            self.source = get_plotlyjs()


_LIBRARY: PlotlyJS | None = None
PAGE_PLOTLY_ENV = "KVLAB_PAGE_PLOTLY"  # "1": the page brings plotly.js (kvlab.app, workshop mode)


def library() -> PlotlyJS:
    """The kernel's :class:`PlotlyJS` widget (made on first use, again if it was closed)."""
    global _LIBRARY
    if _LIBRARY is None or _LIBRARY.comm is None:
        from plotly.offline import get_plotlyjs, get_plotlyjs_version

        # kvlab app --workshop: the page loads plotly.js as a file; 4.8 MB in every page's widget state would
        # hold the live panel up. A view that finds no plotly.js on the page asks for the source.
        lazy = os.environ.get(PAGE_PLOTLY_ENV) == "1"
        _LIBRARY = PlotlyJS(source="" if lazy else get_plotlyjs(), version=get_plotlyjs_version())
    return _LIBRARY


def figure_state(fig: go.Figure) -> dict[str, Any]:
    """What a LiveFigure syncs for ``fig``: its plotly JSON (numpy arrays as plotly's base64 arrays)."""
    return json.loads(fig.to_json())


class LiveFigure(anywidget.AnyWidget):
    """A figure widget whose synced state is always the whole current figure.

    ``draw(fig)`` shows ``fig`` (built whole, e.g. by :mod:`kvlab.viz.plots`) in every view, now and later.
    ``figure`` (and ``data``, its traces) read back what is drawn: a ``go.Figure`` made from the synced
    state. ``layout`` stays ipywidgets' CSS layout of the widget; the plot's layout is ``figure.layout``.
    There is no in-place editing: to change a figure, build the new one and ``draw`` it.
    """

    _esm = _ESM
    _widget_data = traitlets.List().tag(sync=True)
    _widget_layout = traitlets.Dict().tag(sync=True)
    _config = traitlets.Dict().tag(sync=True)
    _plotly = traitlets.Instance(PlotlyJS).tag(sync=True, **widgets.widget_serialization)
    _plotly_version = traitlets.Unicode().tag(sync=True)

    def __init__(self, fig: go.Figure | None = None, *, config: dict | None = None, cache_size: int = 16,
                 **kwargs: Any) -> None:
        lib = library()
        super().__init__(_plotly=lib, _plotly_version=lib.version, _config=dict(config or {}), **kwargs)
        self._figure: go.Figure | None = None
        self._states: OrderedDict[Hashable, dict] = OrderedDict()  # key -> figure_state, most recent last
        self._cache_size = cache_size
        self.key: Hashable | None = None  # the key of the drawn figure (None: drawn without one)
        if fig is not None:
            self.draw(fig)

    def draw(self, fig: go.Figure | Callable[[], go.Figure], *, key: Hashable | None = None) -> None:
        """Replace the drawn figure with ``fig`` (data and layout in one update).

        ``fig`` may be a function that builds the figure; with a ``key`` naming what it is built from (e.g. a
        panel's settings), a figure drawn before for that key is drawn again without building it (the last
        ``cache_size`` keys are kept), and drawing the key already drawn does nothing."""
        if key is not None and key == self.key:
            return
        state = self._states.get(key) if key is not None else None
        if state is None:
            built = fig() if callable(fig) and not isinstance(fig, go.Figure) else fig
            if not isinstance(built, go.Figure):
                raise TypeError(f"LiveFigure.draw: expected a plotly go.Figure, got {type(built).__name__}")
            state = figure_state(built)
            if key is not None:
                self._states[key] = state
                while len(self._states) > self._cache_size:
                    self._states.popitem(last=False)
        else:
            self._states.move_to_end(key)
        with self.hold_sync():
            self._widget_data = state.get("data", [])
            self._widget_layout = state.get("layout", {})
        self.key = key
        self._figure = None

    @property
    def figure(self) -> go.Figure:
        """The drawn figure, rebuilt from the synced state (so it is what every view shows)."""
        if self._figure is None:
            self._figure = go.Figure(data=self._widget_data, layout=self._widget_layout)
        return self._figure

    @property
    def data(self) -> tuple:
        """The drawn traces (``figure.data``)."""
        return self.figure.data
