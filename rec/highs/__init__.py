"""HiGHS, the search's MILP solver, run in a process of its own.

HiGHS 1.16 can loop where it checks neither its clock nor an interrupt (RESULTS §15: presolve's
``strengthenInequalities``, its root reduced-cost heuristic). A thread cannot be stopped, so a run
that loops in this process would keep a core until the process ends: a training job that plans with
``ShardflowPlanner`` would lose it for the whole training. In a worker process (``process``), such a
run is killed and the core comes back.

The worker imports numpy and highspy and nothing of ``rec.search``: it starts in a tenth of a second.
"""
