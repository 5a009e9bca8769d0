"""``kvlab app 01`` in a real browser: Voila serves notebook 01 with code hidden and the widgets live."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from playwright.sync_api import BrowserContext, Page

from kvlab.app import app_env, find_notebook, voila_command

from . import lab


@pytest.fixture
def voila_01(tmp_path: Path) -> Iterator[str]:
    notebook = find_notebook("01")
    port = lab.free_port()
    log_path = tmp_path / "voila.log"
    env = {**app_env(None), "JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with log_path.open("wb") as log:
        process = subprocess.Popen(voila_command(notebook, port=port), cwd=notebook.parent, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"voila exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:  # any HTTP answer means it listens (GET / itself would start the notebook's kernel)
                urllib.request.urlopen(f"{url}api/kernels", timeout=2).read()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"voila did not answer in 120 s:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _cli(flag: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "kvlab.cli", "repro", "kv-pool-sizing", "--preset", "sglang-pr-4xh200",
                          flag, "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.browser
@pytest.mark.slow
def test_voila_app_hides_code_and_the_gc_toggle_works(voila_01: str, context: BrowserContext, tmp_path: Path):
    no_gc = _cli("--no-gc-before-measure")
    page: Page = context.new_page()
    page.goto(voila_01, wait_until="commit")  # Voila streams the page while the notebook executes
    box = page.locator(".kvlab-verdict .kvlab-verdict-box")
    box.wait_for(state="attached", timeout=300_000)
    assert box.get_attribute("data-accepted") == "true"
    lab.wait_plotly(page, ".kvlab-waterfall", timeout=120_000)
    # Code hidden: no code-cell inputs or editors in the dashboard (markdown cells render in an InputArea).
    assert page.locator(".jp-CodeCell .jp-InputArea, .jp-CodeMirrorEditor, .cm-editor").count() == 0
    assert page.locator(".jp-MarkdownOutput").count() > 0  # the prose stays
    assert "KVPoolPanel(" not in page.locator("body").inner_text()
    lab.screenshot(page, tmp_path / "voila_with_gc.png", ".kvlab-kv-pool-panel")

    lab.check_widget(page, "kvlab-gc-toggle", False)
    lab.wait_widget_text(page, "kvlab-verdict", "refused", timeout=60_000)
    assert box.get_attribute("data-accepted") == "false"
    assert int(box.get_attribute("data-max-total-num-tokens")) == no_gc["max_total_num_tokens"]
    lab.screenshot(page, tmp_path / "voila_without_gc.png", ".kvlab-kv-pool-panel")
    page.close()
