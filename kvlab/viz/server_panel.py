"""Notebook 05's panel, "your server": paste or upload a start-up log and a config.json, see the pool explained.

A thin controller over :func:`kvlab.serving.explain.explain_text` (``explain_log`` on a pasted log) and
:func:`kvlab.serving.engine_compare.compare_explanation`: the log (a Textarea, a FileUpload, or one of the
example logs kvlab ships, :mod:`kvlab.serving.examples`), the model's config (a preset, the shipped example
config, or a pasted/uploaded config.json), the GPU, and what-if controls (mem_fraction_static, KV dtype, TP,
GPU). Every figure is a :class:`~kvlab.viz.live.LiveFigure` drawn whole by the pure functions below, so every
view — live JupyterLab, a reload, Voila, the static report — draws the same figures.
"""

from __future__ import annotations

import html
import math
import textwrap

import ipywidgets as widgets
import plotly.graph_objects as go

from kvlab.serving.explain import explain_text
from kvlab.viz.engine_plots import ENGINE_COLOURS, engine_waterfalls, gap_bars, mark_assumed
from kvlab.viz.live import LiveFigure
from kvlab.viz.theme import BUG_COLOUR, FIX_COLOUR, TEMPLATE
from kvlab.viz.widgets import PanelShell
from kvlab.viz.widgets import show_errors as _show_tracebacks
from kvlab.viz.wording import live_or_static

PASTED = "(pasted or uploaded)"
FROM_LOG = "(from the log)"
CHOOSE = "(choose the model config)"  # a pasted log names no model kvlab ships: nothing is computed until one is
CONTRADICTIONS = ("cell_mismatch",)  # findings saying the config contradicts the log: the verdict is not judged
KV_DTYPES = ("auto", "bf16", "fp8_e4m3")
WHAT_IF_VLLM = ("the what-ifs recompute SGLang's arithmetic (a fraction of the memory free before loading); "
                "a vLLM log has no mem_fraction_static to change: pick an SGLang log")
TP_SIZES = (1, 2, 4, 8, 16)


def show_errors(errors: widgets.Output, callback):
    """Like :func:`kvlab.viz.widgets.show_errors`, but an input kvlab cannot use (a ``KvlabError``: a bad log,
    a bad config) shows as its one-line message, as the CLI prints it; anything else as a traceback."""
    from kvlab.errors import KvlabError

    def wrapped(*args, **kwargs):
        errors.outputs = ()
        try:
            return callback(*args, **kwargs)
        except KvlabError as exc:
            errors.append_stdout(f"kvlab: error: {exc}\n")
            return None

    return _show_tracebacks(errors, wrapped)


# ---- pure figures ----------------------------------------------------------------------------------
TICK_FONT = 13  # px: the template's font (kvlab.viz.theme), which the tick labels use
TICK_ANGLE = -30  # the waterfalls' x labels, slanted by this much whatever the width (plotly's own angle varies)
LABEL_WIDTH = 18  # characters per line of an x label


def slanted_labels(names) -> tuple[list[str], int]:
    """The x labels wrapped to LABEL_WIDTH characters, and the bottom margin (px) that holds them slanted at
    TICK_ANGLE: a line's width (0.6 em a character) and the lines' height (1.3 em each) turned by the angle, plus
    the tick's gap. A note under the figure (``mark_assumed``) goes below that margin, never into the labels."""
    wrapped = ["<br>".join(textwrap.wrap(name, LABEL_WIDTH, break_on_hyphens=False)) or name for name in names]
    lines = [label.split("<br>") for label in wrapped]
    widest = max(len(line) for label in lines for line in label) * 0.6 * TICK_FONT
    tallest = max(len(label) for label in lines) * 1.3 * TICK_FONT
    angle = math.radians(abs(TICK_ANGLE))
    return wrapped, math.ceil(widest * math.sin(angle) + tallest * math.cos(angle)) + 16


HOVER_WIDTH = 90  # characters per line of a hover's words: a long "assumed" basis wraps instead of running off
HOVER = "%{customdata[0]}: %{customdata[1]} GiB<br>%{customdata[2]}<extra></extra>"


def term_hover(term, value: str) -> list[str]:
    """One bar's hover: [its name, the term as drawn on it (with the "*" of an assumed term), how it is made and
    what it rests on]: the term itself, never the waterfall's running level."""
    how = term.how + ("\n* assumed, not read: rests on " + "; ".join(term.assumed) if term.assumed else "")
    lines = [wrapped for part in how.split("\n") for wrapped in textwrap.wrap(part, HOVER_WIDTH)]
    return [term.name, value, "<br>".join(html.escape(line, quote=False) for line in lines)]


def explanation_waterfall(exp) -> go.Figure:
    """The explained engine's own arithmetic: SGLang's readings to the pool budget, or vLLM's printed terms; each
    bar's hover is its term (``term_hover``), the x labels slanted clear of the note under the figure."""
    terms = exp.terms()
    colour = ENGINE_COLOURS[exp.engine]
    if exp.engine == "sglang":
        # readings to the pool budget: the version's counted terms (sglang_versions) sit between them
        shown = terms[:next(i for i, t in enumerate(terms) if t.key == "pool_budget") + 1]
        measure = ["absolute"] + ["relative"] * (len(shown) - 2) + ["total"]
        text = [(f"{t.gib:+.2f}" if m == "relative" else f"{t.gib:.2f}") + ("*" if t.assumed else "")
                for t, m in zip(shown, measure)]
        labels, bottom = slanted_labels([t.name for t in shown])
        fig = go.Figure(go.Waterfall(
            x=labels, y=[t.gib for t in shown], measure=measure, text=text, textposition="outside",
            cliponaxis=False, customdata=[term_hover(t, v) for t, v in zip(shown, text)], hovertemplate=HOVER,
            connector=dict(line=dict(color="#999")), decreasing=dict(marker=dict(color="#bbbbbb")),
            increasing=dict(marker=dict(color=colour)), totals=dict(marker=dict(color=colour))))
    else:
        shown = [t for t in terms if t.gib is not None]
        text = [f"{t.gib:.2f}" + ("*" if t.assumed else "") for t in shown]
        labels, bottom = slanted_labels([t.name for t in shown])
        fig = go.Figure(go.Bar(x=labels, y=[t.gib for t in shown], marker_color=colour, text=text,
                               textposition="outside", cliponaxis=False,
                               customdata=[term_hover(t, v) for t, v in zip(shown, text)], hovertemplate=HOVER))
    logged = exp.max_total_num_tokens_logged
    title = (f"{'SGLang' if exp.engine == 'sglang' else 'vLLM'} {exp.version or ''}: "
             f"{exp.max_total_num_tokens_computed:,} tokens computed"
             + (f", {logged:,} logged" if logged is not None else ""))
    fig.update_xaxes(tickangle=TICK_ANGLE, tickfont=dict(size=TICK_FONT))
    fig.update_layout(template=TEMPLATE, title=title, yaxis_title="GiB per GPU", height=320 + bottom,
                      showlegend=False, margin=dict(t=50, l=60, r=20, b=bottom))
    return mark_assumed(fig, (a for t in shown for a in t.assumed))


def what_if_figure(exp) -> go.Figure:
    """The pool as explained beside each what-if (one change at a time), in tokens."""
    rows = [("as explained", exp.max_total_num_tokens_computed, "")] + [
        (w.label, w.max_total_num_tokens, w.note) for w in exp.what_if]
    base = exp.max_total_num_tokens_computed
    colours = ["#7f7f7f"] + [FIX_COLOUR if t >= base else BUG_COLOUR for _, t, _ in rows[1:]]
    fig = go.Figure(go.Bar(x=[r[0] for r in rows], y=[r[1] for r in rows], marker_color=colours,
                           text=[f"{r[1]:,}" for r in rows], textposition="outside", cliponaxis=False,
                           customdata=[r[2] for r in rows],
                           hovertemplate="%{x}: %{y:,} tokens<br>%{customdata}<extra></extra>"))
    if exp.engine != "sglang":
        title = "What if: not for a vLLM log (the what-ifs recompute SGLang's arithmetic)"
    elif exp.what_if:
        title = "What if: the pool with one setting changed"
    else:
        title = live_or_static("What if: move a what-if control (fraction, KV dtype, TP, GPU) to compare",
                               "What if: no setting changed here (kvlab explain-log --what-if KEY=VALUE, or the "
                               "live notebook, recomputes the pool with one)")
    fig.update_traces(width=0.5 if exp.what_if else 0.3)
    fig.update_layout(template=TEMPLATE, title=title, yaxis_title="tokens", height=340, showlegend=False,
                      margin=dict(t=50, l=70, r=20, b=60))
    return fig


ASSUMED_BADGE = ("<span class='kvlab-assumed' style='background:#fff3d6;color:#8a5a00;border-radius:3px;"
                 "padding:0 4px;margin-right:4px'>assumed</span>")


def by_severity(findings) -> list:
    """Errors first, then warnings, then notes (each kind in the order found)."""
    order = {"error": 0, "warning": 1}
    return sorted(findings, key=lambda f: order.get(f.severity, 2))


def findings_html(exp) -> str:
    if not exp.findings:
        return "<p>No findings: the pool is what the readings and the rules give.</p>"
    colour = {"error": BUG_COLOUR, "warning": "#ff7f0e", "info": "#555"}
    items = "".join(f"<li><b style='color:{colour.get(f.severity, '#555')}'>{html.escape(f.severity)}</b> "
                    + (ASSUMED_BADGE if f.assumed else "")
                    + f"<code>{html.escape(f.id)}</code>: {html.escape(f.message)}"
                    + (f" <i class='kvlab-assumed-basis'>(assumed: rests on {html.escape('; '.join(f.assumed))})</i>"
                       if f.assumed else "") + "</li>" for f in by_severity(exp.findings))
    return f"<ul class='kvlab-findings-list'>{items}</ul>"


def contradiction_html(exp) -> str:
    """The error the summary starts with where the model config contradicts the log ("" where it does not)."""
    found = [f for f in exp.findings if f.id in CONTRADICTIONS]
    if not found:
        return ""
    items = "".join(f"<div><code>{html.escape(f.id)}</code>: {html.escape(f.message)}</div>" for f in found)
    return (f"<div class='kvlab-contradiction' style='border-left:4px solid {BUG_COLOUR};background:#fdecea;"
            f"padding:6px 10px;margin-bottom:6px'><b style='color:{BUG_COLOUR}'>error: the model config contradicts "
            f"the log</b>, so the pool below is not this server's: choose the served model's config above."
            f"{items}</div>")


def summary_html(exp, comparison=None, inputs: str = "") -> str:
    """The verdict table; ``inputs``: where a pasted log's model and GPU came from, in words."""
    lo, hi = exp.computed_range
    verdict = {True: "consistent with the log", False: "NOT consistent with the log",
               None: "the log printed no pool size"}[exp.consistent]
    if exp.consistency_rests_on and exp.consistent is not None:
        verdict += " (assumed: the readings were rebuilt to give the logged pool)"
    top = contradiction_html(exp)
    if top and exp.consistent is not None:
        verdict = "not judged: the model config contradicts the log (the error above)"
    logged = exp.max_total_num_tokens_logged
    rows = [("engine", f"{'SGLang' if exp.engine == 'sglang' else 'vLLM'} {exp.version or '?'} "
                       f"({exp.version_source})"),
            ("model · GPU · TP", f"{exp.model or '?'} · {exp.gpu or '?'} · {exp.tp_size}"),
            ("cell size", f"{exp.cell_size_bytes:,} B/token"),
            ("pool logged", "—" if logged is None else f"{logged:,} tokens"),
            ("pool computed", f"{exp.max_total_num_tokens_computed:,} tokens (print rounding allows {lo:,}–{hi:,}):"
                              f" {verdict}")]
    if comparison is not None:
        rows.append(("SGLang vs vLLM", f"{comparison.sglang.tokens:,} vs {comparison.vllm.tokens:,} tokens "
                                       f"({comparison.vllm.rule})"))
    if exp.assumed:
        rows.append(("assumed inputs", "; ".join(exp.assumed.values())))
    if inputs:
        rows.append(("inputs from the log", inputs))
    body = "".join(f"<tr><th style='text-align:left;padding-right:12px'>{html.escape(k)}</th>"
                   f"<td class='kvlab-summary-{i}'>{html.escape(v)}</td></tr>" for i, (k, v) in enumerate(rows))
    return f"{top}<table class='kvlab-summary-table'>{body}</table>"


def comparison_lacks(exp) -> str:
    """What the SGLang-vs-vLLM comparison lacks for this explanation, in words ("" where nothing)."""
    if exp.model_config is None or exp.device is None:
        need = [what for what, value in (("the model config", exp.model_config), ("the GPU", exp.device))
                if value is None]
        return f"needs {' and '.join(need)} (choose {'them' if len(need) > 1 else 'it'} above)"
    absent = exp.model_config.lacks()
    if absent:
        return (f"the config has no {', '.join(repr(f) for f in absent)}: the weights per rank and vLLM's "
                f"activation peak need them")
    return ""


# ---- the panel ---------------------------------------------------------------------------------------
class ServerPanel:
    """Paste or upload a log and a config, or pick an example; the pool explained, compared and what-iffed."""

    def __init__(self, example: str | None = "qwen3-235b-fp8-4xh100-sglang-0.4.9") -> None:
        self._make_inputs(example)
        self._make_what_if_controls()
        self.summary, self.findings = widgets.HTML(), widgets.HTML()
        self.waterfall, self.engines, self.gap, self.what_ifs = LiveFigure(), LiveFigure(), LiveFigure(), LiveFigure()
        for w, css in ((self.summary, "kvlab-summary"), (self.findings, "kvlab-findings"),
                       (self.waterfall, "kvlab-waterfall"), (self.engines, "kvlab-engines"),
                       (self.gap, "kvlab-gap"), (self.what_ifs, "kvlab-what-ifs")):
            w.add_class(css)
        inputs = widgets.VBox([widgets.HBox([self.example, self.log_upload]), self.log_text, self.vllm_text,
                               widgets.HBox([self.model, self.config_upload, self.gpu]), self.config_text])
        what_if = widgets.HBox([self.fraction, self.kv_dtype, self.tp, self.gpu_whatif],
                               layout=widgets.Layout(flex_flow="row wrap"))
        self.what_if_note = widgets.HTML()  # why a what-if control is off, where one is
        self.what_if_note.add_class("kvlab-whatif-note")
        what_if = widgets.VBox([what_if, self.what_if_note])
        self.asks = widgets.HTML()  # what a pasted log leaves for the user to choose (model config, GPU)
        self.asks.add_class("kvlab-asks")
        # a pasted log's own inputs (kvlab.serving.log_inputs); {input: the log it was chosen for} for the inputs
        # the user set ("model", "gpu", "vllm"): None = chosen before any log of theirs, so for the next one
        self.log_inputs, self._chosen = None, {}
        # the shared shell: an input error at the top, in place of every result of the old inputs
        self.shell = PanelShell([self.summary, self.waterfall, self.findings, self.engines, self.gap, self.what_ifs])
        self.status, self.errors = self.shell.status, self.shell.errors
        self.widget = self.shell.box(inputs, what_if, self.asks)
        self.widget.add_class("kvlab-server-panel")
        self.explanation = self.comparison = None
        self._quiet = False
        self._observe_inputs()
        self.shell.guard(self._load_example)()

    def _make_inputs(self, example: str | None) -> None:
        """The input widgets: the example or pasted / uploaded log, the vLLM log, the model config, the GPU."""
        from kvlab.device.spec import DEVICE_PRESETS
        from kvlab.model.hf_config import preset_names
        from kvlab.serving.examples import EXAMPLES, QWEN_FP8

        self._examples = {e.name: e for e in EXAMPLES}
        self.example = widgets.Dropdown(options=[PASTED, *self._examples], value=example or PASTED,
                                        description="example log", style={"description_width": "initial"},
                                        layout=widgets.Layout(width="460px"))
        self.log_text = widgets.Textarea(placeholder="paste an SGLang or vLLM start-up log here",
                                         layout=widgets.Layout(width="100%", height="140px"))
        self.log_upload = widgets.FileUpload(accept=".log,.txt", multiple=False, description="upload log")
        self.vllm_text = widgets.Textarea(placeholder="optional: the vLLM log of the same model, for the comparison",
                                          layout=widgets.Layout(width="100%", height="70px"))
        self.model = widgets.Dropdown(options=[QWEN_FP8, *preset_names(), PASTED, CHOOSE], value=QWEN_FP8,
                                      description="model config", style={"description_width": "initial"},
                                      layout=widgets.Layout(width="460px"))
        self.config_text = widgets.Textarea(placeholder="or paste a config.json (then pick '(pasted or uploaded)')",
                                            layout=widgets.Layout(width="100%", height="70px"))
        self.config_upload = widgets.FileUpload(accept=".json", multiple=False, description="upload config.json")
        self.gpu = widgets.Dropdown(options=[FROM_LOG, *sorted(DEVICE_PRESETS)], value=FROM_LOG, description="GPU")
        for w, css in ((self.example, "kvlab-example"), (self.log_text, "kvlab-log-text"),
                       (self.log_upload, "kvlab-log-upload"), (self.vllm_text, "kvlab-vllm-text"),
                       (self.model, "kvlab-model"), (self.config_text, "kvlab-config-text"),
                       (self.config_upload, "kvlab-config-upload"), (self.gpu, "kvlab-gpu")):
            w.add_class(css)

    def _make_what_if_controls(self) -> None:
        """The what-if controls: mem_fraction_static, KV dtype, TP and GPU."""
        from kvlab.device.spec import DEVICE_PRESETS

        style = {"description_width": "initial"}
        self.fraction = widgets.FloatSlider(value=0.88, min=0.5, max=0.97, step=0.01, description="what if: "
                                            "mem_fraction_static", continuous_update=False, style=style,
                                            layout=widgets.Layout(width="420px"))
        self.kv_dtype = widgets.Dropdown(options=KV_DTYPES, value="auto", description="what if: KV dtype", style=style)
        self.tp = widgets.Dropdown(options=TP_SIZES, value=1, description="what if: TP", style=style)
        self.gpu_whatif = widgets.Dropdown(options=[FROM_LOG, *sorted(DEVICE_PRESETS)], value=FROM_LOG,
                                           description="what if: GPU", style=style)
        for w, css in ((self.fraction, "kvlab-whatif-fraction"), (self.kv_dtype, "kvlab-whatif-dtype"),
                       (self.tp, "kvlab-whatif-tp"), (self.gpu_whatif, "kvlab-whatif-gpu")):
            w.add_class(css)

    def _observe_inputs(self) -> None:
        """Wire the inputs: the example and uploads load, every other change redraws (greyed, errors at the top)."""
        self._on_change = self.shell.guard(self._handle_change)  # greyed from the first change, errors at the top
        self.example.observe(self.shell.guard(self._load_example), names="value")
        self.log_upload.observe(self.shell.guard(self._uploaded_log), names="value")
        self.config_upload.observe(self.shell.guard(self._uploaded_config), names="value")
        for w in (self.log_text, self.vllm_text, self.model, self.config_text, self.gpu, self.fraction, self.kv_dtype,
                  self.tp, self.gpu_whatif):
            w.observe(self._on_change, names="value")
        for w, what in ((self.model, "model"), (self.config_text, "model"), (self.gpu, "gpu"),
                        (self.vllm_text, "vllm")):
            w.observe(lambda change, what=what: self._chose(what), names="value")

    # ---- inputs ------------------------------------------------------------------------------------
    def _load_example(self, change=None) -> None:
        ex = self._examples.get(self.example.value)
        if ex is None:
            return
        from kvlab.serving.examples import LOG_DIR

        pair = {"qwen3-235b-fp8-4xh100-sglang-0.4.9": "qwen3-235b-fp8-4xh100-vllm-0.10.1.1"}.get(ex.name)
        self.log_inputs, self._chosen, self.asks.value = None, {}, ""  # the example's inputs are its own
        self._set_quietly(log_text=(LOG_DIR / ex.filename).read_text(encoding="utf-8"),
                          vllm_text=(LOG_DIR / f"{pair}.log").read_text(encoding="utf-8") if pair else "",
                          model=ex.model, gpu=ex.gpu, tp=ex.tp_size, gpu_whatif=FROM_LOG, kv_dtype="auto")
        self._refresh(reset_fraction=True)

    def _set_quietly(self, target=None, **values) -> None:
        """Set widget values (``name=value``) — or ``target``'s traits — without recomputing on each."""
        self._quiet = True
        try:
            for name, value in values.items():
                if target is not None:
                    setattr(target, name, value)
                else:
                    getattr(self, name).value = value
        finally:
            self._quiet = False

    @staticmethod
    def _upload_text(value) -> str | None:
        files = list(value.values()) if isinstance(value, dict) else list(value or ())
        if not files:
            return None
        content = files[0]["content"]
        return bytes(content).decode("utf-8", errors="replace")

    def _uploaded_log(self, change) -> None:
        text = self._upload_text(change["new"])
        if text is not None:
            self._set_quietly(example=PASTED, log_text=text)
            self._take_log_inputs()
            self._refresh(reset_fraction=True)

    def _uploaded_config(self, change) -> None:
        text = self._upload_text(change["new"])
        if text is not None:
            self._set_quietly(config_text=text, model=PASTED)
            self._chose("model")
            self._refresh()

    def _handle_change(self, change) -> None:
        if self._quiet:
            return
        if change["owner"] is self.log_text:
            self._set_quietly(example=PASTED)
            self._take_log_inputs()
        self._refresh(reset_fraction=change["owner"] in (self.log_text, self.model, self.gpu))

    def _chose(self, what: str) -> None:
        """The user set ``what`` ("model", "gpu", "vllm"): it belongs to the pasted log shown now, or, while an
        example's log is shown, to the next log the user pastes."""
        if not self._quiet:
            self._chosen[what] = self.log_inputs.signature if self.log_inputs is not None else None

    def _take_log_inputs(self) -> None:
        """A pasted or uploaded log starts from its own inputs (kvlab.serving.log_inputs): the model config and the
        GPU it implies (or "choose"), no vLLM log of another server, no what-if of another log. What the user chose
        for this log (or before pasting it) stays; what an example or another log left does not."""
        from kvlab.serving.log_inputs import log_inputs

        self.asks.value = ""
        if not self.log_text.value.strip():
            return
        new = log_inputs(self.log_text.value, "the log")  # not a log: the same one-line error explain gives
        same_server = self.log_inputs is not None and new.signature == self.log_inputs.signature
        self.log_inputs = new
        kept = {what for what, owner in self._chosen.items() if owner is None or owner == new.signature}
        self._chosen = {what: new.signature for what in kept}
        values = {"model": new.model or CHOOSE, "gpu": new.gpu or FROM_LOG, "vllm_text": ""}
        values = {k: v for k, v in values.items() if k.removesuffix("_text") not in kept}
        if not same_server:
            values.update(kv_dtype="auto", gpu_whatif=FROM_LOG)
        self._set_quietly(**values)

    # ---- the controller ----------------------------------------------------------------------------
    def model_config(self):
        from kvlab.model.hf_config import config_from_dict, config_json_from_text
        from kvlab.serving.log_inputs import load_shipped
        from kvlab.serving.sglang_log import LogError

        if self.model.value == CHOOSE:
            raise LogError("no model config: choose one (the model config menu)")
        if self.model.value != PASTED:
            return load_shipped(self.model.value)
        text = self.config_text.value.strip()
        if not text:
            return None
        data = config_json_from_text(text, "pasted config.json")  # (no JSON, too deep, no object: named)
        return config_from_dict(data, name=str(data.get("_name_or_path") or "pasted config"),
                                origin="pasted config.json")

    def what_if_items(self, exp) -> list[str]:
        items = []
        if exp.engine != "sglang":
            return items
        if round(self.fraction.value, 2) != round(exp.mem_fraction_static, 2):  # the slider holds 2 decimals
            items.append(f"mem_fraction_static={self.fraction.value:g}")
        if self.kv_dtype.value != "auto" and exp.kv_dtype_bytes is not None:
            items.append(f"kv_cache_dtype={self.kv_dtype.value}")
        if self.tp.value != exp.tp_size and exp.model_config is not None and not exp.model_config.lacks():
            # (a config without the weights' fields cannot scale what loading took: findings say which fields)
            items.append(f"tp={self.tp.value}")
        if self.gpu_whatif.value != FROM_LOG and exp.device is not None:
            items.append(f"gpu={self.gpu_whatif.value}")
        return items

    def explain(self):
        """(explanation, comparison or None) for what the controls hold now."""
        from kvlab.serving.engine_compare import compare_explanation
        from kvlab.serving.sglang_log import LogError
        from kvlab.serving.vllm_log import parse_vllm_log

        text = self.log_text.value
        name = "the log" if self.example.value == PASTED else self.example.value
        if not text.strip():
            raise LogError("no log: paste a start-up log, upload one, or pick an example")
        config = self.model_config()
        gpu = None if self.gpu.value == FROM_LOG else self.gpu.value
        exp = explain_text(text, name, model_config=config, gpu=gpu)
        items = self.what_if_items(exp)
        if items:
            from kvlab.serving.whatif import apply_what_ifs

            exp.what_if = apply_what_ifs(exp, items)
        comparison = None
        if not comparison_lacks(exp):
            if exp.engine == "vllm":
                vllm_log = parse_vllm_log(text, name)
            elif self.vllm_text.value.strip():
                vllm_log = parse_vllm_log(self.vllm_text.value, "the vLLM log")
            else:
                vllm_log = None
            comparison = compare_explanation(exp, vllm_log=vllm_log)
        return exp, comparison

    def _refresh(self, reset_fraction: bool = False) -> None:
        with self.shell.showing("the explanation"):
            self._draw(reset_fraction)
        if self.model.value == CHOOSE:  # nothing computed: no result of other inputs stays beside the question
            self.shell.results.layout.display = "none"

    def asks_html(self, exp=None) -> str:
        """What the pasted log leaves for the user to choose, in words ("" where nothing): the model config (then
        nothing is computed) and the GPU (the comparison and the GPU what-if need it)."""
        li, parts = self.log_inputs, []
        if self.model.value == CHOOSE:
            why = li.model_source if li is not None else "no model config chosen"
            parts.append(f"<b>Choose the model config</b> (the menu above: a preset, or paste or upload its "
                         f"config.json and pick '{PASTED}'): {html.escape(why)}. Nothing is computed until then.")
        if exp is not None and exp.device is None:
            why = li.gpu_source if li is not None else "no GPU chosen"
            parts.append(f"<b>Choose the GPU</b> (the GPU menu above): {html.escape(why)}. The pool needs none here; "
                         f"the SGLang-vs-vLLM comparison and the GPU what-if do.")
        return "".join(f"<div class='kvlab-ask' style='border-left:4px solid #ff7f0e;background:#fff6ec;"
                       f"padding:6px 10px;margin:4px 0'>{p}</div>" for p in parts)

    def inputs_words(self) -> str:
        """Where the pasted log's model config and GPU came from ("" for an example's log)."""
        li = self.log_inputs
        if li is None:
            return ""
        model = ("your choice" if "model" in self._chosen else li.model_source)
        gpu = ("your choice" if "gpu" in self._chosen and self.gpu.value != FROM_LOG else li.gpu_source)
        return f"model: {model}; GPU: {gpu}; TP {li.tp_size}"

    def _draw(self, reset_fraction: bool) -> None:
        self.asks.value = ""
        if self.model.value == CHOOSE:
            self.explanation = self.comparison = None
            self.asks.value = self.asks_html()
            return
        exp, comparison = self.explain()
        if reset_fraction:  # the log's own TP (a vLLM log's too: no other log's stays beside it) and fraction
            if exp.tp_size not in self.tp.options:  # a TP size the menu lacks (e.g. 3): offer it
                self._set_quietly(options=tuple(sorted({*TP_SIZES, exp.tp_size})), target=self.tp)
            fraction = {} if exp.mem_fraction_static is None else {"fraction": round(exp.mem_fraction_static, 2)}
            self._set_quietly(tp=exp.tp_size, **fraction)
            if exp.what_if:
                exp, comparison = self.explain()
        self.explanation, self.comparison = exp, comparison
        self._enable_what_ifs(exp)
        self.asks.value = self.asks_html(exp)
        self.summary.value = summary_html(exp, comparison, self.inputs_words())
        self.findings.value = "<h4>Findings</h4>" + findings_html(exp)
        self.waterfall.draw(explanation_waterfall(exp))
        if comparison is not None:
            self.engines.draw(engine_waterfalls(comparison))
            self.gap.draw(gap_bars(comparison))
        else:
            note = go.Figure().update_layout(template=TEMPLATE, height=120, title=f"SGLang vs vLLM: "
                                             f"{comparison_lacks(exp)}", xaxis_visible=False, yaxis_visible=False)
            self.engines.draw(note)
            self.gap.draw(note)
        self.what_ifs.draw(what_if_figure(exp))

    def what_if_reasons(self, exp) -> dict:
        """{control: why it does nothing for ``exp``} for each what-if control that does not apply."""
        if exp.engine != "sglang":
            return {w: WHAT_IF_VLLM for w in (self.fraction, self.kv_dtype, self.tp, self.gpu_whatif)}
        out = {}
        if exp.kv_dtype_bytes is None:
            out[self.kv_dtype] = "KV dtype: the cell size came from the log's K/V sizes, not a config"
        if exp.model_config is None or exp.model_config.lacks():
            out[self.tp] = ("TP: the config lacks the weights' fields, so what loading took cannot be rescaled"
                            if exp.model_config is not None else "TP: needs the model config")
        if exp.device is None:
            out[self.gpu_whatif] = "GPU: the log names no GPU and none is chosen above"
        return out

    def _enable_what_ifs(self, exp) -> None:
        """Disable the what-if controls that do not apply to ``exp`` and say why under them."""
        reasons = self.what_if_reasons(exp)
        for w in (self.fraction, self.kv_dtype, self.tp, self.gpu_whatif):
            w.disabled = w in reasons
        self.fraction.readout = self.fraction not in reasons  # no stale SGLang fraction beside a vLLM log
        why = list(dict.fromkeys(reasons.values()))
        self.what_if_note.value = ("" if not why else "<div class='kvlab-whatif-off' style='color:#8a5a00'>"
                                   + "<br>".join(f"what-if off: {html.escape(w)}" for w in why) + "</div>")

    def refresh(self) -> None:
        self.shell.guard(self._refresh)()
