"""Issue 37 item 7: `kvlab data tiny-checkpoint --seed` out of torch's range, and the notebook helpers given values a
learner might type, are refused at once naming the argument and its range (they failed deep inside: "Overflow when
unpacking long long", ``alloc(-1778)``, ``MemoryError``, 29 s and 5.5 GB)."""

from __future__ import annotations

import time

import pytest

from kvlab.cli import main
from kvlab.experiments import host_tier, shortfall_eviction
from kvlab.experiments.arguments import HelperArgumentError


@pytest.mark.parametrize("seed", ["99999999999999999999", "-99999999999999999999"])
def test_tiny_checkpoint_seed_out_of_range_is_refused_naming_the_flag(seed, tmp_path, capsys):
    out = tmp_path / "ckpt"
    with pytest.raises(SystemExit) as exit_:
        main(["data", "tiny-checkpoint", "--seed", seed, "--out", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed" in err and seed in err, err
    assert not out.exists()  # refused before anything was written


def test_write_checkpoint_refuses_a_seed_torch_cannot_take(tmp_path):
    from kvlab.model import get_model_config, write_checkpoint

    with pytest.raises(ValueError, match=r"seed must be an integer from -9223372036854775808 to 18446744073709551615"):
        write_checkpoint(tmp_path / "c", get_model_config("tiny"), seed=10 ** 20)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(("call", "named"), [
    (lambda: host_tier.pressure_event("shortfall", num_tokens=5000), "pressure_event(num_tokens=5000): expected an "
                                                                     "integer from 1 to 1,445"),
    (lambda: shortfall_eviction.pressure_event("shortfall", num_tokens=5000), "pressure_event(num_tokens=5000)"),
    (lambda: host_tier.pressure_event("full", capacity=2000), "pressure_event(num_tokens=600)"),
    (lambda: host_tier.pressure_event("full", num_tokens=1.5), "pressure_event(num_tokens=1.5)"),
    (lambda: host_tier.make_cache(host_ratio=1e6), "make_cache(host_ratio=1000000.0): expected a number in (0, 1,000]"),
    (lambda: host_tier.make_cache(1 << 20, host_ratio=100), "a host pool of 104,857,600 tokens; at most 16,777,216"),
    (lambda: host_tier.make_cache(10 ** 9), "make_cache(capacity_tokens=1000000000)"),
    (lambda: host_tier.run_script("write_through", num_requests=10 ** 7), "run_script(num_requests=10000000): "
                                                                         "expected an integer from 1 to 500"),
    (lambda: host_tier.run_script("write_through", num_requests=400, capacity_tokens=40_000),
     "run_script(num_requests=400, capacity_tokens=40000): prompts of up to"),
])
def test_notebook_helpers_name_the_argument_out_of_range(call, named):
    start = time.perf_counter()
    with pytest.raises(HelperArgumentError) as refused:
        call()
    assert named in str(refused.value), str(refused.value)
    assert time.perf_counter() - start < 5


def test_the_largest_event_the_check_allows_runs():
    """The bound is the event's own: num_tokens = 2 × free + 1 runs, one more is refused."""
    event = host_tier.pressure_event("shortfall", num_tokens=1445)
    assert event.num_tokens == 1445 and event.evict.shortfall_tokens > 0
    with pytest.raises(HelperArgumentError):
        host_tier.pressure_event("shortfall", num_tokens=1446)
