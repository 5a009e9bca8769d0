"""Notebook 05's runtime panel (issue 36): the example drawn at start, a pasted log read on the button, an upload
read at once, a paste without runtime lines shown as the CLI's one-line error."""

import base64
import datetime

import numpy as np

from kvlab.viz.runtime_panel import RuntimePanel
from tests.conftest import REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "runtime_logs"


def _trace(panel, name):
    return next(t for t in panel.figure.figure.data if t.name == name)


def plotted(array) -> np.ndarray:
    """A synced trace's numbers: plotly's base64 typed array decoded, or the plain list."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=np.dtype(array["dtype"]))
    return np.asarray(array, dtype=float)


def test_example_drawn_at_start():
    panel = RuntimePanel()
    assert panel.data["events"]["requests_retracted"] == 16
    assert np.array_equal(plotted(_trace(panel, "tokens in use").y),
                          panel.timeline.frame["used_tokens_est"].to_numpy())
    assert "Σ cached 108,497" in panel.summary.value


def test_paste_is_read_on_the_button():
    panel = RuntimePanel()
    panel.log_text.value = (FIXTURES / "vllm_v1_loggers_2026-05.log").read_text()
    assert panel.data["engine"] == "sglang"  # not yet read
    panel.read.click()
    assert panel.data["engine"] == "vllm" and plotted(_trace(panel, "token usage").y)[-1] == 0.984


def test_upload_is_read():
    panel = RuntimePanel()
    content = (FIXTURES / "sglang_tp0_cache_hit_rate_2024-11.log").read_bytes()
    panel.upload.value = ({"name": "server.log", "type": "text/plain", "size": len(content),
                           "content": memoryview(content), "last_modified": datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)},)
    assert panel.data["steps"] == {"prefill": 14}
    assert "Runtime: server.log" in panel.figure.figure.layout.title.text


def test_paste_without_runtime_lines_is_one_error_line():
    panel = RuntimePanel()
    panel.log_text.value = "hello\nworld\n"
    panel.read.click()
    text = "".join(o.get("text", "") for o in panel.shell.errors.outputs)
    assert text == "kvlab: error: (pasted log): no runtime line (SGLang's 'Prefill batch' / 'Decode batch', vLLM's " \
                   "'Avg prompt throughput') in its 2 lines\n"
    assert not panel.shell.shown
