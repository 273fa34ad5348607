"""HiGHS through highspy: the one module that knows highspy's particulars. It makes a solver that
prints nothing and reads a run's outcome through highspy's enums, never its status text.

Checked with highspy ``CHECKED_VERSION``; tests/rec/test_milp.py fails when another version is
installed and says what to check again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import highspy

CHECKED_VERSION = "1.16.0"
# A MILP as HiGHS takes it: column bounds and costs, integrality (bool), row bounds, and the
# column-wise sparse matrix (start, index, value).
MODEL_ARRAYS = ("cost", "col_lower", "col_upper", "integer", "row_lower", "row_upper", "start", "index", "value")


def quiet_highs() -> highspy.Highs:
    """A HiGHS instance that prints nothing (``output_flag`` off before its first call)."""
    h = _quiet_class()()
    h.setOptionValue("output_flag", False)
    return h


@cache
def _quiet_class() -> type[highspy.Highs]:
    import highspy

    class QuietHighs(highspy.Highs):
        """``highspy.Highs`` turns its Python callbacks on in its constructor, and HiGHS logs its
        banner to stdout there, before any option can be set (ERGO-Code/HiGHS#1702). The search
        uses no callback, so they stay off."""

        def enableCallbacks(self) -> None:
            pass

    return QuietHighs


@dataclass(frozen=True)
class RunStatus:
    """How a HiGHS run ended."""

    text: str  # HiGHS's wording ("Optimal", "Time limit reached"): for people, never compared
    optimal: bool  # proven optimal within the gap options
    timed_out: bool  # stopped by the wall-clock limit (``time_limit``)
    has_solution: bool  # a feasible solution is available


def run_status(h: highspy.Highs) -> RunStatus:
    """The outcome of ``h``'s last run."""
    import highspy

    status = h.getModelStatus()
    feasible = int(highspy.SolutionStatus.kSolutionStatusFeasible)
    return RunStatus(h.modelStatusToString(status), status == highspy.HighsModelStatus.kOptimal,
                     status == highspy.HighsModelStatus.kTimeLimit,
                     h.getInfo().primal_solution_status == feasible)


@dataclass(frozen=True)
class Run:
    """What one HiGHS run of a model gave, in the model's own units."""

    status: RunStatus
    values: np.ndarray | None  # the best solution's columns, None if none
    objective: float  # HiGHS's objective value (inf without a solution)
    dual_bound: float  # HiGHS's ``mip_dual_bound``, as it reports it
    nodes: int
    iterations: int  # simplex iterations: HiGHS's deterministic measure of work done
    seconds: float  # the run alone


def run_model(arrays: Mapping[str, np.ndarray], options: tuple[tuple[str, Any], ...],
              start: np.ndarray | None, wait_s: float | None = None) -> Run | None:
    """HiGHS run on the model of ``arrays`` (``MODEL_ARRAYS``) with ``options``, from the solution
    ``start`` where given, in this process; waited for at most ``wait_s`` (None: until it returns),
    else None (``run_within``)."""
    import highspy

    h = quiet_highs()
    for name, value in options:
        h.setOptionValue(name, value)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(arrays["cost"]), len(arrays["row_lower"])
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = arrays["cost"], arrays["col_lower"], arrays["col_upper"]
    lp.row_lower_, lp.row_upper_ = arrays["row_lower"], arrays["row_upper"]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = arrays["start"], arrays["index"], arrays["value"]
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in arrays["integer"]]
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start.tolist()
        sol.value_valid = True
        h.setSolution(sol)
    began = time.perf_counter()
    if wait_s is None:
        h.run()
    elif not run_within(h, wait_s):
        return None
    seconds = time.perf_counter() - began
    info = h.getInfo()
    status = run_status(h)
    values = np.array(h.getSolution().col_value) if status.has_solution else None
    return Run(status, values, float(info.objective_function_value) if status.has_solution else np.inf,
               float(info.mip_dual_bound), int(info.mip_node_count), int(info.simplex_iteration_count), seconds)


def run_within(h: highspy.Highs, seconds: float) -> bool:
    """``h.run()``, waited for at most ``seconds``; False where it has not returned by then. highspy
    releases the GIL while HiGHS runs, so the caller goes on; the run left behind keeps its thread (a
    daemon: it ends with the process) and its core until it returns, if ever."""
    import threading

    runner = threading.Thread(target=h.run, name="highs-run", daemon=True)
    runner.start()
    runner.join(seconds)
    return not runner.is_alive()
