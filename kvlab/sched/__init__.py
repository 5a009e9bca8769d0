"""Time: requests, admission, decode, retraction — one discrete-event loop over the real pools and tree.

The names below are imported on first use (PEP 562), so importing one light module of the package
(``kvlab.sched.config``, ``cost``, ``ledger``) does not import the scheduler and torch with it.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {  # module -> the names the package re-exports from it
    "kvlab.sched.config": ("SchedulerConfig", "min_kv_tokens"),
    "kvlab.sched.cost": ("CostModel",),
    "kvlab.sched.request": ("RequestLike", "SimReq"),
    "kvlab.sched.result": ("RESULT_KEYS", "TOTALS_KEYS", "SimResult", "Totals"),
    "kvlab.sched.scheduler": ("Scheduler", "simulate"),
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        try:
            return import_module(f"{__name__}.{name}")  # a submodule, as the eager package had them all
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = ["RESULT_KEYS", "TOTALS_KEYS", "CostModel", "RequestLike", "Scheduler", "SchedulerConfig", "SimReq",
           "SimResult", "Totals", "min_kv_tokens", "simulate"]
