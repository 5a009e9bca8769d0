"""Names have one source: every CLI ``choices=`` and every panel's option list is read from a registry.

The registries: ``EVICTION_POLICIES`` (radix-cache eviction policies), ``WORKLOADS`` (seeded synthetic
workloads), ``EVICTION_MODES`` (shortfall / full) and ``SCENARIO_PRESETS`` (finding 1's scenarios). A policy
or workload registered later must show up in the CLI and the panels without touching either.
"""

from __future__ import annotations

import argparse
import json

import pytest

from kvlab.cli import build_parser, main
from kvlab.experiments import pool_sweep, shortfall_eviction
from kvlab.experiments.kv_pool_sizing import SCENARIO_PRESETS
from kvlab.mem_cache.common import EVICTION_MODES
from kvlab.mem_cache.evict_policy import EVICTION_POLICIES, EvictionStrategy
from kvlab.workloads.generators import WORKLOADS, few_shot

# the small setting of tests/viz/test_shortfall_panel.py (its comparison is cached per process)
SMALL = shortfall_eviction.PanelSettings(
    workload="generated-shared-prefix",
    overrides=(("num_groups", 16), ("prompts_per_group", 8), ("output_len", 128)), kv_tokens=20_480)


def _choices(*path: str, dest: str) -> list:
    """The ``choices`` of option ``dest`` of the (sub)command ``path``, e.g. ("simulate",), "policy"."""
    parser = build_parser()
    for name in path:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = subparsers.choices[name]
    action = next(a for a in parser._actions if a.dest == dest)
    return list(action.choices)


def _values(dropdown) -> list:
    """A selection widget's values (``options`` may be labels or (label, value) pairs)."""
    return [o[1] if isinstance(o, tuple) else o for o in dropdown.options]


def test_cli_choices_are_the_registries():
    assert _choices("simulate", dest="policy") == sorted(EVICTION_POLICIES)
    assert {"slru", "priority"} <= set(_choices("simulate", dest="policy"))
    assert _choices("simulate", dest="workload") == list(WORKLOADS)
    assert _choices("simulate", dest="eviction") == list(EVICTION_MODES)
    assert _choices("repro", "kv-pool-sizing", dest="preset") == sorted(SCENARIO_PRESETS)
    sweep = {a.dest: a.choices for a in pool_sweep.build_parser()._actions}  # python -m kvlab.experiments.pool_sweep
    assert list(sweep["policy"]) == sorted(EVICTION_POLICIES) and list(sweep["modes"]) == list(EVICTION_MODES)


@pytest.mark.slow
def test_panel_options_are_the_registries():
    from kvlab.viz.tree_widget import TreeDemoPanel
    from kvlab.viz.widgets import KVPoolPanel, ShortfallPanel

    sim = ShortfallPanel(SMALL)
    assert _values(sim.policy) == sorted(EVICTION_POLICIES)
    assert _values(sim.workload) == list(WORKLOADS)
    assert _values(sim.mode) == list(EVICTION_MODES)
    assert list(shortfall_eviction.MODE_LABELS) == list(EVICTION_MODES)
    assert _values(KVPoolPanel("llama-8b-l4").preset) == sorted(SCENARIO_PRESETS)
    assert _values(TreeDemoPanel().mode) == list(EVICTION_MODES)


class _OldestHitFirst(EvictionStrategy):
    """A policy no module registers: fewest hits first, oldest creation within a hit count."""

    def get_priority(self, node):
        return (node.hit_count, node.creation_time)


def _two_prompts(seed: int = 0):
    return few_shot(seed=seed, num_requests=2)


@pytest.fixture
def registered(monkeypatch):
    """A policy and a workload registered for this test only."""
    monkeypatch.setitem(EVICTION_POLICIES, "oldest-hit-first", _OldestHitFirst)
    monkeypatch.setitem(WORKLOADS, "two-prompts", _two_prompts)
    return "oldest-hit-first", "two-prompts"


def test_a_registered_policy_and_workload_run_from_the_cli(registered, capsys):
    policy, workload = registered
    assert policy in _choices("simulate", dest="policy") and workload in _choices("simulate", dest="workload")
    assert main(["simulate", "--workload", workload, "--policy", policy, "--kv-tokens", "4096", "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)
    assert totals["requests"] == 2 and totals["policy"] == policy


@pytest.mark.slow
def test_a_registered_policy_and_workload_appear_in_the_panel(registered):
    from kvlab.viz.widgets import ShortfallPanel

    policy, workload = registered
    panel = ShortfallPanel(SMALL)
    assert policy in _values(panel.policy) and workload in _values(panel.workload)
    panel.workload.value = workload  # runs both modes on the new workload at its own defaults
    panel.policy.value = policy
    assert panel.comparison().shortfall.totals()["requests"] == 2 and not panel.errors.outputs
