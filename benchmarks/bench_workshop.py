"""Workshop load: time to panel and memory per attendee for ``kvlab app`` under N concurrent page loads.

Starts the real ``kvlab app NB`` (``python -m kvlab.cli app``), with ``--workshop POOL`` (pre-heated kernels) or
without (``--plain``: every page runs the notebook in a fresh kernel, progressive rendering), then fires N page
loads at once, each with its own real HTTP client, as N attendees opening the URL together:

- workshop mode: ``GET /?token=...``; Voila answers with the page rendered from a pre-heated kernel. Time to panel
  is until the streamed HTML holds the panel's widget output (``application/vnd.jupyter.widget-view+json``).
- plain mode: ``GET`` the page, then Voila's execution websocket (``/voila/execution/<kernel>``), as the page's
  own script drives it; time to panel is until a cell's outputs carry the panel's widget view.

Memory: after the loads, each kernel's RSS and PSS (``/proc/<pid>/smaps_rollup``; PSS splits shared pages
between the processes sharing them, so it is what one more attendee costs) and the Voila server's.

    python benchmarks/bench_workshop.py --notebook 02 --loads 1,10 --pool 10
    python benchmarks/bench_workshop.py --notebook 02 --loads 1 --plain

``--browser``: instead, one page load in a fresh headless Chromium (/usr/bin/chromium, 1280×720, nothing cached)
once the pool has run the notebook, timed from the navigation to what the attendee sees: the title on screen, the
first plotly figure drawn, and the live panel's figure drawn (``.kvlab-live-figure .main-svg`` in the panel):

    python benchmarks/bench_workshop.py --notebook 07 --loads 1 --pool 1 --browser
    python benchmarks/bench_workshop.py --notebook 07 --loads 1 --plain --browser

Prints one line per N and, with ``--json``, a JSON summary. The machine's load average is printed beside the
figures: on a shared machine they stretch with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PANEL_MARK = "application/vnd.jupyter.widget-view+json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(root: int) -> list[tuple[int, str]]:
    """Every process below ``root``: (pid, command line)."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        procs[int(name)] = (int(stat[stat.rfind(")") + 2:].split()[1]), cmd)
    found, frontier = [], {root}
    while frontier:
        below = [(pid, cmd) for pid, (ppid, cmd) in procs.items() if ppid in frontier]
        found += below
        frontier = {pid for pid, _ in below}
    return found


def _kernels(root: int) -> list[int]:
    return [pid for pid, cmd in _children(root) if "ipykernel_launcher" in cmd]


def _memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes; (0, 0) if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    kib = {k: int(v.split()[0]) for k, v in re.findall(r"^(\w+):\s+(\d+ kB)", text, re.M)}
    return kib.get("Rss", 0) * 1024, kib.get("Pss", 0) * 1024


def _load_streamed(url: str) -> tuple[float, str]:
    """GET ``url``; seconds until the body holds the panel's widget output, and the whole body."""
    started = time.monotonic()
    seen = None
    body = b""
    with urllib.request.urlopen(url, timeout=900) as response:
        while chunk := response.read1(65536):
            body += chunk
            if seen is None and PANEL_MARK.encode() in body:
                seen = time.monotonic() - started
    return (seen if seen is not None else float("nan")), body.decode(errors="replace")


async def _execute_until_panel(ws_url: str, kernel_id: str, timeout: float = 900) -> None:
    from tornado.websocket import websocket_connect

    ws = await asyncio.wait_for(websocket_connect(ws_url), timeout)
    try:
        hello = json.loads(await asyncio.wait_for(ws.read_message(), timeout))
        assert hello["action"] == "initialized", hello
        await ws.write_message(json.dumps({"action": "execute", "payload": {"kernel_id": kernel_id}}))
        while True:
            message = await asyncio.wait_for(ws.read_message(), timeout)
            if message is None:
                raise RuntimeError("Voila closed the execution websocket before the panel")
            payload = json.loads(message)["payload"]
            if PANEL_MARK in json.dumps(payload["output_cell"].get("outputs", [])):
                return
            if payload["cell_index"] + 1 == payload["total_cell"]:
                raise RuntimeError("the notebook ran to its end without a widget output")
    finally:
        ws.close()


def _load_plain(url: str, port: int) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=900) as response:
        page = response.read().decode()
    config = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    kernel_id = json.loads(config.group(1))["kernelId"]
    query = url.partition("?")[2]
    ws = f"ws://127.0.0.1:{port}/voila/execution/{kernel_id}" + (f"?{query}" if query else "")
    asyncio.run(_execute_until_panel(ws, kernel_id))
    return time.monotonic() - started


# -- in a browser: what an attendee sees ------------------------------------------------------------------------

PANELS = {"02": ".kvlab-shortfall-panel", "07": ".kvlab-host-tier-panel", "01": ".kvlab-kv-pool-panel"}
# Runs in the page from its first byte: the times (ms since navigation start) at which the title is on screen,
# the first plotly figure has drawn its SVG, and the live panel's figure has.
_WATCH = """
(() => {
  const panelSelector = %s;
  const marks = (window.__kvlabMarks = {});
  const drawn = el => !!el && el.getBoundingClientRect().height > 0;
  const tick = () => {
    const now = performance.now();
    if (!marks.visible && drawn(document.querySelector('h1'))) marks.visible = now;
    if (!marks.firstFigure && drawn(document.querySelector('.js-plotly-plot .main-svg'))) marks.firstFigure = now;
    const panel = document.querySelector(panelSelector);
    if (!marks.liveFigure && panel && drawn(panel.querySelector('.kvlab-live-figure .main-svg'))) marks.liveFigure = now;
    if (!marks.liveFigure) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})();
"""
CHROMIUM = os.environ.get("KVLAB_CHROMIUM", "/usr/bin/chromium")


def browser_load(url: str, notebook: str, timeout_s: float = 300) -> dict:
    """One page load of ``url`` in a fresh headless Chromium (nothing cached): seconds from navigation start to
    page visible (the title drawn), first figure drawn and the live panel's figure drawn."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"])
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 720}).new_page()
            page.add_init_script(_WATCH % json.dumps(PANELS[notebook]))
            page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
            page.wait_for_function("() => window.__kvlabMarks && window.__kvlabMarks.liveFigure",
                                   timeout=timeout_s * 1000, polling=100)
            marks = page.evaluate("() => window.__kvlabMarks")
        finally:
            browser.close()
    return {k: round(v / 1000, 2) for k, v in marks.items()}


def _cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def _all_idle(root: int, window: float = 3.0) -> bool:
    """The kernels below ``root`` used, all together, under 10 % of one CPU over ``window`` seconds (done running
    the notebook). Not per kernel: 30 kernels sharing two cores each get under 7 % of one while all still run."""
    pids = _kernels(root)
    before = _cpu_ticks(pids)
    time.sleep(window)
    return (_cpu_ticks(pids) - before) / os.sysconf("SC_CLK_TCK") < 0.10 * window


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _wait(condition, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_workshop: {what}: not within {timeout:g} s\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def run(notebook: str, loads: int, pool: int, plain: bool, log_dir: Path, browser: bool = False) -> dict:
    port = _free_port()
    log = log_dir / f"app-{notebook}-{'plain' if plain else 'workshop'}-{loads}.log"
    cmd = [sys.executable, "-m", "kvlab.cli", "app", notebook, "--no-browser", "--port", str(port),
           "--max-kernels", "0", "--cull-idle-seconds", "0"] + ([] if plain else ["--workshop", str(pool)])
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVLAB_PROGRESS": "0"}
    with log.open("wb") as out:
        app = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: re.search(r"serving \S+ at (\S+) ", log.read_text()), 120, "the URL", log)
        url = re.search(r"serving \S+ at (\S+) ", log.read_text()).group(1)
        _wait(lambda: _listening(port), 120, "Voila listening", log)
        warm_started = time.monotonic()
        if not plain:
            _wait(lambda: "is filled with" in log.read_text() and len(_kernels(app.pid)) >= pool, 1800,
                  f"{pool} pre-heated kernel(s)", log)
            _wait(lambda: _all_idle(app.pid), 1800, "the pre-heated kernels done running the notebook", log)
        warm_s = time.monotonic() - warm_started
        if browser:
            marks = browser_load(url, notebook)
            return {"notebook": notebook, "mode": "plain" if plain else f"workshop (pool {pool})",
                    "browser_s": marks, "pool_warm_s": round(warm_s, 1),
                    "load_avg_1min_at_start": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
        times: list[float] = []
        errors: list[str] = []

        def one() -> None:
            try:
                times.append(_load_plain(url, port) if plain else _load_streamed(url)[0])
            except Exception as exc:  # noqa: BLE001 - a failed load is a result to report
                errors.append(f"{type(exc).__name__}: {exc}")

        pooled = _kernels(app.pid)  # workshop mode: the kernels the pages will take (the attendees')
        load_avg = os.getloadavg()[0]
        threads = [threading.Thread(target=one) for _ in range(loads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if plain:  # the panel comes first: let each kernel finish the notebook before weighing it
            _wait(lambda: _all_idle(app.pid), 1800, "the kernels done running the notebook", log)
        kernels = _kernels(app.pid)
        # per attendee: the kernels that served the pages (workshop: the pooled ones; their refills are still running
        # the notebook and are left out), each having run the whole notebook
        mem = [_memory(pid) for pid in (pooled if not plain else kernels)]
        voila = [pid for pid, c in _children(app.pid) if " kvlab.app_server " in c]
        server_rss = _memory(voila[0])[0] if voila else 0
        return {"notebook": notebook, "mode": "plain" if plain else f"workshop (pool {pool})", "loads": loads,
                "time_to_panel_s": sorted(times), "errors": errors, "pool_warm_s": round(warm_s, 1),
                "kernels": len(kernels), "kernel_rss_mib": [round(r / 2**20) for r, _ in mem],
                "kernel_pss_mib": [round(p / 2**20) for _, p in mem], "voila_rss_mib": round(server_rss / 2**20),
                "load_avg_1min_at_start": round(load_avg, 2), "cpus": os.cpu_count(),
                "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}
    finally:
        app.send_signal(2)  # SIGINT: kvlab app stops Voila and its kernels
        try:
            app.wait(120)
        except subprocess.TimeoutExpired:
            app.kill()


def _line(r: dict) -> str:
    if "browser_s" in r:
        b = r["browser_s"]
        return (f"{r['notebook']} {r['mode']}: in Chromium: page visible {b.get('visible', float('nan')):.2f} s, "
                f"first figure {b.get('firstFigure', float('nan')):.2f} s, live panel figure drawn "
                f"{b['liveFigure']:.2f} s; ready to serve after {r['pool_warm_s']} s; load avg "
                f"{r['load_avg_1min_at_start']} on {r['cpus']} CPUs")
    t, pss, rss = r["time_to_panel_s"], r["kernel_pss_mib"], r["kernel_rss_mib"]
    times = f"median {statistics.median(t):.2f} s, max {max(t):.2f} s" if t else "no load succeeded"
    failed = f" ({len(r['errors'])} failed: {r['errors'][0]})" if r["errors"] else ""
    memory = (f"PSS per attendee's kernel median {statistics.median(pss):.0f} MiB (RSS {statistics.median(rss):.0f} MiB)"
              if pss else "no kernel left")
    return (f"{r['notebook']} {r['mode']}: {r['loads']} concurrent load(s): time to panel {times}{failed}; "
            f"{r['kernels']} kernels, {memory}, Voila {r['voila_rss_mib']} MiB; ready to serve after "
            f"{r['pool_warm_s']} s; load avg {r['load_avg_1min_at_start']} on {r['cpus']} CPUs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebook", default="02")
    parser.add_argument("--loads", default="1,10", help="comma-separated numbers of concurrent page loads")
    parser.add_argument("--pool", type=int, default=None, help="pre-heated kernels (default: the largest N)")
    parser.add_argument("--plain", action="store_true", help="no pre-heated kernels (kvlab app without --workshop)")
    parser.add_argument("--browser", action="store_true",
                        help="one page load in headless Chromium per N: times to page visible, first figure and "
                             "the live panel's figure drawn (what an attendee sees)")
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    loads = [int(n) for n in args.loads.split(",")]
    pool = args.pool or max(loads)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-workshop-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for n in loads:
        r = run(args.notebook, n, pool, args.plain, log_dir, args.browser)
        results.append(r)
        print(_line(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
