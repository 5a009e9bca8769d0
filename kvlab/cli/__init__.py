"""The ``kvlab`` console script: headless reproductions of the findings. One module per subcommand (its options and
what it runs: ``repro``, ``simulate``, ``explain_log``, ``report``, ``app``, ``replay``, ``data``; ``kvlab sweep``'s are
:mod:`kvlab.sweep.command`), the shared argument types in ``flags`` and the side-by-side printing in ``output``; this
module builds the parser from them and is the one place that maps errors to exit codes.

    kvlab repro kv-pool-sizing [--preset P] [--gc-before-measure | --no-gc-before-measure | --compare]
                               [--prompt-tokens N] [--json]
    kvlab simulate (--trace FILE | --workload NAME) [--eviction shortfall|full | --compare]
                   [--hicache-ratio R | --hicache-size GIB] [--hicache-write-policy P] [...]
    kvlab sweep (--trace FILE | --workload NAME) [--kv-pages LIST] [--max-running LIST] [...] [--engine local|ray]
    kvlab report [--out DIR] [--device auto|cuda|sim:<preset>] [--notebooks 01,02,...] [--force]
    kvlab app [01|02|...] [--port N] [--cull-idle-seconds N] [--max-kernels N] [--no-token] [--show-tracebacks]
              [--solutions] [--workshop N]
              [--notebook-dir DIR]
    kvlab explain-log LOG [--model-config CONFIG] [--mem-fraction-static F] [--what-if KEY=VALUE ...]
                      [--compare-engines [--vllm-log LOG] [--vllm-version V]] [--json]
    kvlab replay SNAPSHOT [--device N] [--what-if KEY=VALUE ...] [--capacity SIZE] [--device-memory SIZE] [--json]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from kvlab.cli import app, data, explain_log, replay, report, repro, simulate
from kvlab.cli.flags import MAX_POOL as MAX_POOL  # re-exported: the largest pool and batch simulate takes
from kvlab.cli.simulate import SIMULATE_EVICTION_MODES as SIMULATE_EVICTION_MODES  # (re-exported, as the three
from kvlab.cli.simulate import SIMULATE_POLICIES as SIMULATE_POLICIES  # choices tests/test_startup.py checks)
from kvlab.cli.simulate import SIMULATE_WRITE_POLICIES as SIMULATE_WRITE_POLICIES
from kvlab.errors import KvlabBug, KvlabError, fail

#: ``kvlab sweep``'s help line, for the parser built without sweep's options (kvlab.sweep.command.add_parser's own;
#: tests/test_startup.py checks the two agree)
SWEEP_HELP = "run kvlab simulate over a grid of settings, on local cores or a Ray cluster"

#: the subcommands in ``kvlab --help``'s order, each a module with ``add_parser(commands, command)`` (None: sweep, below)
_SUBCOMMANDS = (repro, simulate, None, explain_log, data, report, app, replay)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``kvlab`` parser. ``command``: build only that subcommand's registries and heavy options (any other gets
    its options without them, all ``kvlab --help`` shows), so a command imports only what it uses (``kvlab --help``
    no torch); None builds every subcommand whole (tests, docs)."""
    parser = argparse.ArgumentParser(prog="kvlab", description="Reproduce LLM-serving KV-memory findings.")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in _SUBCOMMANDS:
        if module is not None:
            module.add_parser(commands, command)
        elif command in (None, "sweep"):
            from kvlab.sweep.command import add_parser as add_sweep_parser

            add_sweep_parser(commands)
        else:  # sweep's options import the simulator (torch)
            commands.add_parser("sweep", help=SWEEP_HELP)
    return parser


def _sweep(args) -> int:
    from kvlab.sweep.command import main as sweep_main

    return sweep_main(args)


# subcommand (and, for `repro` and `data`, its first argument) -> the function that runs it
_COMMANDS = {
    ("repro", "kv-pool-sizing"): repro.run,
    ("simulate", None): simulate.run,
    ("sweep", None): _sweep,
    ("report", None): report.run,
    ("app", None): app.run,
    ("explain-log", None): explain_log.run,
    ("replay", None): replay.run,
    ("data", "tiny-checkpoint"): data.run,
}


# What a user can act on: kvlab's own KvlabError (naming the file, line or field), and the builtin errors the
# readers and scenarios raise with a message for the user (a bad value, a file that cannot be read, a workload
# that runs out of memory or never finishes). A KvlabBug is never one of them, whatever its builtin base.
USER_ERRORS = (KvlabError, ValueError, RuntimeError, OSError)

# The flags that name a user's input, in the order a failure is attributed to them
_INPUT_ARGS = ("snapshot", "log", "trace", "model_config", "vllm_log", "workload", "preset", "notebook",
               "notebook_dir", "out")


def _inputs(args: argparse.Namespace) -> str:
    """The inputs a command ran on, for the one line an unexpected error prints."""
    named = [f"{getattr(args, key)}" for key in _INPUT_ARGS if getattr(args, key, None) not in (None, "", [])]
    return ", ".join(named) or "its defaults"


def crash_dir() -> str:
    """Where an unexpected error's full traceback is written: ``$KVLAB_CRASH_DIR``, else the temp folder."""
    import tempfile

    return os.environ.get("KVLAB_CRASH_DIR") or tempfile.gettempdir()


def _unexpected(args: argparse.Namespace, exc: BaseException) -> int:
    """An exception that is no user error (a KvlabBug or any other): one line naming the command, its inputs
    and the exception, plus the file holding the full traceback; exit 3."""
    import tempfile
    import traceback

    command = " ".join(part for part in (args.command, getattr(args, "finding", None) or getattr(args, "kind", None))
                       if part)
    what = f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if str(exc) else type(exc).__name__
    try:
        folder = crash_dir()
        os.makedirs(folder, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="kvlab-crash-", suffix=".txt", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"kvlab {command} on {_inputs(args)}\nargv: {sys.argv!r}\n\n")
            f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        saved = f"the full traceback is in {path}"
    except OSError as save_error:
        saved = f"the traceback could not be saved ({save_error})"
    print(f"kvlab: internal error: `kvlab {command}` failed on {_inputs(args)} with {what} (a kvlab bug, not "
          f"your input); {saved}: please include it in a bug report", file=sys.stderr)
    return 3


# (subcommand, attribute, how the error names it, what it must be): the inputs main() checks before running
_FILE_INPUTS = (
    ("replay", "snapshot", "{}", "file"),
    ("simulate", "trace", "--trace {}", "file"),
    ("sweep", "trace", "--trace {}", "file"),
    ("explain-log", "log", "{}", "file"),
    ("explain-log", "vllm_log", "--vllm-log {}", "file"),
    ("explain-log", "model_config", "--model-config {}", "file or folder"),
    ("report", "notebook_dir", "--notebook-dir {}", "folder"),
    ("app", "notebook_dir", "--notebook-dir {}", "folder"),
)


#: the file inputs read whole into memory, and their kind in kvlab.input_limits.EXPANSION
_READ_WHOLE = {"snapshot": "snapshot", "trace": "trace", "log": "log", "vllm_log": "log", "model_config": "config"}


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse a folder where a file goes (and a file where a folder goes), and anything that is not a regular
    file (a FIFO blocks forever, ``/dev/zero`` never ends), naming the flag; and a file too large to read in the
    memory this machine has (kvlab.input_limits). A missing path is left to the reader, whose message says what it
    looked for (``--model-config`` also takes a preset name)."""
    import stat

    from kvlab.input_limits import check_size

    for command, attr, shown, kind in _FILE_INPUTS:
        path = getattr(args, attr, None) if args.command == command else None
        if not path:
            continue
        try:
            status = os.stat(path)
            mode = status.st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise KvlabError(f"{shown.format(path)}: cannot be read ({exc.strerror or exc})") from None
        name = shown.format(path)
        if stat.S_ISDIR(mode) and "folder" not in kind:
            raise KvlabError(f"{name}: is a folder, not a file; give the file itself")
        if stat.S_ISREG(mode) and "file" not in kind:
            raise KvlabError(f"{name}: is a file, not a folder; give the folder holding the notebooks")
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise KvlabError(f"{name}: is not a regular file (a FIFO, socket or device); give a {kind}")
        if stat.S_ISREG(mode) and attr in _READ_WHOLE:
            check_size(path, name, _READ_WHOLE[attr], status.st_size)


def _command_named(argv: list[str]) -> str:
    """The subcommand ``argv`` names: its first word that is no option (the top level takes no option with a
    value), or "" when there is none (``kvlab --help``, ``kvlab``)."""
    return next((word for word in argv if not word.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; the one place that maps errors to exit codes.

    0: done; 1: done, but something the user asked for failed (a notebook in ``kvlab report``); 2: a user error
    (``kvlab: error: …``, see :data:`USER_ERRORS`; also argparse's usage errors); 3: an unexpected error or a
    :class:`~kvlab.errors.KvlabBug` (one line, traceback saved under :func:`crash_dir`); 130: interrupted."""
    parser = build_parser(_command_named(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    command = _COMMANDS.get((args.command, getattr(args, "finding", None) or getattr(args, "kind", None)))
    if command is None:  # pragma: no cover - argparse refuses unknown commands first
        parser.error("unknown command")
    if argv is None and args.command in _EXIT_WITHOUT_TEARDOWN:
        # the process ends when the command does (os._exit): the cyclic collector would only rescan the loaded trace
        # and the run's objects (a 12k-request simulation collects no garbage cycle worth the scans)
        gc.disable()
    try:
        check_inputs(args)
        code = command(args)
    except (KvlabBug, RecursionError) as exc:  # a RecursionError is a RuntimeError, but never a message for a user
        return _unexpected(args, exc)
    except USER_ERRORS as exc:
        return fail(exc)
    except Exception as exc:  # anything else is a kvlab bug: never a traceback on the user's terminal
        return _unexpected(args, exc)
    if argv is None and code == 0 and args.command in _EXIT_WITHOUT_TEARDOWN:
        _exit_now(code)
    return code


#: Commands that write nothing but stdout and stderr: run as the process (``kvlab …``, ``python -m kvlab …``; not a
#: caller's ``main([...])``), they exit as soon as their output is flushed, skipping the interpreter's teardown of the
#: run's objects (about half a second after a 12k-request ``kvlab simulate``: the tree, the rows, the requests).
_EXIT_WITHOUT_TEARDOWN = frozenset({"simulate"})


def _exit_now(code: int) -> None:
    """Flush stdout and stderr, then end the process with ``code`` at once (``os._exit``). When a flush fails (a
    closed pipe), return instead: the normal exit reports it."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
