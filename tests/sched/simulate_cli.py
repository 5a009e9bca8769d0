"""``kvlab simulate`` as the scheduler tests run it: a small few-shot workload, the flags under test added."""

from __future__ import annotations

from kvlab.cli import main

SMALL_RUN = ("simulate", "--workload", "few-shot", "--workload-param", "num_requests=12", "--kv-tokens", "4096")


def cli(*args: str) -> int:
    """The exit code of ``kvlab simulate`` on :data:`SMALL_RUN` with ``args`` added."""
    return main([*SMALL_RUN, *args])


def assert_refused(capsys, args: list[str], message: str) -> None:
    """``args`` make ``kvlab simulate`` exit 2 (argparse's usage errors included) with ``message`` on stderr, no
    traceback."""
    try:
        code = cli(*args)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
