"""The scheduler's memory errors are kvlab bugs, never a user's error, and the loop asks the host tier's timing
the same way with or without a host tier (kvlab/sched/memory.py, kvlab/sched/host_timing.py)."""

from __future__ import annotations

import ast
import inspect

import pytest
from sim_twins import Req

import kvlab.sched.scheduler as scheduler
from kvlab.cli import main
from kvlab.errors import KvlabBug, KvlabError
from kvlab.sched import SchedulerConfig
from kvlab.sched.host_timing import HostTierTiming, NoHostTier
from kvlab.sched.ledger import Ledger
from kvlab.sched.memory import AllocationError, RowsExhaustedError, SchedulerBug
from kvlab.sched.page_kv import PageKV
from kvlab.sched.result import Totals


def _memories(max_running: int):
    from kvlab.sched.kv import SchedulerKV
    from kvlab.sched.request import SimReq

    cfg = SchedulerConfig(kv_tokens=256, page_size=16, max_running=max_running)
    reqs = [SimReq.of(Req(f"r{i}", 0.0, tuple(range(100 * i, 100 * i + 20)), 4)) for i in range(4)]
    for r in reqs:
        r.extend_len = 20
    page = PageKV(cfg, Ledger(Totals()))
    page.prepare(reqs)  # (as the scheduler does when it chooses the page engine; the token-level memory ignores it)
    return (page, SchedulerKV(cfg, 64, Ledger(Totals()))), reqs


@pytest.mark.parametrize("which", [0, 1], ids=["page engine", "token-level memory"])
def test_more_requests_than_rows_is_a_bug_not_a_user_error(which):
    memories, reqs = _memories(max_running=2)
    kv = memories[which]
    for r in reqs:
        kv.match(r)
    with pytest.raises(RowsExhaustedError) as info:
        kv.alloc_extend(reqs)
    assert isinstance(info.value, KvlabBug) and not isinstance(info.value, KvlabError)


def test_an_allocation_the_scheduler_should_have_made_room_for_exits_3(monkeypatch, capsys, tmp_path):
    def short(self, running):
        raise AllocationError(f"Decode out of memory: {len(running)} requests, {self.available()} slots available")

    monkeypatch.setattr(PageKV, "alloc_decode", short)
    monkeypatch.setattr(PageKV, "take_decode_pages", lambda self, batch_size, num_pages: short(self, [0] * batch_size))
    monkeypatch.setenv("KVLAB_CRASH_DIR", str(tmp_path))
    code = main(["simulate", "--workload", "generated-shared-prefix", "--workload-param", "num_groups=2",
                 "--workload-param", "prompts_per_group=2", "--kv-tokens", "32768", "--page-size", "16"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "kvlab: error:" not in err  # not printed as the user's mistake
    assert issubclass(AllocationError, SchedulerBug)


def test_the_loop_has_no_host_tier_branch():
    """The host tier's clock is a component (HostTierTiming, or NoHostTier doing nothing): the loop never asks
    whether there is one."""
    source = inspect.getsource(scheduler.Scheduler._run)
    names = {n.id for n in ast.walk(ast.parse(source.strip().replace("\n    ", "\n"))) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(ast.parse(source.strip().replace("\n    ", "\n")))
              if isinstance(n, ast.Attribute)}
    assert not {name for name in names if "hicache" in name}


def test_no_host_tier_prices_a_step_at_its_compute_and_never_waits():
    none = NoHostTier()
    none.begin_step(3.0)
    assert none.end_step(0.25) == 0.25 and none.next_transfer_s() == float("inf")
    assert issubclass(HostTierTiming, NoHostTier)
