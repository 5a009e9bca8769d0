"""Time: requests, admission, decode, retraction — one discrete-event loop over the real pools and tree."""

from kvlab.sched.cost import CostModel
from kvlab.sched.result import SimResult, Totals
from kvlab.sched.scheduler import Scheduler, SchedulerConfig, SimReq, min_kv_tokens, simulate

__all__ = ["CostModel", "Scheduler", "SchedulerConfig", "SimReq", "SimResult", "Totals", "min_kv_tokens", "simulate"]
