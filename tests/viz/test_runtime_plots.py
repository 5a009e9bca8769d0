"""The runtime timeline figure (issue 36) draws the frame's numbers, which are the CLI's."""

import json

import numpy as np

from kvlab import cli
from kvlab.serving.runtime.report import runtime_timeline
from kvlab.viz.runtime_plots import runtime_timeline_figure
from tests.conftest import REPO_ROOT

LOG = REPO_ROOT / "data" / "examples" / "runtime_logs" / "multi-turn-chat-20k-sglang-0.5.23-rendered.log"
VLLM = REPO_ROOT / "tests" / "fixtures" / "runtime_logs" / "vllm_v1_loggers_2026-05.log"


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_figure_numbers_are_the_frames_and_the_clis(capsys):
    tl = runtime_timeline(LOG)
    fig = runtime_timeline_figure(tl)
    frame = tl.frame
    used = _trace(fig, "tokens in use")
    assert np.array_equal(np.asarray(used.y), frame["used_tokens_est"].to_numpy())
    assert np.array_equal(np.asarray(used.x), frame["t_s"].to_numpy())
    cumulative = np.asarray(_trace(fig, "cumulative").y)
    assert cli.main(["explain-log", str(LOG), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["runtime"]
    assert cumulative[-1] == data["hit_rate"]["overall"]
    assert max(used.y) == data["used_tokens"]["max"]
    events = _trace(fig, "retraction / preemption")
    assert sum(c[1] for c in events.customdata) == data["events"]["requests_retracted"] == 16
    assert fig.layout.xaxis4.title.text == "seconds from the first runtime line"


def test_vllm_figure_draws_usage_as_a_fraction():
    tl = runtime_timeline(VLLM)
    fig = runtime_timeline_figure(tl)
    usage = _trace(fig, "token usage")
    assert list(usage.y) == list(tl.frame["usage"]) and max(usage.y) == 0.984
    assert not any(t.name == "cumulative" and len(t.y) for t in fig.data)
    assert list(_trace(fig, "as printed").y) == list(tl.frame["logged_hit_rate"])  # vLLM's own rate
