"""Start-up: ``kvlab --help`` imports no heavy library, and a parser built for one subcommand is the full one.

``kvlab.cli.main`` builds only the named subcommand's options (``build_parser(command)``), so ``kvlab --help``
never imports torch (about 1.5 s of a cold start) and a command imports what it uses.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from kvlab.cli import _command_named, build_parser

HEAVY = ("torch", "plotly", "pandas")


def _run_module(*argv: str) -> subprocess.CompletedProcess:
    """``python -m kvlab ARGV`` in a fresh interpreter; its stderr ends with a JSON line: the heavy modules loaded."""
    code = ("import runpy, sys, json\n"
            f"sys.argv = ['kvlab', *{list(argv)!r}]\n"
            "try:\n    runpy.run_module('kvlab', run_name='__main__', alter_sys=True)\n"
            "except SystemExit as exc:\n    code = exc.code\nelse:\n    code = 0\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
            "sys.exit(code)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def _loaded(out: subprocess.CompletedProcess) -> list:
    return json.loads(out.stderr.strip().splitlines()[-1])


def test_kvlab_help_imports_no_torch_plotly_or_pandas():
    out = _run_module("--help")
    assert out.returncode == 0, out.stderr
    assert "simulate" in out.stdout and "sweep" in out.stdout
    assert _loaded(out) == []


def test_python_dash_m_kvlab_runs_a_command():
    out = subprocess.run([sys.executable, "-m", "kvlab", "simulate", "--workload", "few-shot", "--kv-tokens", "8192",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["requests"] > 0


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_top_level_help_is_the_full_parsers():
    assert build_parser("").format_help() == build_parser().format_help()


@pytest.mark.parametrize("command", sorted(_subparsers(build_parser())))
def test_a_parser_built_for_one_command_has_its_full_options(command):
    full, alone = _subparsers(build_parser())[command], _subparsers(build_parser(command))[command]
    assert alone.format_help() == full.format_help()
    for sub in ("repro", "data"):  # the nested subcommands too
        if command == sub:
            for name, parser in _subparsers(full).items():
                assert _subparsers(alone)[name].format_help() == parser.format_help()


@pytest.mark.parametrize(("argv", "command"), [([], ""), (["--help"], ""), (["-h", "simulate", "--json"], "simulate"),
                                               (["repro", "kv-pool-sizing"], "repro")])
def test_the_command_is_the_first_word_that_is_no_option(argv, command):
    assert _command_named(argv) == command


def test_simulate_help_imports_no_torch():
    out = _run_module("simulate", "--help")
    assert out.returncode == 0, out.stderr
    assert "--eviction {shortfall,full}" in out.stdout
    assert _loaded(out) == []


def test_simulate_refuses_a_mistyped_choice_without_torch():
    out = _run_module("simulate", "--workload", "few-shot", "--policy", "lruu")
    assert out.returncode == 2
    assert "--policy: invalid choice: 'lruu'" in out.stderr
    assert _loaded(out) == []


def test_simulate_choices_are_the_registries():
    from kvlab.cli import SIMULATE_EVICTION_MODES, SIMULATE_POLICIES, SIMULATE_WRITE_POLICIES
    from kvlab.mem_cache.common import EVICTION_MODES
    from kvlab.mem_cache.evict_policy import EVICTION_POLICIES
    from kvlab.mem_cache.hicache.cache_controller import WRITE_POLICIES

    assert SIMULATE_EVICTION_MODES == tuple(EVICTION_MODES)
    assert SIMULATE_POLICIES == tuple(sorted(EVICTION_POLICIES))
    assert SIMULATE_WRITE_POLICIES == tuple(WRITE_POLICIES)


@pytest.mark.parametrize("as_json", [True, False])
def test_simulate_as_the_process_exits_once_its_output_is_flushed(tmp_path, capsys, as_json):
    """``python -m kvlab simulate`` ends with ``os._exit`` once stdout and stderr are flushed (no teardown of the
    run's objects, so no ``atexit`` hook runs), and its output, written to a file (block-buffered), is complete:
    the same bytes as ``main([...])`` in this process, which returns instead."""
    from pathlib import Path

    from kvlab.cli import main

    trace = Path(__file__).resolve().parent.parent / "data" / "traces" / "mooncake_small.jsonl"
    argv = ["simulate", "--trace", str(trace), "--page-size", "16", "--kv-pages", "20000"] + (["--json"] * as_json)
    out = tmp_path / "out.txt"
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print('teardown ran', file=sys.stderr))\n"
            f"sys.argv = ['kvlab', *{argv!r}]\n"
            "runpy.run_module('kvlab', run_name='__main__', alter_sys=True)\n")
    with open(out, "w") as stdout:
        done = subprocess.run([sys.executable, "-c", code], stdout=stdout, stderr=subprocess.PIPE, text=True,
                              timeout=300)
    assert done.returncode == 0, done.stderr
    assert "teardown ran" not in done.stderr
    assert main(argv) == 0  # in-process: returns (a caller's process goes on)
    assert out.read_text() == capsys.readouterr().out
    if as_json:
        assert json.loads(out.read_text())["requests"] > 0


def test_simulate_loads_neither_ipython_nor_the_app():
    """A ``kvlab simulate`` run in a terminal loads no IPython (the progress bar asks it only when a kernel has
    loaded it) and not kvlab.app (only app's parser reads its defaults): ~0.1 s of start-up each."""
    code = ("import json, sys\nfrom kvlab.cli import main\n"
            "code = main(['simulate', '--workload', 'few-shot', '--kv-tokens', '8192', '--json'])\n"
            "print(json.dumps([code, sorted(m for m in ('IPython', 'kvlab.app', 'kvlab.report') if m in sys.modules)]),"
            " file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert json.loads(out.stderr.strip().splitlines()[-1]) == [0, []], out.stderr


SIMULATE_IMPORTS = ("kvlab.cli", "kvlab.workloads", "kvlab.workloads.mooncake", "kvlab.sched.config",
                    "kvlab.sched.ledger", "kvlab.sched.cost", "kvlab.sched.result", "kvlab.mem_cache.options",
                    "kvlab.mem_cache.base_prefix_cache")


def test_what_simulate_needs_imports_without_torch():
    """The configuration, the ledger, the cost model, the result types and the trace loader import without
    torch (about 1-1.5 s of a cold start): ``kvlab.mem_cache`` and ``kvlab.sched`` import their names on first
    use, the choices a configuration checks live in ``kvlab.mem_cache.options``, and ``base_prefix_cache`` names
    torch only in annotations."""
    code = (f"import sys\nfor name in {SIMULATE_IMPORTS!r}:\n    __import__(name)\n"
            "from kvlab.mem_cache.base_prefix_cache import EvictParams, EvictResult\n"
            "from kvlab.mem_cache import EVICTION_MODES, WRITE_POLICIES, host_pool_size, EvictResult as E\n"
            "assert E is EvictResult\n"
            "from kvlab.sched import SchedulerConfig, CostModel\n"
            "SchedulerConfig(kv_tokens=4096, hicache_ratio=2.0).host_pool()\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["kvlab.mem_cache", "kvlab.sched"])
def test_a_lazy_package_exports_what_its_modules_define(package):
    """Every name in ``__all__`` is the object its module defines (``from kvlab.mem_cache import RadixCache`` as
    before), submodules are attributes, and a name that is neither is an AttributeError."""
    import importlib

    pkg = importlib.import_module(package)
    homes = {name: module for module, names in pkg._EXPORTS.items() for name in names}
    assert set(homes) == set(pkg.__all__)
    for name in pkg.__all__:
        assert getattr(pkg, name) is getattr(importlib.import_module(homes[name]), name), name
        assert name in dir(pkg)
    submodule = {"kvlab.mem_cache": "radix_tree", "kvlab.sched": "config"}[package]
    assert getattr(pkg, submodule).__name__ == f"{package}.{submodule}"
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        pkg.no_such_name  # noqa: B018


def test_moved_choices_are_re_exported_from_their_old_homes():
    from kvlab.mem_cache import common, options
    from kvlab.mem_cache.hicache import cache_controller, memory_pool_host

    assert common.EVICTION_MODES is options.EVICTION_MODES == ("shortfall", "full")
    assert cache_controller.WRITE_POLICIES is options.WRITE_POLICIES
    assert memory_pool_host.host_pool_size is options.host_pool_size
    assert memory_pool_host.HostPoolSize is options.HostPoolSize
