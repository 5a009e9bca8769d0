"""``kvlab app 02 --workshop 1`` in a real browser (issue 35 item 2): once the log says the pool is warm, a page draws
the live panel's figure (plotly.js from the file beside the dashboard copy, not from the widget state), then every
static figure of the notebook. How long it took is printed (benchmarks/bench_workshop.py --browser measures it); no
timed assertion."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext

from . import lab

WARM = re.compile(r"pool warm: 1 kernel\(s\) ready in [0-9.]+ s")


@pytest.mark.browser
@pytest.mark.slow
def test_a_warm_workshop_page_draws_the_live_figure_then_the_static_ones(context: BrowserContext, tmp_path: Path,
                                                                        artifacts: Path):
    with lab.kvlab_app(tmp_path, "02", "--workshop", "1") as app:
        app.wait_for(WARM, 300)
        url = re.search(lab.APP_SERVING, app.log()).group(1)
        page = context.new_page()
        page.set_viewport_size({"width": 1280, "height": 720})
        started = time.monotonic()
        page.goto(url, wait_until="commit")
        page.wait_for_function("() => { const p = document.querySelector('.kvlab-shortfall-panel');"
                               " return p && p.querySelector('.kvlab-live-figure .main-svg'); }", timeout=120_000)
        live_s = time.monotonic() - started
        lab.screenshot(page, artifacts / "app02_workshop_live.png", selector=None)
        # plotly.js came from the page's file: the widget state carried none of it
        assert page.evaluate("() => typeof window.Plotly === 'object' && !!window.Plotly.react")
        placeholders = page.locator(".kvlab-static-plotly").count()
        assert placeholders >= 1  # notebook 02's static figures, drawn by the page after the panel
        page.wait_for_function("(n) => Array.from(document.querySelectorAll('.kvlab-static-plotly'))"
                               ".filter(e => e.querySelector('.main-svg')).length === n", arg=placeholders,
                               timeout=120_000)
        assert "drawn after the live panel" not in page.locator("body").inner_text()
        assert page.locator("text=Loading widget").count() == 0
        print(f"[kvlab] warm workshop page 02: live figure drawn {live_s:.2f} s after navigation (wall clock)")
        page.close()
    text = app.log()
    assert app.process.returncode == 0 and "Traceback" not in text, text[-3000:]
    # what every page load used to add to the log (explained once at start-up instead)
    assert "websocket_ping_timeout" not in text and "without encryption" not in text, text[-3000:]
    assert "is not trusted\n" not in text, text[-3000:]
