"""Time: requests, admission, decode, retraction — one discrete-event loop over the real pools and tree."""

from kvlab.sched.config import SchedulerConfig, min_kv_tokens
from kvlab.sched.cost import CostModel
from kvlab.sched.request import RequestLike, SimReq
from kvlab.sched.result import RESULT_KEYS, TOTALS_KEYS, SimResult, Totals
from kvlab.sched.scheduler import Scheduler, simulate

__all__ = ["RESULT_KEYS", "TOTALS_KEYS", "CostModel", "RequestLike", "Scheduler", "SchedulerConfig", "SimReq",
           "SimResult", "Totals", "min_kv_tokens", "simulate"]
