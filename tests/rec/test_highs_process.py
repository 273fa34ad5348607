"""HiGHS runs in a worker process: a run that loops past its time limit is killed with its process,
so the planning process gets its core back, and the next run is answered by a new worker."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from rec.highs.instance import MODEL_ARRAYS
from rec.highs.process import HIGHS, HighsProcess
from rec.search import milp

LOOP = Path(__file__).parent / "highs_loop"
LOOPS = {"mip_heuristic_run_root_reduced_cost": True}  # the search runs with it off: here, the loop


@pytest.fixture(scope="module")
def looping():
    """The model HiGHS 1.16's root reduced-cost heuristic loops on past any time limit (the whole MILP
    of memory_tight_bench --third-shapes many_small-3308), and the start it loops from."""
    from rec.highs.instance import quiet_highs

    h = quiet_highs()
    h.readModel(str(LOOP / "model.mps.gz"))
    lp = h.getLp()
    model = milp.MilpModel(lp.num_col_, lp.num_row_, np.array(lp.col_cost_), np.array(lp.col_lower_),
                           np.array(lp.col_upper_), np.array([int(i) == 1 for i in lp.integrality_]),
                           np.array(lp.row_lower_), np.array(lp.row_upper_), np.array(lp.a_matrix_.start_),
                           np.array(lp.a_matrix_.index_), np.array(lp.a_matrix_.value_), 1.0,
                           *(np.zeros(0, np.int64),) * 7)
    start = np.zeros(lp.num_col_)
    start[[int(c) for c in (LOOP / "start.txt").read_text().splitlines()[1].split()]] = 1.0
    return model, start


def arrays_of(model):
    return {name: getattr(model, name) for name in MODEL_ARRAYS}


def gone(pid, within_s=10.0):
    deadline = time.monotonic() + within_s
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_run_that_loops_past_its_limit_is_killed_with_its_worker_and_the_next_run_is_answered(
        looping, monkeypatch, caplog):
    model, start = looping
    monkeypatch.setattr(milp, "WATCHDOG_GRACE_S", 0.5)
    milp.solve(model, milp.MilpLimits(100_000, 60.0), start)
    looped = HIGHS.worker_pid
    began = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="rec.search.milp"):
        out = milp.solve(model, milp.MilpLimits(100_000, 2.0), start, LOOPS)
    assert time.perf_counter() - began < 10
    assert out.values is None and out.capped and not out.optimal and out.status == "no answer 0.5 s past its time limit"
    assert "its run was stopped" in caplog.text
    assert looped is not None and gone(looped, 0.0)  # no core left spinning
    after = milp.solve(model, milp.MilpLimits(100_000, 60.0), start)
    assert after.optimal and after.values is not None
    assert HIGHS.worker_pid not in (None, looped)


def test_a_worker_ended_with_the_thread_that_started_it_is_started_again_for_the_next_run(looping):
    """Linux ends a worker with the thread that started it (PR_SET_PDEATHSIG), as when a Prefect
    task's thread ends: the next run, from another thread, gets a new worker."""
    model, start = looping
    highs = HighsProcess()
    options = milp.highs_options(milp.MilpLimits(100_000, 60.0))
    answers = []
    first = threading.Thread(target=lambda: answers.append(highs.run(arrays_of(model), options, start, 70.0)))
    first.start()
    first.join()
    ended = highs.worker_pid
    if sys.platform.startswith("linux"):
        assert ended is not None and gone(ended)
    second = highs.run(arrays_of(model), options, start, 70.0)
    assert answers[0].status.optimal and second.status.optimal and answers[0].objective == second.objective
    last = highs.worker_pid
    highs.close()
    assert last is not None and gone(last, 0.0) and highs.worker_pid is None


def test_a_worker_killed_during_a_run_is_replaced_and_the_run_tried_once_more(looping):
    model, start = looping
    highs = HighsProcess()
    highs.run(arrays_of(model), milp.highs_options(milp.MilpLimits(100_000, 60.0)), start, 70.0)
    killed = highs.worker_pid
    threading.Timer(0.2, os.kill, (killed, signal.SIGKILL)).start()
    began = time.perf_counter()
    loops = (*milp.highs_options(milp.MilpLimits(100_000, 60.0)), *LOOPS.items())
    assert highs.run(arrays_of(model), loops, start, 1.0) is None  # the new worker loops too, and is killed
    assert time.perf_counter() - began > 1.0
    assert gone(killed, 0.0) and highs.worker_pid is None


def test_where_no_worker_can_start_runs_are_made_in_this_process_after_one_warning(looping, monkeypatch, caplog):
    model, start = looping
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    highs = HighsProcess()
    options = milp.highs_options(milp.MilpLimits(100_000, 60.0))
    with caplog.at_level(logging.WARNING, logger="rec.highs.process"):
        runs = [highs.run(arrays_of(model), options, start, 70.0) for _ in range(2)]
    assert all(r is not None and r.status.optimal for r in runs)
    assert caplog.text.count("HiGHS runs in this process") == 1 and "/nonexistent/python" in caplog.text


def test_a_forked_child_runs_highs_in_a_worker_of_its_own_and_the_parents_keeps_answering(looping):
    """A pool of forked processes that plan (multiprocessing's fork) would otherwise write into the
    parent's worker's pipes, and the answers of the two would cross."""
    model, start = looping
    options = milp.highs_options(milp.MilpLimits(100_000, 60.0))
    highs = HighsProcess()
    ours = highs.run(arrays_of(model), options, start, 70.0)
    parents = highs.worker_pid
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            run = highs.run(arrays_of(model), options, start, 70.0)
            os.write(write, f"{highs.worker_pid} {run.objective!r}".encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 200).decode().split()
    os.waitpid(child, 0)
    assert int(answer[0]) not in (parents, None) and float(answer[1]) == ours.objective
    assert highs.run(arrays_of(model), options, start, 70.0).objective == ours.objective
    assert highs.worker_pid == parents
    highs.close()
