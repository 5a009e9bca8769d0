"""Suite-wide options: where the repo is, and whether a missing browser is a skip or a failure.

Browser fixtures live in tests/browser/conftest.py, notebook helpers in tests/notebooks/nbrun.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


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
