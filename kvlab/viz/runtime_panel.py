"""Notebook 05's runtime section as a live panel (issue 36): paste or upload a server log with its runtime lines,
or keep the example; its timeline figure and the text ``kvlab explain-log`` prints for it."""

from __future__ import annotations

import html

import ipywidgets as widgets

from kvlab.viz.live import LiveFigure
from kvlab.viz.widgets import PanelShell

EXAMPLE = "multi-turn-chat-20k-sglang-0.5.23-rendered.log"


def runtime_example_path():
    """The example runtime log kvlab ships (data/examples/runtime_logs/, see data/README.md)."""
    from kvlab.serving.examples import DATA_DIR

    return DATA_DIR / "examples" / "runtime_logs" / EXAMPLE


def read_pasted(text: str, name: str = "(pasted log)"):
    """The timeline and its JSON for pasted text; a LogError where it holds no readable runtime line."""
    from kvlab.serving.runtime.report import has_readings, runtime_json, runtime_timeline
    from kvlab.serving.sglang_log import LogError

    tl = runtime_timeline(text=text, name=name)
    if not has_readings(tl):
        raise LogError(f"{name}: no runtime line (SGLang's 'Prefill batch' / 'Decode batch', vLLM's 'Avg prompt "
                       f"throughput') in its {tl.log.n_lines} lines")
    return tl, runtime_json(tl)


class RuntimePanel:
    """Paste or upload a log; its runtime timeline drawn, with the findings as the CLI prints them."""

    def __init__(self) -> None:
        self.log_text = widgets.Textarea(placeholder="paste your server's log here (Prefill / Decode lines)",
                                         layout=widgets.Layout(width="100%", height="120px"))
        self.upload = widgets.FileUpload(accept=".log,.txt", multiple=False, description="upload log")
        self.read = widgets.Button(description="read the pasted log")
        self.summary, self.figure = widgets.HTML(), LiveFigure()
        self.summary.add_class("kvlab-runtime-summary")
        self.figure.add_class("kvlab-runtime-figure")
        self.shell = PanelShell([self.summary, self.figure])
        self.widget = self.shell.box(widgets.HBox([self.upload, self.read]), self.log_text)
        self.widget.add_class("kvlab-runtime-panel")
        self.timeline = self.data = None
        self.read.on_click(self.shell.guard(lambda _: self.show(self.log_text.value, "(pasted log)")))
        self.upload.observe(self.shell.guard(self._uploaded), names="value")
        self.shell.guard(self.show)(runtime_example_path().read_text(encoding="utf-8"), EXAMPLE)

    def _uploaded(self, change) -> None:
        files = list(change["new"].values()) if isinstance(change["new"], dict) else list(change["new"] or ())
        if files:
            self.show(bytes(files[0]["content"]).decode("utf-8", errors="replace"), files[0].get("name", "upload"))

    def show(self, text: str, name: str) -> None:
        from kvlab.serving.runtime.report import format_runtime
        from kvlab.viz.runtime_plots import runtime_timeline_figure

        with self.shell.showing("reading the log"):
            self.timeline, self.data = read_pasted(text, name)
            self.summary.value = f"<pre>{html.escape(format_runtime(self.data))}</pre>"  # escaped: a log's text shown, never run
            self.figure.draw(runtime_timeline_figure(self.timeline, title=f"Runtime: {name}"))
