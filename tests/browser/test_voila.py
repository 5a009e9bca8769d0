"""``kvlab app 01`` / ``kvlab app 02`` in a real browser: Voila serves the notebook with code hidden and the
panels live. Voila draws a widget only once its cell has run (progressive rendering: cell by cell), so every
figure here is a view that attached late: it must draw the panel's current figure (its data, not the empty one
the panel started from), agree with the table beside it, and after a toggle show the CLI's numbers."""

from __future__ import annotations

import secrets
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page

from kvlab.app import app_env, find_notebook, voila_command, write_dashboard

from . import lab
from .panels import check_kv_pool_panel, check_shortfall_panel, drawn_lines, pool_cli, sim_cli


@pytest.fixture
def voila(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``voila("01")`` starts ``kvlab app 01``'s Voila command (with a token, as ``kvlab app`` does) and returns its
    URL with the token; stopped afterwards."""
    processes: list[subprocess.Popen] = []

    def start(key: str) -> str:
        notebook = find_notebook(key)
        port = lab.free_port()
        log_path = tmp_path / f"voila-{key}.log"
        page = tmp_path / f"page-{key}"  # the dashboard copy `kvlab app` serves (it uses a temporary folder)
        page.mkdir()
        token = secrets.token_urlsafe(24)
        env = {**app_env(None, token), "JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
        with log_path.open("wb") as log:
            process = subprocess.Popen(voila_command(notebook, page=write_dashboard(notebook, page), port=port),
                                       cwd=notebook.parent, env=env, stdout=log, stderr=subprocess.STDOUT)
        processes.append(process)
        url = f"http://127.0.0.1:{port}/"
        page_url = f"{url}?token={token}"  # the page sets the login cookie its websockets then carry
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"voila exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:  # any HTTP answer means it listens (GET / itself would start the notebook's kernel)
                urllib.request.urlopen(f"{url}api/kernels", timeout=2).read()
                return page_url
            except urllib.error.HTTPError:
                return page_url
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"voila did not answer in 120 s:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.25)

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.browser
@pytest.mark.slow
def test_voila_01_draws_every_figure_and_the_gc_toggle_gives_the_cli_numbers(voila, context: BrowserContext,
                                                                             artifacts: Path):
    with_gc, no_gc = pool_cli(True), pool_cli(False)
    page: Page = context.new_page()
    page.goto(voila("01"), wait_until="commit")  # Voila streams the page while the notebook executes
    page.locator(".kvlab-verdict .kvlab-verdict-box").wait_for(state="attached", timeout=300_000)
    # Code hidden: no code-cell inputs or editors in the dashboard (markdown cells render in an InputArea).
    assert page.locator(".jp-CodeCell .jp-InputArea, .jp-CodeMirrorEditor, .cm-editor").count() == 0
    assert page.locator(".jp-MarkdownOutput").count() > 0  # the prose stays
    assert "KVPoolPanel(" not in page.locator("body").inner_text()

    lines = drawn_lines(page, ".kvlab-timelines")
    assert len(lines) == 8 and sum(len(t["y"]) > 100 for t in lines) == 6  # 3 series + weights line, per arm
    before = check_kv_pool_panel(page, "gc", with_gc)
    lab.screenshot(page, artifacts / "voila01_with_gc.png", ".kvlab-kv-pool-panel")

    lab.check_widget(page, "kvlab-gc-toggle", False)
    lab.wait_plotly_change(page, ".kvlab-waterfall", [before], timeout=60_000)
    lab.wait_widget_text(page, "kvlab-verdict", "refused", timeout=60_000)
    check_kv_pool_panel(page, "no-gc", no_gc)
    assert drawn_lines(page, ".kvlab-timelines") == lines  # the toggle only picks "your server"
    lab.screenshot(page, artifacts / "voila01_without_gc.png", ".kvlab-kv-pool-panel")
    page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_voila_02_draws_every_figure_and_the_mode_toggle_gives_the_cli_numbers(voila, context: BrowserContext,
                                                                               artifacts: Path):
    fix, bug = sim_cli("shortfall"), sim_cli("full")
    page: Page = context.new_page()
    page.goto(voila("02"), wait_until="commit")
    page.locator(".kvlab-tree-log").wait_for(state="attached", timeout=300_000)

    check_shortfall_panel(page, "shortfall", fix, bug)
    lab.screenshot(page, artifacts / "voila02_shortfall.png", ".kvlab-shortfall-panel")
    tree = lab.wait_plotly(page, ".kvlab-tree-fig")[0]
    assert tree["type"] == "icicle" and len(tree["ids"]) >= 5 and tree["values"][0] > 0
    assert page.locator(".kvlab-tree-fig g.slice").count() >= 5  # the SVG is drawn, not just the data
    lab.screenshot(page, artifacts / "voila02_tree.png", ".kvlab-tree-demo-panel")

    gauge = lab.plotly_data(page, ".kvlab-sim-gauge")
    lab.select_dropdown(page, "kvlab-eviction-mode", "full (the bug)")
    lab.wait_plotly_change(page, ".kvlab-sim-gauge", gauge, timeout=60_000)
    lab.wait_widget_text(page, "kvlab-sim-verdict", "your server: full (the bug)")
    check_shortfall_panel(page, "full", fix, bug)
    lab.screenshot(page, artifacts / "voila02_full.png", ".kvlab-shortfall-panel")

    lab.click_widget(page, "kvlab-tree-next")
    after = lab.wait_plotly_change(page, ".kvlab-tree-fig", [tree], timeout=60_000)[0]
    assert after["values"][0] > tree["values"][0]  # one more cached sequence
    page.close()
