"""Suite-wide options: where the repo is, whether a missing browser is a skip or a failure, and how
much the hypothesis fuzz suites run.

Browser fixtures live in tests/browser/conftest.py, notebook helpers in tests/notebooks/nbrun.py.

Fuzz profiles (hypothesis), chosen with ``KVLAB_FUZZ``:

- ``ci`` (default): the fuzz suites (allocator model, the three radix caches, the scheduler and its
  fast-decode path) run 2,200 random operation sequences together (about 2,450 counted: hypothesis
  adds database replays and runs cut short); ~40 s of CPU, 1.5-3 min wall on a loaded 2-core machine.
- ``long`` (``KVLAB_FUZZ=long``, for release checks): 10,400 sequences; ~3 min of CPU, extrapolated
  from the radix suite (4,469 sequences in 60 s of CPU).
- ``dev``: 120 sequences, for a quick look while changing a suite.

The per-suite counts live in tests/fuzz.py (one table); the end-of-run summary prints how many
examples each suite really ran. Every profile turns hypothesis' deadline off: on a shared 2-core
runner a slow step is load, not a bug.

Exit 3 is a failure everywhere: ``kvlab``'s unexpected-error path (exit 3) saves its traceback under
``$KVLAB_CRASH_DIR``, which this file points at a folder of the test run's own (subprocesses inherit it);
:func:`no_kvlab_crash` fails any test during which a traceback was saved there, however the test ran the
CLI (``kvlab.cli.main`` in-process, ``python -m kvlab``, a notebook, the app) and whatever exit code it
expected. A test that provokes exit 3 on purpose points ``KVLAB_CRASH_DIR`` elsewhere (``monkeypatch.setenv``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import fuzz
import pytest
from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# Named kvlab-*: hypothesis has a built-in "ci" profile of its own, which this must not overwrite.
for _name in fuzz.PROFILES:
    settings.register_profile(f"kvlab-{_name}", deadline=None, print_blob=True)
settings.load_profile(f"kvlab-{fuzz.profile()}")

# One folder per test run, even where this file is imported twice (as conftest and as tests.conftest); set
# before any test runs, so every subprocess inherits it
CRASH_DIR = Path(os.environ.get("KVLAB_TEST_CRASH_DIR") or tempfile.mkdtemp(prefix="kvlab-test-crashes-"))
os.environ["KVLAB_TEST_CRASH_DIR"] = os.environ["KVLAB_CRASH_DIR"] = str(CRASH_DIR)


@pytest.fixture(autouse=True)
def no_kvlab_crash():
    """Fail the test if kvlab took its unexpected-error path (exit 3) while it ran: a saved traceback."""
    before = set(CRASH_DIR.iterdir())
    yield
    new = sorted(set(CRASH_DIR.iterdir()) - before)
    if new:
        pytest.fail(f"kvlab exited 3 (an unexpected error) {len(new)} time(s) during this test; the first "
                    f"traceback ({new[0]}):\n{new[0].read_text(errors='replace')[-4000:]}", pytrace=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvlab")
    group.addoption(
        "--require-browser",
        action="store_true",
        default=False,
        help="fail (instead of skip) browser tests when chromium is missing; same as KVLAB_REQUIRE_BROWSER=1",
    )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root: JupyterLab's root_dir, and the base of notebook paths."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def require_browser(pytestconfig: pytest.Config) -> bool:
    """True in CI: a missing browser must fail the run, never skip it silently."""
    return pytestconfig.getoption("--require-browser") or os.environ.get("KVLAB_REQUIRE_BROWSER", "") == "1"


def pytest_report_header(config: pytest.Config) -> str:
    return f"fuzz profile: {fuzz.profile()} ({fuzz.ENV}; counts in tests/fuzz.py)"


# ---- parallel workers (pytest-xdist; scripts/test.sh runs ``-n auto``) ---------------------------------------------
#: Folders and files whose tests share an expensive session fixture: they run on one worker, as one unit (the browser
#: tests: one JupyterLab, one built report; the headless notebook runs: each notebook executed once per session; the
#: Ray tests: one local cluster).
XDIST_GROUPS = {"tests/browser/": "browser", "tests/notebooks/": "notebooks", "tests/sweep/test_ray.py": "ray"}


def xdist_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its group, or else its file (so a module's fixtures are made once)."""
    path = nodeid.split("::", 1)[0]
    return next((group for prefix, group in XDIST_GROUPS.items() if path.startswith(prefix)), path)


@pytest.hookimpl(optionalhook=True)  # (an xdist hook: without xdist nothing calls it)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's scope scheduling with :func:`xdist_unit` as the scope. (Its ``loadgroup`` marks the groups in node
    ids, which pytest 9.2 no longer reads: xdist 3.8's groups are silently ignored there.)"""
    from xdist.scheduler import LoadScopeScheduling

    class KvlabUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return KvlabUnits(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker hands its fuzz counts to the controller, which prints them (pytest_testnodedown)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["kvlab_fuzz_ran"] = dict(fuzz.ran)


@pytest.hookimpl(optionalhook=True)  # (an xdist hook: without xdist nothing calls it)
def pytest_testnodedown(node, error) -> None:
    for suite, count in getattr(node, "workeroutput", {}).get("kvlab_fuzz_ran", {}).items():
        fuzz.ran[suite] = fuzz.ran.get(suite, 0) + count


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many random sequences each fuzz suite ran (counted as they start, not the configured number)."""
    if not fuzz.ran:
        return
    tr = terminalreporter
    tr.section(f"fuzz: examples run ({fuzz.ENV}={fuzz.profile()})")
    for suite in sorted(fuzz.ran):
        tr.write_line(f"{suite:>12}: {fuzz.ran[suite]:>6,} run (configured {fuzz.examples(suite):,})")
    tr.write_line(f"{'total':>12}: {sum(fuzz.ran.values()):>6,}")
