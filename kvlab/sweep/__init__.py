"""Many runs: a grid of ``kvlab simulate`` points, run on a local process pool or a Ray cluster, streamed to CSV or
Parquet as they finish, resumable.

    from kvlab.sweep import Grid, run_sweep
    run = run_sweep(requests, Grid(kv_pages=(80, 160, 320), page_sizes=(512,)), out="sweep.csv", workers=2)
    run.frame                       # one row per point: the settings, then kvlab simulate's totals

:mod:`.point` is one run (and the code path ``kvlab simulate`` shares), :mod:`.grid` the axes and their checks,
:mod:`.engine` where points run, :mod:`.store` the output file, :mod:`.run` the loop, :mod:`.command` the CLI.
"""

from kvlab.sweep.engine import ENGINES, Finished, LocalEngine, RayEngine, make_engine
from kvlab.sweep.grid import MODES, Grid, SweepError
from kvlab.sweep.point import TIMING_COLUMNS, TOTAL_COLUMNS, Point, run_point
from kvlab.sweep.run import SweepRun, run_sweep
from kvlab.sweep.store import COLUMNS, PARAM_COLUMNS

__all__ = ["COLUMNS", "ENGINES", "MODES", "PARAM_COLUMNS", "TIMING_COLUMNS", "TOTAL_COLUMNS", "Finished", "Grid",
           "LocalEngine", "Point", "RayEngine", "SweepError", "SweepRun", "make_engine", "run_point", "run_sweep"]
