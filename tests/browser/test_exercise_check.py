"""Notebook 01's exercise in a real JupyterLab: the stub's check says NOT YET; type the fix into the cell's
editor, run it and the check, and the same ``.kvlab-check`` box says PASS with the fixed pool's numbers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from kvlab.experiments import kv_pool_sizing
from kvlab.labs import kv_pool_sizing as pool_lab

from . import lab
from .lab import LabServer

NOTEBOOK = "notebooks/01_kv_pool_sizing.ipynb"


@pytest.mark.browser
@pytest.mark.slow
def test_typing_the_fix_flips_the_check_from_not_yet_to_pass(lab_page: Page, lab_server: LabServer, tmp_path: Path):
    no_gc, with_gc = kv_pool_sizing.compare("sglang-pr-4xh200")
    lab.open_notebook(lab_page, lab_server, NOTEBOOK)
    lab.run_all(lab_page, timeout=600_000)
    check = lab_page.locator(".kvlab-check")
    expect(check).to_contain_text("NOT YET", timeout=60_000)
    expect(check).to_contain_text(f"you gave {no_gc.max_total_num_tokens:,}")
    assert "kvlab-check-fail" in check.get_attribute("class")
    hidden = os.environ.get("KVLAB_SOLUTIONS", "") in ("", "0")
    expect(lab_page.locator(".kvlab-solution-hidden" if hidden else ".kvlab-solution")).to_have_count(1)
    lab.screenshot(lab_page, tmp_path / "not-yet.png", ".kvlab-check")

    cell = lab_page.locator(".jp-CodeCell", has=lab_page.locator(".cm-content", has_text="def my_measure("))
    editor = cell.locator(".cm-content")
    editor.click()
    lab_page.keyboard.press("ControlOrMeta+a")
    lab_page.keyboard.insert_text(pool_lab.measure.solution.code)  # as pasted: no auto-indent
    expect(editor).to_contain_text("gc.collect()")
    lab_page.keyboard.press("Shift+Enter")  # run the exercise cell; the check cell is selected next
    lab_page.keyboard.press("Shift+Enter")  # run the check

    expect(check).to_contain_text("PASS", timeout=60_000)
    text = check.inner_text()
    assert "NOT YET" not in text and "kvlab-check-pass" in check.get_attribute("class")
    assert f"max_total_num_tokens: {with_gc.max_total_num_tokens:,}" in text
    assert f"free bytes your measurement read: {with_gc.reading.free_bytes:,}" in text
    lab.wait_kernel_idle(lab_page)
    lab.screenshot(lab_page, tmp_path / "pass.png", ".kvlab-check")
