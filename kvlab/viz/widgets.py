"""Widget panels: thin controllers over ``kvlab.experiments`` that update plots in place."""

from __future__ import annotations

import html
import traceback

import ipywidgets as widgets
import plotly.graph_objects as go

from kvlab.viz import plots

GIB = float(1 << 30)


def _fmt_gib(n: int | None) -> str:
    return "—" if n is None else f"{n / GIB:,.2f} GiB"


def _fmt_int(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


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

        self.preset = widgets.Dropdown(options=sorted(kv_pool_sizing.SCENARIO_PRESETS), value=preset,
                                       description="preset")
        self.gc_toggle = widgets.Checkbox(value=True, description="gc.collect() before measuring", indent=False)
        self.empty_cache_toggle = widgets.Checkbox(value=True, description="empty_cache() in the reading", indent=False)
        self.fraction = widgets.FloatSlider(value=scenario.mem_fraction_static, min=0.5, max=0.95, step=0.01,
                                            description="mem_fraction_static", continuous_update=False,
                                            style={"description_width": "initial"})
        self.prompt = widgets.BoundedIntText(value=scenario.prompt_tokens, min=1, max=10_000_000,
                                             description="prompt tokens", style={"description_width": "initial"})
        for w, css in ((self.preset, "kvlab-preset"), (self.gc_toggle, "kvlab-gc-toggle"),
                       (self.empty_cache_toggle, "kvlab-empty-cache-toggle"), (self.fraction, "kvlab-fraction"),
                       (self.prompt, "kvlab-prompt")):
            w.add_class(css)

        self.timelines = go.FigureWidget(plots.memory_timelines_side_by_side(
            _empty_frame(), _empty_frame(), ("without gc.collect()", "with gc.collect()")))
        self.timelines.update_layout(width=980)
        self._subplot_titles = tuple(self.timelines.layout.annotations)
        self.waterfall = go.FigureWidget(plots.budget_waterfall([("free before load", 0)]))
        self.waterfall.update_layout(height=380, width=640, margin=dict(t=50, l=50, r=20, b=60))
        self.table = widgets.HTML()
        self.verdict = widgets.HTML()
        self.errors = widgets.Output()
        for w, css in ((self.timelines, "kvlab-timelines"), (self.waterfall, "kvlab-waterfall"),
                       (self.table, "kvlab-table"), (self.verdict, "kvlab-verdict"), (self.errors, "kvlab-errors")):
            w.add_class(css)

        controls = widgets.VBox([widgets.HBox([self.preset, self.gc_toggle, self.empty_cache_toggle]),
                                 widgets.HBox([self.fraction, self.prompt])])
        self.widget = widgets.VBox([controls, self.verdict, self.timelines,
                                    widgets.HBox([self.waterfall, self.table]), self.errors])
        self.widget.add_class("kvlab-kv-pool-panel")
        self._drawn_arms: tuple | None = None  # the arms the timelines currently show
        self._on_change = show_errors(self.errors, self._handle_change)
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

    def arms(self):
        """(without gc, with gc) for the current settings, from the cache when seen before."""
        key = (self.preset.value, self.empty_cache_toggle.value, round(self.fraction.value, 4), self.prompt.value)
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
        show_errors(self.errors, self._refresh)()

    def _refresh(self) -> None:
        no_gc, with_gc = self.arms()
        current = with_gc if self.gc_toggle.value else no_gc
        self._draw(no_gc, with_gc, current)

    def _draw(self, no_gc, with_gc, current) -> None:
        # The timelines show both arms, so the gc toggle (which only picks "your server") leaves them as
        # they are: redrawing 8 traces of thousands of points is what made a toggle slow.
        if self._drawn_arms != (id(no_gc), id(with_gc)):
            self._draw_timelines(no_gc, with_gc)
            self._drawn_arms = (id(no_gc), id(with_gc))
        trace = plots.waterfall_trace(current.budget_terms())
        with self.waterfall.batch_update():
            self.waterfall.data[0].update(x=trace.x, y=trace.y, measure=trace.measure, text=trace.text)
            arm = "with" if current.gc_before_measure else "without"
            self.waterfall.layout.title = f"KV budget {arm} gc.collect(): {_fmt_gib(current.budget.rest_bytes if current.budget else None)}"
        self.table.value = result_table_html(no_gc, with_gc, current)
        self.verdict.value = verdict_html(current)

    def _draw_timelines(self, no_gc, with_gc) -> None:
        with self.timelines.batch_update():
            for offset, result in ((0, no_gc), (plots.TRACES_PER_TIMELINE, with_gc)):
                frame = result.timeline
                steps, phases = list(range(len(frame))), frame["phase"].tolist()
                for i, (column, _, _) in enumerate(plots.SERIES):
                    self.timelines.data[offset + i].update(x=steps, y=(frame[column] / GIB).round(4).tolist(),
                                                           customdata=phases)
                x, y = plots.weights_line(len(frame), result.weights_bytes)
                self.timelines.data[offset + len(plots.SERIES)].update(x=x, y=y)
            shapes, labels = [], []
            for xref, result in (("x", no_gc), ("x2", with_gc)):
                s, a = plots.phase_bands(result.timeline, xref)
                shapes += s
                labels += a
            self.timelines.layout.shapes = shapes
            self.timelines.layout.annotations = list(self._subplot_titles) + labels


def _empty_frame():
    import pandas as pd

    return pd.DataFrame({"phase": ["start"], "allocated_bytes": [0], "reserved_bytes": [0], "free_bytes": [0]})


def result_table_html(no_gc, with_gc, current) -> str:
    rows = [
        ("free before load", "pre_model_load_bytes", _fmt_gib),
        ("available after load", "available_bytes", _fmt_gib),
        ("KV budget (rest)", "rest_bytes", _fmt_gib),
        ("max_total_num_tokens", "max_total_num_tokens", _fmt_int),
        ("max_req_input_len", "max_req_input_len", _fmt_int),
        ("memory idle once gc ran", "idle_bytes", _fmt_gib),
    ]
    a, b = no_gc.to_json(), with_gc.to_json()
    head_style = "background:#fff3cd;font-weight:bold"
    cols = [(a, "without gc", not current.gc_before_measure), (b, "with gc", current.gc_before_measure)]
    header = "".join(f"<th style='{head_style if sel else ''}'>{name}</th>" for _, name, sel in cols)
    body = ""
    for label, key, fmt in rows:
        cells = "".join(
            f"<td data-field='{key}' data-arm='{'gc' if d is b else 'no-gc'}' data-value='{d[key] if d[key] is not None else ''}'"
            f" style='text-align:right;{head_style if sel else ''}'>{fmt(d[key])}</td>" for d, _, sel in cols)
        body += f"<tr><td>{label}</td>{cells}</tr>"
    return f"<table class='kvlab-result-table'><tr><th></th>{header}</tr>{body}</table>"


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

    The mode toggle picks "your server" (its verdict line and highlighted column); the pool size,
    workload and policy re-run both arms (cached per setting).
    """

    WORKLOAD_SIZES = {  # small enough to re-run in a few seconds on a laptop
        "generated-shared-prefix": dict(num_groups=16, prompts_per_group=8, output_len=128),
        "multi-turn-chat": dict(num_sessions=16, turns=4),
        "few-shot": dict(num_requests=96),
    }

    def __init__(self, workload: str = "generated-shared-prefix", kv_tokens: int = 20_000, *, seed: int = 0) -> None:
        from kvlab.experiments import shortfall_eviction

        self._experiment = shortfall_eviction
        self.seed = seed
        self._cache: dict[tuple, object] = {}
        self.mode = widgets.ToggleButtons(options=[("shortfall (fix)", "shortfall"), ("full (bug)", "full")],
                                          value="shortfall", description="eviction")
        self.kv_tokens = widgets.IntSlider(value=kv_tokens, min=8_192, max=131_072, step=4_096,
                                           description="KV pool tokens", continuous_update=False,
                                           style={"description_width": "initial"})
        self.workload = widgets.Dropdown(options=list(self.WORKLOAD_SIZES), value=workload, description="workload")
        self.policy = widgets.Dropdown(options=["lru", "lfu", "fifo", "mru", "filo"], value="lru", description="policy")
        for w, css in ((self.mode, "kvlab-eviction-mode"), (self.kv_tokens, "kvlab-kv-tokens"),
                       (self.workload, "kvlab-workload"), (self.policy, "kvlab-policy")):
            w.add_class(css)
        empty = _empty_sim_frame()
        self.timelines = go.FigureWidget(plots.sim_timelines_side_by_side(empty, empty, ("shortfall (fix)", "full (bug)")))
        self.timelines.update_layout(width=980)
        self.bars = go.FigureWidget(plots.totals_bars({"shortfall (fix)": _zero_totals(), "full (bug)": _zero_totals()}))
        self.bars.update_layout(width=560)
        self.gauge = go.FigureWidget(go.Figure(go.Indicator(
            mode="number+delta", value=0, number=dict(suffix=" %", valueformat=".2f"),
            delta=dict(reference=0, valueformat=".2f", suffix=" pts"),
            title=dict(text="hit rate of your server"))).update_layout(height=200, width=300,
                                                                         margin=dict(t=40, b=10, l=10, r=10)))
        self.table = widgets.HTML()
        self.verdict = widgets.HTML()
        self.errors = widgets.Output()
        for w, css in ((self.gauge, "kvlab-sim-gauge"), (self.timelines, "kvlab-sim-timelines"), (self.bars, "kvlab-sim-bars"),
                       (self.table, "kvlab-sim-table"), (self.verdict, "kvlab-sim-verdict"),
                       (self.errors, "kvlab-errors")):
            w.add_class(css)
        self.widget = widgets.VBox([widgets.HBox([self.mode, self.workload]), widgets.HBox([self.kv_tokens, self.policy]),
                                    self.verdict, self.timelines, widgets.HBox([self.bars, widgets.VBox([self.gauge, self.table])]),
                                    self.errors])
        self.widget.add_class("kvlab-shortfall-panel")
        self._drawn: object | None = None  # the comparison the timelines and bars currently show
        self._on_change = show_errors(self.errors, lambda _change: self._refresh())
        for w in (self.mode, self.kv_tokens, self.workload, self.policy):
            w.observe(self._on_change, names="value")
        self.refresh()

    def comparison(self):
        key = (self.workload.value, self.kv_tokens.value, self.policy.value)
        if key not in self._cache:
            requests = self._experiment.load_requests(workload=key[0], seed=self.seed,
                                                      overrides=self.WORKLOAD_SIZES[key[0]])
            self._cache[key] = self._experiment.compare(requests, kv_tokens=key[1], policy=key[2], progress=False)
        return self._cache[key]

    def refresh(self) -> None:
        show_errors(self.errors, self._refresh)()

    def _refresh(self) -> None:
        self._draw(self.comparison())

    def _draw(self, comparison) -> None:
        # Both arms are drawn whatever the mode: the mode toggle only re-highlights (table, gauge, verdict).
        if self._drawn is not comparison:
            self._draw_arms(comparison)
            self._drawn = comparison
        self._draw_selection(comparison)

    def _draw_arms(self, comparison) -> None:
        arms = (("shortfall", comparison.shortfall), ("full", comparison.full))
        n = len(plots.SIM_SERIES)
        with self.timelines.batch_update():
            for col, (_, result) in enumerate(arms):
                series = plots.sim_series(result.steps_frame())
                for i, (column, _, _, _) in enumerate(plots.SIM_SERIES):
                    self.timelines.data[col * n + i].update(x=series["x"], y=series[column])
        with self.bars.batch_update():
            for i, (_, result) in enumerate(arms):
                t = result.totals()
                self.bars.data[i].y = [t[k] for k in self.bars.data[i].x]

    def _draw_selection(self, comparison) -> None:
        self.table.value = sim_table_html(comparison, self.mode.value)
        current = comparison.shortfall if self.mode.value == "shortfall" else comparison.full
        other = comparison.full if current is comparison.shortfall else comparison.shortfall
        t = current.totals()
        with self.gauge.batch_update():
            self.gauge.data[0].value = round(100 * t["hit_rate"], 4)
            self.gauge.data[0].delta.reference = round(100 * other.totals()["hit_rate"], 4)
            self.gauge.data[0].title.text = f"hit rate · {self.mode.value} eviction"
        self.verdict.value = (
            f"<div class='kvlab-sim-verdict-box' data-mode='{self.mode.value}' data-hit-rate='{t['hit_rate']}' "
            f"data-over-evicted='{t['over_evicted_tokens']}' style='padding:6px 10px;border-radius:4px;"
            f"background:{'#d4edda' if self.mode.value == 'shortfall' else '#f8d7da'}'>"
            f"<b>{self.mode.value} eviction</b>: hit rate {t['hit_rate']:.2%}, "
            f"{t['over_evicted_tokens']:,} tokens evicted beyond the shortfall, "
            f"{t['prefill_tokens_computed']:,} prefill tokens computed, "
            f"{t['output_tokens_per_s']:,.0f} output tokens/s (cost model)</div>")


def _empty_sim_frame():
    import pandas as pd

    return pd.DataFrame({"time_s": [0.0], "hit_rate": [0.0], "evicted_tokens": [0], "over_evicted_tokens": [0]})


def _zero_totals() -> dict:
    return {"prefill_tokens_computed": 0, "evicted_tokens": 0, "over_evicted_tokens": 0}


def sim_table_html(comparison, selected: str) -> str:
    rows = [("hit rate", "hit_rate", lambda v: f"{v:.2%}"), ("cached prompt tokens", "cached_prompt_tokens", _fmt_int),
            ("prefill tokens computed", "prefill_tokens_computed", _fmt_int), ("evicted tokens", "evicted_tokens", _fmt_int),
            ("over-evicted tokens", "over_evicted_tokens", _fmt_int), ("retractions", "retractions", _fmt_int),
            ("output tokens/s (model)", "output_tokens_per_s", lambda v: f"{v:,.0f}")]
    cols = (("shortfall", comparison.shortfall.totals()), ("full", comparison.full.totals()))
    hl = "background:#fff3cd;font-weight:bold"
    header = "".join(f"<th style='{hl if m == selected else ''}'>{m}</th>" for m, _ in cols)
    body = "".join(
        f"<tr><td>{label}</td>" + "".join(
            f"<td data-field='{key}' data-mode='{m}' data-value='{t[key]}' style='text-align:right;"
            f"{hl if m == selected else ''}'>{fmt(t[key])}</td>" for m, t in cols) + "</tr>"
        for label, key, fmt in rows)
    return f"<table class='kvlab-sim-result-table'><tr><th></th>{header}</tr>{body}</table>"
