"""Time: requests, admission, decode, retraction — one discrete-event loop over the real pools and tree.

The names below are imported on first use (PEP 562), so importing one light module of the package
(``kvlab.sched.config``, ``cost``, ``ledger``) does not import the scheduler and torch with it.
"""

from __future__ import annotations

from kvlab.lazy import lazy_exports

_EXPORTS = {  # module -> the names the package re-exports from it
    "kvlab.sched.arrivals": ("ClosedLoop", "RequestRecord", "round_metrics"),
    "kvlab.sched.config": ("SchedulerConfig", "min_kv_tokens"),
    "kvlab.sched.cost": ("CostModel",),
    "kvlab.sched.request": ("RequestLike", "SimReq"),
    "kvlab.sched.result": ("RESULT_KEYS", "TOTALS_KEYS", "SimResult", "Totals"),
    "kvlab.sched.scheduler": ("Scheduler", "simulate"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = ["RESULT_KEYS", "TOTALS_KEYS", "ClosedLoop", "CostModel", "RequestRecord", "RequestLike", "Scheduler", "SchedulerConfig", "SimReq",
           "SimResult", "Totals", "min_kv_tokens", "round_metrics", "simulate"]
