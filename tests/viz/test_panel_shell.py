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


def _record_shell(shell, events: list[str], drawn: dict) -> None:
    """Like ``_record`` for any panel: the results' greying, and each drawn widget's trait (name -> (widget,
    trait))."""
    def on_classes(change):
        was, now = "kvlab-stale" in change["old"], "kvlab-stale" in change["new"]
        if was != now:
            events.append("stale" if now else "fresh")

    shell.results.observe(on_classes, names="_dom_classes")
    for name, (widget, trait) in drawn.items():
        widget.observe(lambda _c, name=name: events.append(name), names=trait)


def _layout_is_the_shells(panel) -> None:
    """Controls, then the busy line and the errors, then the results: the errors above every result."""
    children = list(panel.widget.children)
    assert panel.shell.style in children and panel.status.widget in children
    assert children.index(panel.status.widget) < children.index(panel.errors) < children.index(panel.shell.results)
    assert "kvlab-errors" in panel.errors._dom_classes and "kvlab-results" in panel.shell.results._dom_classes


def test_the_tree_panel_greys_the_old_tree_from_a_click_until_the_new_one_is_drawn():
    from kvlab.viz.tree_widget import TreeDemoPanel

    panel = TreeDemoPanel(start_requests=6, seed=0)
    _layout_is_the_shells(panel)
    assert panel.tree.widget in panel.shell.results.children and panel.log in panel.shell.results.children
    events: list[str] = []
    _record_shell(panel.shell, events, {"tree": (panel.tree.figure, "_widget_data"), "log": (panel.log, "value")})
    panel.mode.value = "full"  # the log names the mode: redrawn, not left saying "shortfall"
    assert events == ["stale", "log", "fresh"] and "data-mode='full'" in panel.log.value
    events.clear()
    panel.pressure_button.click()
    assert events[0] == "stale" and events[-1] == "fresh" and {"tree", "log"} <= set(events[1:-1]), events
    assert "__gone__" in panel.tree.figure.data[0].ids and not panel.shell.stale and panel.shell.shown


def test_a_step_the_tree_demo_refuses_shows_at_the_top_and_leaves_the_tree_it_is_still_true():
    from kvlab.viz.tree_widget import TreeDemoPanel

    panel = TreeDemoPanel(num_requests=1)
    panel.next_button.click()
    ids = list(panel.tree.figure.data[0].ids)
    panel.next_button.click()  # none left (a click that slips past the disabled button)
    assert "all 1 requests have run" in "".join(o.get("text", "") for o in panel.errors.outputs)
    assert panel.shell.shown and not panel.shell.stale and list(panel.tree.figure.data[0].ids) == ids
    panel.reset_button.click()  # the next step clears the error
    assert not panel.errors.outputs and list(panel.tree.figure.data[0].ids) == ["0"]


def test_a_tree_drawing_that_fails_hides_the_old_tree():
    from kvlab.viz.tree_widget import TreeDemoPanel

    panel = TreeDemoPanel(start_requests=2, seed=0)
    panel.tree.max_nodes = "many"  # a bad value set after the fact: the next drawing raises
    panel.next_button.click()
    assert "Traceback" in "".join(o.get("text", "") for o in panel.errors.outputs)
    assert not panel.shell.shown and not panel.shell.stale


def test_the_host_tier_panel_keeps_the_shell_and_its_write_policy_menu():
    from kvlab.viz.tree_widget import HostTierPanel

    panel = HostTierPanel(start_requests=3, seed=0)
    _layout_is_the_shells(panel)
    assert panel.write_policy in panel.controls.children
    events: list[str] = []
    _record_shell(panel.shell, events, {"tree": (panel.tree.figure, "_widget_data")})
    panel.write_policy.value = "write_back"  # replays the same steps under it
    assert events[0] == "stale" and "tree" in events and events[-1] == "fresh", events


def test_the_capacity_panel_greys_the_old_curve_until_the_new_one_and_its_table_are_drawn():
    from kvlab.experiments import capacity
    from kvlab.viz.capacity_plots import CapacityPanel
    from tests.viz.test_capacity_plots import TINY

    panel = CapacityPanel(capacity.run(TINY, pool_pages=[7, 12], max_running=[1, 256], workers=1, progress=False))
    _layout_is_the_shells(panel)
    children = list(panel.widget.children)
    assert children.index(panel.verdict) < children.index(panel.running) < children.index(panel.shell.results)
    events: list[str] = []
    _record_shell(panel.shell, events, {"curve": (panel.curve, "_widget_layout"), "hits": (panel.hits, "value")})
    panel.running.value = 1
    assert events[0] == "stale" and events[-1] == "fresh" and {"curve", "hits"} <= set(events[1:-1]), events
    assert "max running 1" in panel.curve.figure.layout.title.text and not panel.shell.stale
