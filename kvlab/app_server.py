"""What runs inside the Voila process that ``kvlab app`` starts (``python -m kvlab.app_server FOLDER VOILA-ARGS``).

* The token: ``kvlab app`` passes it in the environment (``KVLAB_APP_TOKEN``), never on the command line, which
  any local user can read in ``/proc/<pid>/cmdline``; it is handed to Voila here (``--Voila.token``, in this
  process's own ``sys.argv``) and taken out of the environment before a kernel can inherit it.
* The dashboard copy's temporary ``FOLDER`` is removed when Voila exits, so a ``kvlab app`` killed with SIGKILL
  (whose parent-death signal makes Voila stop: SIGTERM, its kernels shut down) leaves no folder behind either.
* :class:`CappedKernelManager`: at most ``max_kernels`` kernels at once (one per open page); a page beyond
  that gets HTTP 503 with a sentence saying why, instead of one more kernel per reload until memory runs out.
  In workshop mode (Voila's ``preheat_kernel``, which makes its kernel manager a subclass of this one) a kernel
  waiting in the pre-heated pool has no page and is idle by design: the idle culler leaves it alone (Voila would
  not start a replacement for a culled pool kernel, so the pool would drain while nobody is there). It logs
  ``pool warm: N kernel(s) ready in X s`` once the pool's kernels have run the whole notebook (Voila says "filled"
  when they start), and on shutdown it stops their notebook runs and interrupts busy kernels first (a kernel shut
  down mid-cell printed a ZMQError traceback).
* Log noise: jupyter_server's "Notebook … is not trusted" (every page) is dropped, ``kvlab app`` explains it once;
  the websocket ping timeout is set to the ping interval (tornado noted the shortening on every page).

This module imports nothing from kvlab: it is loaded by Voila (by name) and by ``python -m``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import sys
import time

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from traitlets import Integer

TOKEN_ENV = "KVLAB_APP_TOKEN"
DEFAULT_MAX_KERNELS = 8


class CappedKernelManager(AsyncMappingKernelManager):
    """jupyter_server's kernel manager with a cap on the kernels running at once."""

    max_kernels = Integer(DEFAULT_MAX_KERNELS, config=True,
                          help="kernels running at once; a page beyond that gets HTTP 503 (0 = no cap)")
    _warming_since: float | None = None  # workshop mode: when the pool's oldest kernel not yet warm was started

    async def _capped_start(self, *args, kernel_id: str | None = None, **kwargs) -> str:
        if kernel_id is None and self.max_kernels and len(self.list_kernel_ids()) >= self.max_kernels:
            self.log.warning("kvlab app: %d kernels running, the --max-kernels cap; refusing a new page",
                             self.max_kernels)
            raise web.HTTPError(503, f"kvlab app: {self.max_kernels} pages are open already (--max-kernels "
                                     f"{self.max_kernels}); close one, or wait until an idle one is culled")
        return await super().start_kernel(*args, kernel_id=kernel_id, **kwargs)

    def pooled_kernel_ids(self) -> set[str]:
        """The kernels waiting in Voila's pre-heated pool (none without ``preheat_kernel``)."""
        ids = set()
        for pool in getattr(self, "_pools", {}).values():
            for task in pool:
                if task.done() and not task.cancelled() and task.exception() is None:
                    ids.add(task.result().get("kernel_id"))
        return ids

    async def start_kernel(self, *args, kernel_id: str | None = None, **kwargs) -> str:
        started = time.monotonic()
        kid = await self._capped_start(*args, kernel_id=kernel_id, **kwargs)
        if kernel_id is None and hasattr(self, "_pools"):  # a pre-heated kernel (workshop mode): say when warm
            if self._warming_since is None:
                self._warming_since = started
            asyncio.ensure_future(self._log_when_warm())
        return kid

    async def _log_when_warm(self) -> None:
        """Log "pool warm: N kernel(s) ready in X s" once every pre-heated kernel has run the whole notebook
        (Voila's own "is filled" line comes when they start)."""
        while True:
            await asyncio.sleep(0.25)
            items = [task for pool in self._pools.values() for task in pool]
            if not all(task.done() for task in items):
                continue
            renders = [t.result()["task"] for t in items if not t.cancelled() and t.exception() is None]
            if all(render.done() for render in renders):
                break
        if self._warming_since is not None and renders:
            took, self._warming_since = time.monotonic() - self._warming_since, None
            self.log.info("pool warm: %d kernel(s) ready in %.1f s (each has run the whole notebook)",
                          len(renders), took)

    async def shutdown_all(self, now: bool = False) -> None:
        """Stop the pre-heated kernels' notebook runs and interrupt busy kernels before shutting them down: a
        kernel shut down in the middle of a cell printed a ZMQError traceback (its reply had no socket left)."""
        for pool in getattr(self, "_pools", {}).values():
            for item in pool:
                if item.done() and not item.cancelled() and item.exception() is None:
                    item.result()["task"].cancel()
        busy = [k for k in self.list_kernel_ids() if getattr(self._kernels[k], "execution_state", "") == "busy"]
        await asyncio.gather(*(self.interrupt_kernel(k) for k in busy), return_exceptions=True)
        deadline = time.monotonic() + 5
        while busy and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            busy = [k for k in busy if k in self and getattr(self._kernels[k], "execution_state", "") == "busy"]
        await super().shutdown_all(now=now)

    async def cull_kernel_if_idle(self, kernel_id: str):
        if kernel_id in self.pooled_kernel_ids():  # waiting for its page: idle by design
            return None
        return await super().cull_kernel_if_idle(kernel_id)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m kvlab.app_server DASHBOARD_FOLDER [voila arguments]", file=sys.stderr)
        return 2
    folder, voila_args = argv[0], argv[1:]
    atexit.register(shutil.rmtree, folder, True)
    token = os.environ.pop(TOKEN_ENV, None)
    if token:
        voila_args.append(f"--Voila.token={token}")
    from voila.app import Voila

    app = Voila.instance()
    app.initialize(voila_args)
    # jupyter_server's default ping timeout (3 pings) is longer than its ping interval, which tornado shortens
    # with a note on every page's websocket; say it once here: the timeout is the interval
    app.tornado_settings = {"ws_ping_timeout": WS_PING_MS, **app.tornado_settings}
    app.log.addFilter(_NotTrustedOnce())
    app.start()
    return 0


WS_PING_MS = 30_000  # jupyter_server's websocket ping interval (WS_PING_INTERVAL)


class _NotTrustedOnce(logging.Filter):
    """Drops jupyter_server's "Notebook … is not trusted", logged on every page load: ``kvlab app`` explains it
    once at start-up (the dashboard copy is unsigned; Voila runs it afresh and shows only that run's outputs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("Notebook %s is not trusted"))


if __name__ == "__main__":
    sys.exit(main())
