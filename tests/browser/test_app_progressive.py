"""``kvlab app 01`` in a real browser: the page says what is running while the notebook runs, and the live panel
(the cell tagged ``dashboard``) is the first thing it shows, under the title, before the rest of the notebook
has run (Voila's progressive rendering, over kvlab's reordered copy)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from . import lab

# The page's state the first time the panel is on screen, read in the page itself (no polling round trips).
_WHEN_PANEL_SHOWS = """
async (limitMs) => {
  const shown = el => !!el && el.offsetParent !== null && el.getBoundingClientRect().height > 0;
  const t0 = performance.now();
  while (performance.now() - t0 < limitMs) {
    const panel = document.querySelector('.kvlab-kv-pool-panel');
    if (shown(panel)) {
      const cells = document.querySelectorAll('#rendered_cells [cell-index]');
      const last = cells[cells.length - 1];
      const line = document.getElementById('kvlab-app-progress');
      return {
        y: panel.getBoundingClientRect().top,
        cells: cells.length,
        waiting: document.querySelectorAll('#rendered_cells .voila-skeleton-container').length,
        lastWaiting: !!last.querySelector('.voila-skeleton-container'),
        lastOutputs: last.querySelectorAll('.jp-OutputArea-output').length,
        lineShown: shown(line),
        lineText: line ? line.innerText : '',
        state: document.body.getAttribute('data-kvlab-app'),
        seconds: (performance.now() - t0) / 1000,
      };
    }
    await new Promise(r => setTimeout(r, 20));
  }
  return null;
}
"""


@pytest.fixture
def kvlab_app(tmp_path: Path) -> Iterator[str]:
    """``kvlab app 01`` (the real CLI, :func:`lab.kvlab_app`); yields the URL it printed (with its token) once it
    answers HTTP; stopped with SIGINT afterwards."""
    with lab.kvlab_app(tmp_path, "01") as app:
        printed = app.wait_for(lab.APP_SERVING, 120, ready=app.listening)
        assert printed.group(1).startswith(app.url) and "?token=" in printed.group(1), printed.group(1)
        yield printed.group(1)
    assert app.process.returncode == 0, app.log()[-3000:]


@pytest.mark.browser
@pytest.mark.slow
def test_app_01_shows_a_progress_line_then_the_panel_first_near_the_top(kvlab_app: str, context: BrowserContext,
                                                                        artifacts: Path):
    page = context.new_page()
    page.goto(kvlab_app, wait_until="commit")

    # While the kernel starts and the cells run: a line naming the notebook, not a bare spinner.
    line = page.locator("#kvlab-app-progress")
    expect(line).to_be_visible(timeout=60_000)
    expect(line).to_contain_text("Running 01 · Sizing the KV pool")
    expect(line).to_contain_text("the live panel appears first")
    lab.screenshot(page, artifacts / "app01_loading.png", selector=None)

    # The panel shows while the notebook's last cell has not run yet, right under the title.
    first = page.evaluate(_WHEN_PANEL_SHOWS, 240_000)
    lab.screenshot(page, artifacts / "app01_panel_first.png", selector=None)
    print(f"[kvlab] when the panel showed: {first}")
    assert first is not None, "the panel never showed"
    assert first["lastWaiting"] and first["lastOutputs"] == 0, first  # progressive: the rest still to come
    assert first["y"] < 400, first  # near the top, at 1400×1000
    assert first["lineShown"] and first["state"] == "running", first
    assert f" of {first['cells']}" in first["lineText"], first  # "cell k of n"

    # Once every cell has run the line goes, the last cell has its output, the panel still leads the page.
    page.wait_for_function("() => document.body.getAttribute('data-kvlab-app') === 'done'", timeout=240_000)
    expect(line).to_be_hidden()
    last = page.locator("#rendered_cells [cell-index]").last
    expect(last.locator(".jp-OutputArea-output")).not_to_have_count(0)
    assert page.locator(".kvlab-verdict .kvlab-verdict-box").get_attribute("data-accepted") == "true"  # gc arm
    expect(page.get_by_text("The live panel of this section is at the top of the page.")).to_have_count(1)
    body = page.locator("body").inner_text()
    assert "Traceback" not in body, body[-3000:]  # every cell ran, the panel's included, in the reordered copy
    assert page.locator(".kvlab-kv-pool-panel").bounding_box()["y"] < 400
    lab.screenshot(page, artifacts / "app01_done.png", selector=None)
    page.close()
