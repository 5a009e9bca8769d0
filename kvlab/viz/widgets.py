"""Widget panels: thin controllers over ``kvlab.experiments``.

Every figure of a panel is a :class:`~kvlab.viz.live.LiveFigure` drawn whole from the panel's results by the
pure functions in :mod:`kvlab.viz.plots` (keyed by the settings it shows, so a toggle back redraws from
cache); tables and verdicts are ``ipywidgets.HTML`` whose ``value`` is set whole. The widgets' synced state is
therefore always what the panel shows, for views that attach at any time (Voila, a reload, saved state)."""

from __future__ import annotations

import contextlib
import html
import traceback

import ipywidgets as widgets

from kvlab.units import fmt_gib
from kvlab.viz import plots
from kvlab.viz.live import LiveFigure


def _fmt_gib(n: int | None) -> str:
    return "—" if n is None else fmt_gib(n)


def _fmt_int(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def classed(widget, *css: str):
    """``widget`` with the CSS classes ``css`` added, in order: the names the stylesheet and the browser tests find it by."""
    for name in css:
        widget.add_class(name)
    return widget


def show_errors(errors: widgets.Output, callback):
    """Wrap a widget callback so an exception lands in the panel's ``errors`` Output (CSS class
    ``kvlab-errors``) as a traceback, instead of ipywidgets' default of logging it where a learner
    never looks (the kernel log / JupyterLab's log console). The previous error is cleared first."""

    def wrapped(*args, **kwargs):
        errors.outputs = ()  # not clear_output(): that needs a kernel's display hook, this syncs either way
        try:
            return callback(*args, **kwargs)
        except Exception:
            errors.append_stdout(traceback.format_exc())
            return None

    wrapped.__wrapped__ = callback
    return wrapped


# One stylesheet for every panel, carried by a hidden HTML widget inside the panel (so JupyterLab, Voila and the
# static report all have it; a <style> applies wherever it sits in the page). No emoji: the busy sign is CSS.
PANEL_CSS = """<style>
.kvlab-results{min-width:0;overflow-x:auto;transition:opacity .15s ease .1s,filter .15s ease .1s}
.kvlab-results.kvlab-stale{opacity:.3;filter:grayscale(1);pointer-events:none}
.kvlab-live-figure.kvlab-drawing{opacity:.3;filter:grayscale(1)}
.kvlab-busy{display:flex;align-items:center;gap:8px;padding:4px 10px;color:#1f3b63;background:#eef3fb;
  border-radius:4px;font-weight:600}
.kvlab-spinner{flex:none;width:12px;height:12px;border:2px solid #9db4d6;border-top-color:#1f3b63;border-radius:50%;
  animation:kvlab-spin .8s linear infinite}
@keyframes kvlab-spin{to{transform:rotate(360deg)}}
.kvlab-errors pre,.kvlab-errors .jp-OutputArea-output{color:#721c24;background:#f8d7da;border-radius:4px;
  padding:4px 10px;white-space:pre-wrap}
.kvlab-fig-grow{flex:1 1 520px;min-width:360px}
.kvlab-fig-wide{min-width:""" + str(plots.TIMELINES_MIN_WIDTH_PX) + """px}
.kvlab-side-table{flex:0 1 auto;min-width:0;max-width:100%;overflow-x:auto}
</style>"""


class BusyStatus:
    """A panel's "computing…" line: shown while a setting not seen before is computed (a second or more),
    cleared when the figures are drawn. Widget updates reach the page while the callback still runs. The sign
    is a CSS spinner and plain words (``role=status``, ``aria-busy``), so it renders in every browser font."""

    def __init__(self) -> None:
        self.widget = classed(widgets.HTML(value=""), "kvlab-status")

    @contextlib.contextmanager
    def busy(self, what: str):
        self.widget.value = (f"<div class='kvlab-busy' role='status' aria-busy='true'><span class='kvlab-spinner'>"
                             f"</span>computing {html.escape(what)} …</div>")
        try:
            yield
        finally:
            self.widget.value = ""


class PanelShell:
    """What every panel shares around its results: the stylesheet, the busy line, the errors and the results box.

    ``box(*controls)`` lays a panel out as controls, then the busy line and the errors (both at the top, above
    the results), then the results (CSS class ``kvlab-results``). ``showing(busy)`` wraps one redraw: with a
    ``busy`` description (a setting not computed before) the results are greyed out (class ``kvlab-stale``) and
    the busy line says what is computed, until the new results are drawn; if the redraw raises, the results are
    hidden (they belong to the old inputs) and the exception goes on to :meth:`guard`, which shows it at the top.
    """

    def __init__(self, results: list[widgets.Widget]) -> None:
        self.style = classed(widgets.HTML(PANEL_CSS, layout=widgets.Layout(display="none")), "kvlab-style")
        self.status = BusyStatus()
        self.errors = classed(widgets.Output(), "kvlab-errors")
        self.results = classed(widgets.VBox(results), "kvlab-results")
        self._stale = False  # "kvlab-stale" is among the results' classes

    def box(self, *controls: widgets.Widget) -> widgets.VBox:
        return widgets.VBox([self.style, *controls, self.status.widget, self.errors, self.results])

    @property
    def stale(self) -> bool:
        return self._stale

    @property
    def shown(self) -> bool:
        return self.results.layout.display != "none"

    def mark_stale(self) -> None:
        """Grey the results out now (a control changed; the redraw that follows ends it)."""
        if not self._stale:
            self.results.add_class("kvlab-stale")
            self._stale = True

    def mark_fresh(self) -> None:
        """The new results are drawn (or hidden after an error): no longer greyed out."""
        if self._stale:
            self.results.remove_class("kvlab-stale")
            self._stale = False

    @contextlib.contextmanager
    def showing(self, busy: str | None = None):
        cm = self.status.busy(busy) if busy else contextlib.nullcontext()
        if busy:
            self.mark_stale()
        try:
            with cm:
                yield
        except BaseException:
            self.results.layout.display = "none"  # no result of the old inputs stays beside the error
            raise
        else:
            self.results.layout.display = None
        finally:
            self.mark_fresh()

    def guard(self, callback):
        """Wrap a control's callback: the results are greyed out from the moment it starts (the controls may change
        before the redraw begins) until it ends; an error lands in this panel's errors, at the top: an input kvlab
        cannot use (a ``KvlabError``) as its one-line message, as the CLI prints it, anything else as a traceback."""
        from kvlab.errors import KvlabError

        def run(*args, **kwargs):
            self.mark_stale()
            try:
                return callback(*args, **kwargs)
            except KvlabError as exc:
                self.results.layout.display = "none"
                self.errors.append_stdout(f"kvlab: error: {exc}\n")
                return None
            finally:
                self.mark_fresh()

        return show_errors(self.errors, run)


class KVPoolPanel:
    """Finding 1, live: toggle gc-before-measure and watch the KV budget and the prompt's verdict.

    Both arms' memory timelines are drawn side by side (they depend on the preset, fraction and
    empty_cache, not on the toggle); the toggle picks which arm is "your server": its budget
    waterfall, its column in the table and its verdict. Results are cached per setting, so a
    toggle redraws without re-running.
    """

    def __init__(self, preset: str = "sglang-pr-4xh200", *, device: str | None = None) -> None:
        from kvlab.experiments import kv_pool_sizing

        self._experiment = kv_pool_sizing
        self.device = device
        self._cache: dict[tuple, tuple] = {}
        scenario = kv_pool_sizing.get_scenario(preset)

        self.preset = classed(widgets.Dropdown(options=sorted(kv_pool_sizing.SCENARIO_PRESETS), value=preset,
                                               description="preset"), "kvlab-preset")
        self.gc_toggle = classed(widgets.Checkbox(value=True, description="gc.collect() before measuring",
                                                  indent=False), "kvlab-gc-toggle")
        self.empty_cache_toggle = classed(widgets.Checkbox(value=True, description="empty_cache() in the reading",
                                                           indent=False), "kvlab-empty-cache-toggle")
        self.fraction = classed(widgets.FloatSlider(value=scenario.mem_fraction_static, min=0.5, max=0.95, step=0.01,
                                                    description="mem_fraction_static", continuous_update=False,
                                                    style={"description_width": "initial"}), "kvlab-fraction")
        self.prompt = classed(widgets.BoundedIntText(value=scenario.prompt_tokens, min=1, max=10_000_000,
                                                     description="prompt tokens",
                                                     style={"description_width": "initial"}), "kvlab-prompt")

        self.timelines = classed(LiveFigure(), "kvlab-timelines", "kvlab-fig-wide")
        self.waterfall = classed(LiveFigure(), "kvlab-waterfall", "kvlab-fig-grow")
        self.table = classed(widgets.HTML(), "kvlab-table", "kvlab-side-table")
        self.verdict = classed(widgets.HTML(), "kvlab-verdict")

        controls = widgets.VBox([widgets.HBox([self.preset, self.gc_toggle, self.empty_cache_toggle], layout=_wrap()),
                                 widgets.HBox([self.fraction, self.prompt], layout=_wrap())])
        self.shell = PanelShell([self.verdict, self.timelines,
                                 widgets.HBox([self.waterfall, self.table], layout=_wrap())])
        self.status, self.errors = self.shell.status, self.shell.errors
        self.widget = classed(self.shell.box(controls), "kvlab-kv-pool-panel")
        self._on_change = self.shell.guard(self._handle_change)
        for w in (self.preset, self.gc_toggle, self.empty_cache_toggle, self.fraction, self.prompt):
            w.observe(self._on_change, names="value")
        self.refresh()

    # ---- the controller ---------------------------------------------------------------------
    def _handle_change(self, change) -> None:
        if change["owner"] is self.preset:
            scenario = self._experiment.get_scenario(self.preset.value)
            with self.widget.hold_trait_notifications():
                self.fraction.unobserve(self._on_change, names="value")
                self.prompt.unobserve(self._on_change, names="value")
                self.fraction.value = scenario.mem_fraction_static
                self.prompt.value = scenario.prompt_tokens
                self.fraction.observe(self._on_change, names="value")
                self.prompt.observe(self._on_change, names="value")
        self._refresh()

    def settings(self) -> tuple:
        """What the arms are computed from (the gc toggle only picks one of them)."""
        return (self.preset.value, self.empty_cache_toggle.value, round(self.fraction.value, 4), self.prompt.value)

    def arms(self):
        """(without gc, with gc) for the current settings, from the cache when seen before."""
        key = self.settings()
        if key not in self._cache:
            self._cache[key] = self._experiment.compare(
                self.preset.value, empty_cache=key[1], mem_fraction_static=key[2], prompt_tokens=key[3],
                device=self.device)
        return self._cache[key]

    @property
    def current(self):
        no_gc, with_gc = self.arms()
        return with_gc if self.gc_toggle.value else no_gc

    def refresh(self) -> None:
        self.shell.guard(self._refresh)()

    def _refresh(self) -> None:
        key = self.settings()
        busy = None if key in self._cache else f"both start-ups of {key[0]} (mem_fraction_static {key[2]})"
        with self.shell.showing(busy):  # the old results greyed out until the new ones are drawn
            no_gc, with_gc = self.arms()
            current = with_gc if self.gc_toggle.value else no_gc
            # Both arms' timelines: the gc toggle (which only picks "your server") leaves them as they are.
            self.timelines.draw(lambda: timelines_figure(no_gc, with_gc), key=key)
            self.waterfall.draw(lambda: budget_figure(current), key=(key, current.gc_before_measure))
            self.table.value = result_table_html(no_gc, with_gc, current)
            self.verdict.value = verdict_html(current)


def _wrap() -> widgets.Layout:
    """A row that wraps: on a narrow page the table goes below its figure instead of being cut off."""
    return widgets.Layout(flex_flow="row wrap", align_items="flex-start")


def timelines_figure(no_gc, with_gc):
    """Finding 1's two memory timelines (without, with gc.collect()) as a panel draws them."""
    fig = plots.memory_timelines_side_by_side(no_gc.timeline, with_gc.timeline,
                                              ("without gc.collect()", "with gc.collect()"),
                                              weights_bytes=(no_gc.weights_bytes, with_gc.weights_bytes))
    return fig  # no width: the figure follows its container (a LiveFigure, the report's page)


def budget_figure(result):
    """One arm's KV budget waterfall, titled with the budget it comes to."""
    arm = "with" if result.gc_before_measure else "without"
    rest = result.budget.rest_bytes if result.budget else None
    fig = plots.budget_waterfall(result.budget_terms(), title=f"KV budget {arm} gc.collect(): {_fmt_gib(rest)}")
    return fig.update_layout(height=380, margin=dict(t=50, l=50, r=20, b=60))  # width: the container's


def result_table_html(no_gc, with_gc, current) -> str:
    """Both arms beside the waterfall; the arm the toggle selects is shaded. Fixed column widths, no wrapping
    and tabular digits, so toggling never reflows the table (only the shading moves)."""
    rows = [
        ("free before load", "pre_model_load_bytes", _fmt_gib),
        ("free memory read after loading", "available_bytes", _fmt_gib),
        ("KV budget (rest)", "rest_bytes", _fmt_gib),
        ("KV pool, tokens", "max_total_num_tokens", _fmt_int),
        ("longest prompt, tokens", "max_req_input_len", _fmt_int),
        ("memory left idle once gc has run", "idle_bytes", _fmt_gib),
    ]
    a, b = no_gc.to_json(), with_gc.to_json()
    shade = "background:#fff3cd;"
    cols = [(a, "without gc.collect()", not current.gc_before_measure),
            (b, "with gc.collect()", current.gc_before_measure)]
    cell = "padding:3px 8px;white-space:nowrap;"
    header = "".join(f"<th style='{cell}width:10.5em;text-align:right;{shade if sel else ''}'>{name}</th>"
                     for _, name, sel in cols)
    body = ""
    for label, key, fmt in rows:
        cells = "".join(
            f"<td data-field='{key}' data-arm='{'gc' if d is b else 'no-gc'}' data-value='{d[key] if d[key] is not None else ''}'"
            f" style='{cell}text-align:right;{shade if sel else ''}'>{fmt(d[key])}</td>" for d, _, sel in cols)
        body += f"<tr><td style='{cell}'>{label}</td>{cells}</tr>"
    return (f"<table class='kvlab-result-table' style='table-layout:fixed;border-collapse:collapse;"
            f"font-variant-numeric:tabular-nums'><tr><th style='{cell}width:16em'></th>{header}</tr>{body}</table>")


def verdict_html(result) -> str:
    data = result.to_json()
    colour = "#155724" if data["accepted"] else "#721c24"
    bg = "#d4edda" if data["accepted"] else "#f8d7da"
    word = "accepted" if data["accepted"] else "refused"
    detail = html.escape(data["error"]) if data["error"] else f"fits in a pool of {data['max_total_num_tokens']:,} tokens"
    return (f"<div class='kvlab-verdict-box' data-accepted='{str(data['accepted']).lower()}' "
            f"data-max-total-num-tokens='{data['max_total_num_tokens']}' "
            f"style='padding:6px 10px;border-radius:4px;color:{colour};background:{bg}'>"
            f"<b>{data['prompt_tokens']:,}-token prompt {word}</b> — {detail}</div>")


class ShortfallPanel:
    """Finding 2, live: both eviction modes on the same workload, side by side.

    Opens on ``shortfall_eviction.PANEL_DEFAULTS``, a regime where full eviction visibly costs hit rate
    (notebook 02 says where it does not). The mode toggle picks "your server" (its verdict, gauge and
    highlighted column); the workload, pool size, page size and policy re-run both modes (cached per setting).
    """

    # dropdown -> make_workload overrides, small enough to re-run in seconds on a laptop (PANEL_DEFAULTS'
    # workload, generated-shared-prefix, has its own sizes)
    WORKLOAD_SIZES = {
        "multi-turn-chat": (("num_sessions", 16), ("turns", 4)),
        "few-shot": (("num_requests", 96),),
    }
    PAGE_SIZES = (1, 16, 128)

    def __init__(self, settings=None) -> None:
        from kvlab.experiments import shortfall_eviction
        from kvlab.mem_cache.evict_policy import EVICTION_POLICIES
        from kvlab.workloads.generators import WORKLOADS

        self._experiment = shortfall_eviction
        defaults = shortfall_eviction.PANEL_DEFAULTS
        settings = settings or defaults
        # every registered workload, in registry order; one without a size here runs at its own defaults
        self._sizes = {name: self.WORKLOAD_SIZES.get(name, ()) for name in WORKLOADS}
        self._sizes.update({defaults.workload: defaults.overrides, settings.workload: settings.overrides})
        self.seed = settings.seed
        self._cache: dict[object, object] = {}
        labels = shortfall_eviction.MODE_LABELS
        self.mode = classed(widgets.ToggleButtons(options=[(labels[m], m) for m in shortfall_eviction.MODES],
                                                  value="shortfall", description="eviction"), "kvlab-eviction-mode")
        self.kv_tokens = classed(widgets.IntSlider(value=settings.kv_tokens, min=8_192, max=131_072, step=4_096,
                                                   description="KV pool tokens", continuous_update=False,
                                                   style={"description_width": "initial"}), "kvlab-kv-tokens")
        self.page_size = classed(widgets.Dropdown(options=list(self.PAGE_SIZES), value=settings.page_size,
                                                  description="page size"), "kvlab-page-size")
        self.workload = classed(widgets.Dropdown(options=list(self._sizes), value=settings.workload,
                                                 description="workload"), "kvlab-workload")
        self.policy = classed(widgets.Dropdown(options=sorted(EVICTION_POLICIES), value=settings.policy,
                                               description="policy"), "kvlab-policy")
        self.timelines = classed(LiveFigure(), "kvlab-sim-timelines", "kvlab-fig-wide")
        self.bars = classed(LiveFigure(), "kvlab-sim-bars")
        self.gauge = classed(LiveFigure(), "kvlab-sim-gauge")
        self.table = classed(widgets.HTML(), "kvlab-sim-table", "kvlab-side-table")
        self.verdict = classed(widgets.HTML(), "kvlab-sim-verdict")
        self.shell = PanelShell([self.verdict, widgets.HBox([self.gauge, self.table], layout=_wrap()),
                                 self.timelines, self.bars])
        self.status, self.errors = self.shell.status, self.shell.errors
        self.widget = classed(self.shell.box(widgets.HBox([self.mode, self.workload], layout=_wrap()),
                                             widgets.HBox([self.kv_tokens, self.page_size, self.policy], layout=_wrap())),
                              "kvlab-shortfall-panel")
        self._on_change = self.shell.guard(lambda _change: self._refresh())
        for w in (self.mode, self.kv_tokens, self.page_size, self.workload, self.policy):
            w.observe(self._on_change, names="value")
        self.refresh()

    def settings(self):
        """What both modes are computed from (the mode toggle only picks one of them)."""
        return self._experiment.PanelSettings(
            workload=self.workload.value, overrides=tuple(self._sizes[self.workload.value]),
            kv_tokens=self.kv_tokens.value, page_size=self.page_size.value, policy=self.policy.value, seed=self.seed)

    def comparison(self):
        key = self.settings()
        if key not in self._cache:
            self._cache[key] = self._experiment.panel_comparison(key, progress=False)
        return self._cache[key]

    def refresh(self) -> None:
        self.shell.guard(self._refresh)()

    def _refresh(self) -> None:
        key, mode = self.settings(), self.mode.value
        busy = None if key in self._cache else f"both eviction modes on {key.workload} with a {key.kv_tokens:,}-token pool"
        with self.shell.showing(busy):  # the old results greyed out until the new ones are drawn
            comparison = self.comparison()
            # Both modes are drawn whatever the toggle: it only re-highlights (gauge, table, verdict).
            self.timelines.draw(lambda: sim_timelines_figure(comparison), key=key)
            self.bars.draw(lambda: totals_figure(comparison), key=key)
            self.gauge.draw(lambda: gauge_figure(comparison, mode), key=(key, mode))
            self.table.value = sim_table_html(comparison, mode)
            self.verdict.value = sim_verdict_html(comparison, mode)


def _label(mode: str) -> str:
    """A mode's words (``shortfall (the fix)``), from the experiment's ``MODE_LABELS``."""
    from kvlab.experiments.shortfall_eviction import MODE_LABELS  # lazy: the experiment imports torch

    return MODE_LABELS[mode]


def _arm(comparison, mode: str):
    return dict(comparison.arms())[mode]


def sim_timelines_figure(comparison):
    """Finding 2 over time: both modes on shared axes (evicted so far, pressure events, hit rate)."""
    from kvlab.viz import eviction_plots

    return eviction_plots.cumulative_eviction(comparison.cumulative_frame()).update_layout(height=560)


def totals_figure(comparison):
    """Both modes' prefill / evicted / over-evicted tokens as grouped bars."""
    from kvlab.viz.eviction_plots import MODE_STYLE

    arms = dict(comparison.arms())
    fig = plots.totals_bars({_label(mode): arms[mode].totals() for mode in ("full", "shortfall")})
    for trace, mode in zip(fig.data, ("full", "shortfall")):  # each mode's colour, as in the timelines
        trace.marker.color = MODE_STYLE[mode][1]
    return fig  # width: the container's


def gauge_figure(comparison, mode: str):
    """The big number: the selected mode's hit rate, against the other mode's."""
    other = "full" if mode == "shortfall" else "shortfall"
    return plots.hit_rate_indicator(_arm(comparison, mode).totals()["hit_rate"],
                                    _arm(comparison, other).totals()["hit_rate"],
                                    title=f"hit rate · {_label(mode)}")


def sim_verdict_html(comparison, mode: str) -> str:
    """The selected mode's numbers, then the comparison's plain verdict (negligible where it is)."""
    t = _arm(comparison, mode).totals()
    label = _label(mode)
    return (f"<div class='kvlab-sim-verdict-box' data-mode='{mode}' data-hit-rate='{t['hit_rate']}' "
            f"data-over-evicted='{t['over_evicted_tokens']}' style='padding:6px 10px;border-radius:4px;"
            f"background:{'#d4edda' if mode == 'shortfall' else '#f8d7da'}'>"
            f"<b>your server: {html.escape(label)}</b> · hit rate {t['hit_rate']:.2%} · "
            f"{t['over_evicted_tokens']:,} tokens evicted earlier than needed · "
            f"{t['prefill_tokens_computed']:,} prefill tokens computed"
            f"<br>{html.escape(comparison.verdict())}</div>")


def sim_table_html(comparison, selected: str) -> str:
    rows = [("hit rate", "hit_rate", lambda v: f"{v:.2%}"), ("cached prompt tokens", "cached_prompt_tokens", _fmt_int),
            ("prefill tokens computed", "prefill_tokens_computed", _fmt_int),
            ("… of them again after a retraction", "reprefill_tokens", _fmt_int), ("evicted tokens", "evicted_tokens", _fmt_int),
            ("evicted earlier than needed", "over_evicted_tokens", _fmt_int),
            ("pressure events", "pressure_events", _fmt_int), ("retractions", "retractions", _fmt_int),
            ("output tokens/s (model)", "output_tokens_per_s", lambda v: f"{v:,.0f}")]
    cols = (("full", comparison.full.totals()), ("shortfall", comparison.shortfall.totals()))  # the bug, then the fix
    hl = "background:#fff3cd"
    cell = "padding:3px 8px;white-space:nowrap;"
    header = "".join(f"<th style='{cell}width:11em;text-align:right;{hl if m == selected else ''}'>"
                     f"{_label(m)}</th>" for m, _ in cols)
    body = "".join(
        f"<tr><td>{label}</td>" + "".join(
            f"<td data-field='{key}' data-mode='{m}' data-value='{t[key]}' style='{cell}text-align:right;"
            f"{hl if m == selected else ''}'>{fmt(t[key])}</td>" for m, t in cols) + "</tr>"
        for label, key, fmt in rows)
    return (f"<table class='kvlab-sim-result-table' style='table-layout:fixed;border-collapse:collapse;"
            f"font-variant-numeric:tabular-nums'><tr><th style='{cell}width:14em'></th>{header}</tr>{body}</table>")
