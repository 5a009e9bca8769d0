"""The teaching layer: every lab step and exercise of the notebooks, in one shape.

A lab (:class:`Lab`) has ``run(...)`` (do the experiment, return what happened), ``check(...)`` (compare the
learner's answer with kvlab's model: a :class:`CheckResult`, never a raise for a wrong answer) and
``solution`` (the reference code, hidden unless ``KVLAB_SOLUTIONS=1``). Two kinds: a prediction step
(``allocator_tour.TourStep``: the learner predicts numbers) and an :class:`Exercise` (the learner writes a
function that kvlab plugs into a real scenario).

==========================  ================================================================================
``check``                   :class:`CheckLine`, :class:`CheckResult`, :func:`compare`: what a check cell shows
``solution``                :class:`Solution` and the switch (:func:`solutions_enabled`, :func:`set_solutions`)
``lab``                     the shape: :class:`Lab`, :class:`Exercise`
``allocator_tour``          notebook 00: six prediction steps (``rounding`` ... ``expandable``)
``kv_pool_sizing``          notebook 01: ``measure`` (write SGLang's post-load reading)
``shortfall_eviction``      notebook 02: ``shortfall`` (how many tokens to ask the radix tree for)
``hybrid_caches``           notebook 03: ``resume`` (where a Mamba hit may resume)
``host_tier``               notebook 07: ``write_back`` (what device eviction does to a leaf under write_back)
==========================  ================================================================================

The labs sit above ``kvlab.experiments`` (they run its scenarios); nothing below imports them. A notebook imports
its lab module (``from kvlab.labs import kv_pool_sizing as lab``) and calls ``lab.measure.check(my_measure)``.
"""

from __future__ import annotations

import importlib

from kvlab.labs.check import CheckLine, CheckResult, ExerciseError, compare
from kvlab.labs.lab import Exercise, Lab
from kvlab.labs.solution import Solution, set_solutions, solutions_enabled

__all__ = ["NOTEBOOK_LABS", "CheckLine", "CheckResult", "Exercise", "ExerciseError", "Lab", "Solution", "all_labs",
           "compare", "set_solutions", "solutions_enabled"]

# notebook stem -> the module holding its labs (each module lists them in LABS, in notebook order)
NOTEBOOK_LABS = {
    "00_caching_allocator_tour": "kvlab.labs.allocator_tour",
    "01_kv_pool_sizing": "kvlab.labs.kv_pool_sizing",
    "02_shortfall_eviction": "kvlab.labs.shortfall_eviction",
    "03_hybrid_caches": "kvlab.labs.hybrid_caches",
    "07_host_tier": "kvlab.labs.host_tier",
}


def all_labs() -> dict[str, Lab]:
    """Every lab of every notebook, ``{"<notebook stem>.<key>": lab}`` in notebook order (imports the lab
    modules, and with them the experiments they run)."""
    return {f"{stem}.{lab.key}": lab
            for stem, module in NOTEBOOK_LABS.items()
            for lab in importlib.import_module(module).LABS}
