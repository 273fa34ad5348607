"""HiGHS through highspy: the one module that knows highspy's particulars. It makes a solver that
prints nothing and reads a run's outcome through highspy's enums, never its status text.

Checked with highspy ``CHECKED_VERSION``; tests/rec/test_milp.py fails when another version is
installed and says what to check again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import highspy

CHECKED_VERSION = "1.16.0"


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


def run_within(h: highspy.Highs, seconds: float) -> bool:
    """``h.run()``, waited for at most ``seconds``; False where it has not returned by then. highspy
    releases the GIL while HiGHS runs, so the caller goes on; the run left behind keeps its thread (a
    daemon: it ends with the process) and its core until it returns, if ever."""
    import threading

    runner = threading.Thread(target=h.run, name="highs-run", daemon=True)
    runner.start()
    runner.join(seconds)
    return not runner.is_alive()
