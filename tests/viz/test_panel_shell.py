"""No stale moment (issue 25 item 1), headless: the panels' shared shell (``kvlab.viz.widgets.PanelShell``).

While a new setting is computed the results of the old one are greyed out (class ``kvlab-stale`` on the
results box, synced before the computation starts) and stay so until the new figures and tables are sent; an
input error hides every result of the old inputs and shows the error above where they were. The browser tests
(``tests/browser/test_no_stale_moment.py``) watch the same classes in a page.
"""

from __future__ import annotations

from kvlab.serving.examples import EXAMPLES
from kvlab.viz.server_panel import ServerPanel
from kvlab.viz.widgets import PANEL_CSS, KVPoolPanel


def _record(panel, events: list[str]) -> None:
    """Append, in order, each change of the results' classes and of every drawn figure / table / verdict."""
    results = panel.shell.results

    def on_classes(change):
        was, now = "kvlab-stale" in change["old"], "kvlab-stale" in change["new"]
        if was != now:
            events.append("stale" if now else "fresh")

    results.observe(on_classes, names="_dom_classes")
    panel.waterfall.observe(lambda _c: events.append("waterfall"), names="_widget_layout")
    panel.timelines.observe(lambda _c: events.append("timelines"), names="_widget_layout")
    panel.table.observe(lambda _c: events.append("table"), names="value")
    panel.verdict.observe(lambda _c: events.append("verdict"), names="value")


def test_a_new_setting_greys_the_old_results_until_every_new_one_is_sent():
    panel = KVPoolPanel("llama-8b-l4")
    events: list[str] = []
    _record(panel, events)
    panel.fraction.value = 0.8  # not computed before: 2-4 s in a kernel
    assert events[0] == "stale" and events[-1] == "fresh", events
    assert {"waterfall", "timelines", "table", "verdict"} <= set(events[1:-1]), events
    assert not panel.shell.stale and panel.shell.shown and panel.status.widget.value == ""
    events.clear()
    panel.gc_toggle.value = not panel.gc_toggle.value  # cached: redrawn at once (greyed only while it runs)
    assert events[0] == "stale" and events[-1] == "fresh" and {"waterfall", "table", "verdict"} <= set(events)
    assert panel.status.widget.value == ""  # no "computing" line for a setting computed before


def test_the_busy_sign_is_css_not_an_emoji():
    panel = KVPoolPanel("llama-8b-l4")
    seen: list[str] = []
    panel.status.widget.observe(lambda change: seen.append(change["new"]), names="value")
    panel.fraction.value = 0.81
    busy = seen[0]
    assert "kvlab-spinner" in busy and "aria-busy='true'" in busy and "computing" in busy
    assert all(ord(ch) < 0x2000 or ch == "…" for ch in busy), busy  # no ⏳ (a box in fonts without emoji)
    assert ".kvlab-spinner{" in PANEL_CSS and "@keyframes" in PANEL_CSS and ".kvlab-stale{" in PANEL_CSS
    assert panel.shell.style in panel.widget.children


def test_an_error_hides_every_old_result_and_shows_at_the_top():
    panel = ServerPanel()
    children = list(panel.widget.children)
    assert children.index(panel.errors) < children.index(panel.shell.results)  # above the results
    assert panel.summary in panel.shell.results.children and panel.what_ifs in panel.shell.results.children
    assert "consistent with the log" in panel.summary.value and panel.shell.shown

    panel.log_text.value = "this is not a start-up log\n"
    text = "".join(o.get("text", "") for o in panel.errors.outputs)
    assert text.startswith("kvlab: error: the log: not an SGLang or vLLM start-up log"), text
    assert not panel.shell.shown and panel.shell.results.layout.display == "none"  # old figures and summary gone
    assert not panel.shell.stale

    panel.example.value = EXAMPLES[2].name  # a good input again: the new results, the error gone
    assert panel.shell.shown and not panel.errors.outputs
    assert "consistent with the log" in panel.summary.value or "NOT consistent" in panel.summary.value


def test_an_error_while_computing_a_new_setting_hides_the_results_of_the_old_one():
    panel = KVPoolPanel("llama-8b-l4")
    panel.device = "sim:bogus"
    panel.fraction.value = 0.7
    assert "unknown device preset 'bogus'" in "".join(o.get("text", "") for o in panel.errors.outputs)
    assert not panel.shell.shown and not panel.shell.stale
    panel.device = None
    panel.fraction.value = 0.72
    assert panel.shell.shown and not panel.errors.outputs
