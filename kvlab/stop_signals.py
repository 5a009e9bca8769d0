"""A stop request by signal, as an exception: SIGINT (Ctrl-C), SIGTERM (``kill``) and SIGHUP (a closed terminal)
raise :class:`Stopped` in the main thread, so a command can say what it wrote and exit with the shell's status for
that signal (128 + its number: 130, 143, 129) instead of dying mid-write or printing a traceback.

    with stop_on_signals():
        ...  # Stopped (a KeyboardInterrupt) is raised here on the first signal
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A signal asked the command to stop; ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """The status a shell gives a process this signal ended: 128 + the signal's number."""
        return 128 + self.signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside: the first of ``SIGNALS`` raises :class:`Stopped`; later ones are ignored while the command cleans up
    (it is already stopping). Outside a main thread (where Python cannot set handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def stop(signum: int, frame: object) -> None:
        if not raised:
            raised.append(signum)
            raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["SIGNALS", "Stopped", "stop_on_signals"]
