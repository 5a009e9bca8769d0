"""Errors raised inside widget callbacks land in the panel's ``kvlab-errors`` Output, not in the kernel log.

ipywidgets' default sends an observer's exception to the log (JupyterLab's log console), where a learner
never looks, and the panel silently keeps its old numbers. These tests trigger real errors in the real
experiment code through the panels' controls.
"""

import pytest

from kvlab.viz.widgets import KVPoolPanel, ShortfallPanel, show_errors


def _error_text(panel) -> str:
    return "".join(o.get("text", "") for o in panel.errors.outputs if o.get("output_type") == "stream")


def test_panels_have_an_errors_output_with_the_css_class():
    panel = KVPoolPanel("llama-8b-l4")
    assert "kvlab-errors" in panel.errors._dom_classes and panel.errors in panel.widget.children
    # at the top: above the results box, not below a tall panel's last figure
    assert panel.widget.children.index(panel.errors) < panel.widget.children.index(panel.shell.results)
    assert _error_text(panel) == ""


@pytest.mark.slow
def test_a_kv_pool_callback_error_is_shown_then_cleared():
    panel = KVPoolPanel("llama-8b-l4")
    verdict_before = panel.verdict.value
    panel.device = "sim:bogus"  # the next setting not in the cache re-runs the experiment on it
    panel.fraction.value = 0.7  # must not raise out of the trait assignment
    text = _error_text(panel)
    assert "Traceback" in text and "ValueError" in text and "unknown device preset 'bogus'" in text
    assert panel.verdict.value == verdict_before and not panel.shell.shown  # the old results hidden, not beside it
    panel.device = None
    panel.fraction.value = 0.75
    assert _error_text(panel) == ""  # the next good update clears the old error
    assert "data-max-total-num-tokens=" in panel.verdict.value and panel.verdict.value != verdict_before
    assert panel.shell.shown


def test_an_error_in_the_first_draw_is_shown_too():
    panel = KVPoolPanel("llama-8b-l4", device="sim:bogus")
    assert "unknown device preset 'bogus'" in _error_text(panel)


def test_a_shortfall_callback_error_is_shown():
    from tests.viz.test_shortfall_panel import SMALL

    panel = ShortfallPanel(SMALL)
    panel._sizes["few-shot"] = (("num_requests", -1),)
    panel.workload.value = "few-shot"
    assert "num_requests must be an int >= 1, got -1" in _error_text(panel)
    panel.workload.value = "generated-shared-prefix"  # cached: redraws without error
    assert _error_text(panel) == ""


def test_show_errors_returns_the_callbacks_value_and_swallows_only_exceptions():
    panel = KVPoolPanel("llama-8b-l4")
    assert show_errors(panel.errors, lambda: 42)() == 42
    assert show_errors(panel.errors, lambda: 1 / 0)() is None
    assert "ZeroDivisionError" in _error_text(panel)
    with pytest.raises(KeyboardInterrupt):  # not an Exception: an interrupt must still stop the kernel
        show_errors(panel.errors, lambda: (_ for _ in ()).throw(KeyboardInterrupt()))()
