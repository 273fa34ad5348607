"""Search table groups in parallel on Ray actors, merge and refine in the driver, then race the
exact stage's strategies (whole MILP, MILP neighbourhoods) on the actors and keep the best.

Each actor receives the search space once (through Ray's object store) and serves several
groups, then exact-stage tasks. A task whose actor dies is run again on another actor; the result
does not change, because every task is a pure function of its inputs (the exact stage's budgets
are deterministic, see ``rec.search.exact``). The local search runs the same tasks one after the
other, so both backends find the same plan.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from rec import progress
from rec.errors import InputError, Problem
from rec.search import SearchConfig, SearchResult
from rec.search.assignment import Assignment
from rec.search.bound import LowerBound
from rec.search.candidates import Ladder
from rec.search.exact import ExactOutcome, ExactTask, combine, exact_tasks, run_task
from rec.search.group import GroupResult, search_group, split_groups
from rec.search.merge import merge_groups
from rec.search.pack import PackingError
from rec.search.planner import first_plan, prepare, rescued
from rec.search.space import SearchSpace

log = logging.getLogger(__name__)

AUTO_RAY_MIN_TABLES = 5_000  # below this, Ray's start-up costs more than it saves
MIN_TABLES_PER_GROUP = 500


def default_groups(num_tables: int, cpus: int) -> int:
    """Two groups per CPU (so a slow group does not idle the others), none under 500 tables."""
    return max(1, min(2 * cpus, num_tables // MIN_TABLES_PER_GROUP))


class GroupSearcher:
    """The actor body: an ordinary class, so tests can call it without Ray."""

    def __init__(self, space: SearchSpace, ladder: Ladder):
        self.space, self.ladder = space, ladder

    def search(self, tables: np.ndarray) -> GroupResult:
        return search_group(self.space, tables, self.ladder)

    def first_plan(self, config: SearchConfig, bound: LowerBound) -> Assignment:
        return first_plan(self.space, config, bound, self.ladder)

    def exact(self, incumbent: Assignment, bound: LowerBound, task: ExactTask) -> ExactOutcome:
        return run_task(self.space, incumbent, bound, task)

    def pid(self) -> int:
        return os.getpid()


class RaySearcher:
    """``rec.planning.Searcher`` that searches groups on Ray actors."""

    def __init__(self, groups: int | None = None, actors: int | None = None,
                 address: str | None = None, max_group_retries: int = 3):
        self.groups, self.actors = groups, actors
        self.address = address if address is not None else os.environ.get("RAY_ADDRESS")
        self.max_group_retries = max_group_retries

    def search(self, space: SearchSpace, config: SearchConfig) -> SearchResult:
        import ray

        started_here = connect(self.address)
        try:
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            groups = self.groups or default_groups(space.num_tables, cpus)
            bound, ladder = prepare(space, config)
            pool = _Pool(space, ladder, self.actors or min(groups, cpus), self.max_group_retries)
            if groups == 1:  # nothing to merge: the local heuristic, on an actor
                assignment = pool.map("first_plan", [(config, bound)], self.after_first_wave)[0]
            else:
                results = pool.map("search", split_groups(space, groups), self.after_first_wave)
                try:
                    assignment = merge_groups(space, results, bound, config)
                except PackingError as e:
                    assignment = rescued(space, config, bound, e)
            tasks = exact_tasks(space, assignment, bound, config)
            outcomes = pool.map("exact", [(assignment, bound, t) for t in tasks])
        finally:
            if started_here:
                ray.shutdown()
        assignment, bound, stats = combine(assignment, bound, outcomes)
        return SearchResult(space, assignment, bound, info={"backend": "ray", "groups": groups},
                            stats=stats)

    def after_first_wave(self, actors: list) -> None:
        """Called once every actor has a group in flight (fault-injection point for tests)."""


class _Pool:
    """Actors holding the search space; runs calls on them, again elsewhere if an actor dies."""

    def __init__(self, space: SearchSpace, ladder: Ladder, n_actors: int, max_retries: int):
        import ray

        self.actor_cls = ray.remote(num_cpus=1)(GroupSearcher)
        self.space_ref = ray.put(space)
        self.ladder = ladder
        self.actors = [self.actor_cls.remote(self.space_ref, ladder) for _ in range(n_actors)]
        self.max_retries = max_retries

    def map(self, method: str, items: list, after_first_wave=None) -> list:
        """``actor.method(item)`` for every item (tuples are spread as arguments), in order."""
        import ray

        todo = deque(range(len(items)))
        attempts = [0] * len(items)
        pending: dict = {}
        results: list = [None] * len(items)
        idle = deque(self.actors)
        first_wave = True
        while todo or pending:
            while todo and idle:
                i = todo.popleft()
                actor = idle.popleft()
                args = items[i] if isinstance(items[i], tuple) else (items[i],)
                pending[getattr(actor, method).remote(*args)] = (i, actor)
            if first_wave and after_first_wave is not None:
                after_first_wave(self.actors)
            first_wave = False
            done, _ = ray.wait(list(pending), num_returns=1)
            i, actor = pending.pop(done[0])
            progress.update(f"Ray: {method} {len(items) - len(todo) - len(pending)}/{len(items)}",
                            len(items) - len(todo) - len(pending), len(items))
            try:
                results[i] = ray.get(done[0])
                idle.append(actor)
            except ray.exceptions.RayActorError as e:
                attempts[i] += 1
                if attempts[i] > self.max_retries:
                    raise RuntimeError(f"{method} {i} failed {attempts[i]} times on Ray actors") from e
                log.warning("Ray actor died while running %s %d; running it again", method, i)
                todo.appendleft(i)
                replacement = self.actor_cls.remote(self.space_ref, self.ladder)
                self.actors[self.actors.index(actor)] = replacement
                idle.append(replacement)
        return results


# Ray's single-machine mode (what it uses on macOS and Windows): every Ray server of a local Ray
# listens on loopback only, instead of on all interfaces as a cluster node does.
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def connect(address: str | None) -> bool:
    """Join the cluster at ``address`` or start a local Ray, reachable on loopback only; True if
    this call started it."""
    import ray

    if ray.is_initialized():
        return False
    try:
        if address:
            _check_reachable(address)
            ray.init(address=address, log_to_driver=False, configure_logging=False)
            return False
        progress.update("starting a local Ray")
        with _single_machine():
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        return True
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise InputError("Cannot reach the Ray cluster:",
                         [Problem(f"RAY_ADDRESS={address}" if address else "local Ray", str(e))]) from None


@contextmanager
def _single_machine() -> Iterator[None]:
    """Start the local Ray (its processes inherit the environment) in single-machine mode; the
    driver's own setting is restored after, so that a later ``RAY_ADDRESS`` cluster works."""
    from ray._private import ray_constants

    previous_env, previous = os.environ.get(SINGLE_MACHINE_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[SINGLE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import: ray may be imported already
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = previous
        if previous_env is None:
            os.environ.pop(SINGLE_MACHINE_ENV, None)
        else:
            os.environ[SINGLE_MACHINE_ENV] = previous_env


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast: ray.init retries an unreachable GCS for minutes before giving up."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise ConnectionError(f"nothing answers at {address} ({e})") from None


class AutoSearcher:
    """Local search for small specs; Ray for large ones, falling back to local if Ray fails."""

    def __init__(self, groups: int | None = None, min_tables: int = AUTO_RAY_MIN_TABLES):
        self.groups, self.min_tables = groups, min_tables

    def search(self, space: SearchSpace, config: SearchConfig) -> SearchResult:
        from rec.planning import LocalSearcher

        if space.num_tables < self.min_tables:
            return LocalSearcher().search(space, config)
        try:
            return RaySearcher(self.groups).search(space, config)
        except InputError as e:
            log.warning("Ray is not available (%s); searching locally", e.problems[0])
            return LocalSearcher().search(space, config)


def searcher_for_backend(backend: str, num_tables: int, groups: int | None = None):
    """The searcher for ``--backend``: ``ray`` or ``auto`` (``local`` is the library default)."""
    if backend == "ray":
        return RaySearcher(groups)
    if backend == "auto":
        return AutoSearcher(groups)
    raise ValueError(backend)
