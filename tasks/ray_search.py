"""Search table groups in parallel on Ray actors, then merge and refine in the driver.

Each actor receives the search space once (through Ray's object store) and serves several
groups. A group whose actor dies is searched again on another actor; the result does not change,
because a group's search is a pure function of its inputs.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import deque

import numpy as np

from rec.errors import InputError, Problem
from rec.search import SearchConfig, SearchResult
from rec.search.bound import lower_bound
from rec.search.group import GroupResult, search_group, split_groups
from rec.search.merge import merge_groups
from rec.search.planner import candidate_limits
from rec.search.space import SearchSpace

log = logging.getLogger(__name__)

AUTO_RAY_MIN_TABLES = 5_000  # below this, Ray's start-up costs more than it saves
MIN_TABLES_PER_GROUP = 500


def default_groups(num_tables: int, cpus: int) -> int:
    """Two groups per CPU (so a slow group does not idle the others), none under 500 tables."""
    return max(1, min(2 * cpus, num_tables // MIN_TABLES_PER_GROUP))


class GroupSearcher:
    """The actor body: an ordinary class, so tests can call it without Ray."""

    def __init__(self, space: SearchSpace, limits: list[float]):
        self.space, self.limits = space, limits

    def search(self, tables: np.ndarray) -> GroupResult:
        return search_group(self.space, tables, self.limits)

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
            limits = candidate_limits(space, config)
            results = self._run_groups(space, limits, split_groups(space, groups),
                                       self.actors or min(groups, cpus))
        finally:
            if started_here:
                ray.shutdown()
        assignment = merge_groups(space, results, config)
        return SearchResult(space, assignment, lower_bound(space),
                            info={"backend": "ray", "groups": groups})

    def after_first_wave(self, actors: list) -> None:
        """Called once every actor has a group in flight (fault-injection point for tests)."""

    def _run_groups(self, space, limits, groups, n_actors) -> list[GroupResult]:
        import ray

        actor_cls = ray.remote(num_cpus=1)(GroupSearcher)
        space_ref = ray.put(space)
        actors = [actor_cls.remote(space_ref, limits) for _ in range(n_actors)]
        todo = deque(range(len(groups)))
        attempts = [0] * len(groups)
        pending: dict = {}
        results: list[GroupResult | None] = [None] * len(groups)
        idle = deque(actors)
        first_wave = True
        while todo or pending:
            while todo and idle:
                g = todo.popleft()
                actor = idle.popleft()
                pending[actor.search.remote(groups[g])] = (g, actor)
            if first_wave:
                self.after_first_wave(actors)
                first_wave = False
            done, _ = ray.wait(list(pending), num_returns=1)
            g, actor = pending.pop(done[0])
            try:
                results[g] = ray.get(done[0])
                idle.append(actor)
            except ray.exceptions.RayActorError as e:
                attempts[g] += 1
                if attempts[g] > self.max_group_retries:
                    raise RuntimeError(f"group {g} failed {attempts[g]} times on Ray actors") from e
                log.warning("Ray actor died while searching group %d; searching it again", g)
                todo.appendleft(g)
                idle.append(actor_cls.remote(space_ref, limits))
        return [r for r in results if r is not None]


def connect(address: str | None) -> bool:
    """Join the cluster at ``address`` or start a local Ray; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    try:
        if address:
            _check_reachable(address)
            ray.init(address=address, log_to_driver=False, configure_logging=False)
            return False
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        return True
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise InputError("Cannot reach the Ray cluster:",
                         [Problem(f"RAY_ADDRESS={address}" if address else "local Ray", str(e))]) from None


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
