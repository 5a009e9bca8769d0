"""Notebook 07's live panel for the multi-turn benchmark on three tiers (sglang#33984's question): the storage
prefetch policy and the host ratio as controls; per round, where the hits came from (stacked bars), the per-round
table beside it and the drop-off in words. Runs come from :mod:`kvlab.experiments.multiturn_tiers` (cached per
setting); the static report shows the default setting (``--hicache-ratio 2``, ``best_effort``)."""

from __future__ import annotations

import html

import ipywidgets as widgets

from kvlab.viz.live import LiveFigure
from kvlab.viz.multiturn_plots import round_tier_bars
from kvlab.viz.widgets import PanelShell


def rounds_html(table) -> str:
    """The per-round table (``multiturn_tiers.rounds_table``) as HTML."""
    return table.to_html(classes="kvlab-rounds-table", border=0)


def dropoff_html(frame, setting) -> str:
    """One line: where the setting's rounds first fall below the no-eviction ideal, and by how much at the end."""
    below = frame[frame["cache_hit_rate"] < frame["ideal_hit_rate"] - 5e-7]
    last = frame.iloc[-1]
    if below.empty:
        text = (f"{setting.label()}: every round on the no-eviction ideal (last round "
                f"{last.cache_hit_rate:.6f}).")
    else:
        text = (f"{setting.label()}: below the no-eviction ideal from round {int(below['round'].iloc[0])}; last "
                f"round {last.cache_hit_rate:.6f} against {last.ideal_hit_rate:.6f}, storage hits "
                f"{int(frame['storage_hit_tokens'].sum()):,} tokens.")
    return f"<p class='kvlab-dropoff-verdict'>{html.escape(text)}</p>"


def _row() -> widgets.Layout:
    """A row that wraps (the table goes below the bars on a narrow page), as the other panels' rows."""
    return widgets.Layout(flex_flow="row wrap", align_items="flex-start")


class MultiturnTierPanel:
    """Prefetch policy × host ratio, storage unbounded (the file backend's default), shortfall eviction."""

    def __init__(self) -> None:
        from kvlab.experiments import multiturn_tiers as mt

        self._mt = mt
        self.policy = widgets.ToggleButtons(options=list(mt.PREFETCH_POLICIES), value=mt.DEFAULT.prefetch_policy,
                                            description="prefetch")
        self.ratio = widgets.Dropdown(options=[(f"{r:g}", r) for r in mt.HOST_RATIOS], value=mt.DEFAULT.host_ratio,
                                      description="host ratio")
        self.policy.add_class("kvlab-prefetch-policy")
        self.ratio.add_class("kvlab-host-ratio")
        self.bars = LiveFigure()
        self.table = widgets.HTML()
        self.verdict = widgets.HTML()
        self.command = widgets.HTML()
        for w, css in ((self.bars, "kvlab-tier-bars"), (self.bars, "kvlab-fig-grow"), (self.table, "kvlab-rounds-table-box"),
                       (self.table, "kvlab-side-table"), (self.verdict, "kvlab-dropoff"),
                       (self.command, "kvlab-tier-command")):
            w.add_class(css)
        self.shell = PanelShell([self.verdict, widgets.HBox([self.bars, self.table], layout=_row()),
                                 self.command])
        self.widget = self.shell.box(widgets.HBox([self.policy, self.ratio], layout=_row()))
        self.widget.add_class("kvlab-multiturn-panel")
        self._on_change = self.shell.guard(lambda _change: self._refresh())
        for w in (self.policy, self.ratio):
            w.observe(self._on_change, names="value")
        self.refresh()

    def setting(self):
        return self._mt.TierSetting(float(self.ratio.value), self.policy.value)

    def frame(self):
        return self._mt.tier_rounds(self._mt.run(self.setting()))

    def refresh(self) -> None:
        self.shell.guard(self._refresh)()

    def _refresh(self) -> None:
        setting = self.setting()
        busy = None if self._mt.has_run(setting) else f"the benchmark with {setting.label()}"
        with self.shell.showing(busy):
            frame = self.frame()
            title = f"Where each round's hits came from:<br>{setting.label()}"
            self.bars.draw(lambda: round_tier_bars(frame, title), key=setting)
            self.table.value = rounds_html(self._mt.rounds_table(frame))
            self.verdict.value = dropoff_html(frame, setting)
            self.command.value = ("<code>kvlab simulate " +
                                  html.escape(" ".join(setting.cli_args())) + " --json</code>")
