"""The shipped example runtime log is what benchmarks/make_runtime_log.py writes, and reading it back gives the
simulation's own numbers (issue 36)."""

import importlib.util

import pytest

from kvlab.serving.runtime.report import runtime_json, runtime_timeline
from tests.conftest import REPO_ROOT

SHIPPED = REPO_ROOT / "data" / "examples" / "runtime_logs" / "multi-turn-chat-20k-sglang-0.5.23-rendered.log"


def _maker():
    spec = importlib.util.spec_from_file_location("make_runtime_log", REPO_ROOT / "benchmarks" / "make_runtime_log.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_shipped_log_is_reproduced():
    assert "\n".join(_maker().rendered_lines()) + "\n" == SHIPPED.read_text()


def test_reading_the_rendered_log_gives_the_runs_numbers():
    data = runtime_json(runtime_timeline(SHIPPED))
    assert data["pool_tokens"] == 20000 and data["pool_source"].endswith(":2")
    assert data["events"]["requests_retracted"] == 16
    assert data["findings"][0]["name"] == "pool_full_retracted"
