"""Fixtures for tests that drive a real JupyterLab in headless Chromium (docs/testing.md#browser-tests).

- ``lab_server`` (session): one ``jupyter lab`` on a free loopback port, root = the repo.
- ``lab_page``: a fresh page whose context aborts every non-loopback request; after the test the
  context is closed and every Lab session (kernel) is deleted.
- Chromium comes from ``/usr/bin/chromium`` (or $KVLAB_CHROMIUM). Missing: skip, or fail when
  KVLAB_REQUIRE_BROWSER=1 / --require-browser (CI).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import BrowserContext, Page, Route

from .lab import LabServer, start_lab

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these chromium keeps trying hosts this machine cannot reach.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def _find_chromium() -> str | None:
    """$KVLAB_CHROMIUM if set (no fallback: an explicit path that is wrong counts as missing), else Debian's."""
    explicit = os.environ.get("KVLAB_CHROMIUM")
    if explicit is not None:
        return explicit if os.access(explicit, os.X_OK) else None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict, require_browser: bool) -> dict:
    """pytest-playwright's launch args plus Debian's chromium and the flags from docs/testing.md#browser-tests.

    Playwright's ``launch()`` always gives the browser a fresh temporary user-data dir (and deletes it
    on close); it refuses ``--user-data-dir`` in ``args``, so that is what "fresh profile" means here.
    """
    chromium = _find_chromium()
    if chromium is None:
        message = (
            "chromium not found (looked at $KVLAB_CHROMIUM, /usr/bin/chromium, PATH). "
            "Install it with `apt-get install -y chromium` to run the browser tests "
            "(`playwright install` cannot download browsers on these machines)."
        )
        if require_browser:
            pytest.fail(message + " KVLAB_REQUIRE_BROWSER=1 makes this a failure.", pytrace=False)
        pytest.skip(message + " Set KVLAB_REQUIRE_BROWSER=1 to make this a failure.")
    args = list(CHROMIUM_ARGS)
    if browser_type_launch_args.get("headless", True):
        args.insert(0, "--headless")
    return {**browser_type_launch_args, "executable_path": chromium, "args": args}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict) -> dict:
    # Service workers would bypass context.route(); a roomy viewport keeps widgets on screen.
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1000}, "service_workers": "block"}


@pytest.fixture(scope="session")
def lab_server(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    server = start_lab(repo_root, tmp_path_factory.mktemp("jupyterlab"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def context(context: BrowserContext) -> Iterator[BrowserContext]:
    """pytest-playwright's context, with outside requests aborted and browser errors reported."""
    blocked: list[str] = []
    errors: list[str] = []

    def only_loopback(route: Route) -> None:
        url = route.request.url
        if urlsplit(url).scheme in ("data", "blob") or urlsplit(url).hostname in LOOPBACK_HOSTS:
            route.continue_()
        else:  # outside hosts hang instead of failing here, and can block a page load
            blocked.append(url)
            route.abort()

    context.route("**/*", only_loopback)
    context.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    context.on("weberror", lambda err: errors.append(f"page error: {err.error}"))
    context.set_default_timeout(30_000)
    yield context
    if blocked:
        print(f"[kvlab] aborted {len(blocked)} non-loopback request(s):", *blocked[:20], sep="\n  ")
    if errors:
        print(f"[kvlab] {len(errors)} browser error(s):", *errors[:20], sep="\n  ")


@pytest.fixture
def lab_page(context: BrowserContext, lab_server: LabServer) -> Iterator[Page]:
    """A page on the Lab server; afterwards the context is closed and all sessions are deleted.

    Closing first matters: a page left open would see its kernel die and reconnect.
    """
    page = context.new_page()
    yield page
    context.close()
    lab_server.delete_sessions()


ARTIFACTS = Path(__file__).resolve().parent / "artifacts"  # git-ignored


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    """A folder for this test's screenshots, kept after the run: tests/browser/artifacts/<test name>/ (emptied
    first; the path is printed so a failing run says where to look)."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)
    folder = ARTIFACTS / name
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    print(f"[kvlab] screenshots of {request.node.nodeid}: {folder}")
    return folder
