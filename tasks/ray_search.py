"""Search on Ray actors: ``rec.search.pipeline``'s pipeline with a mapper that runs its tasks on
actors (table groups in parallel, then the exact stage's strategies side by side); the driver
merges, refines and keeps the best.

Each actor receives the search space once (through Ray's object store) and runs several tasks on
it. A task whose actor dies is run again on another actor; the result does not change, because
every task is a pure function of the space and its item (the exact stage's budgets are
deterministic, see ``rec.search.exact``). The local search runs the same pipeline with the tasks
one after the other, so both backends find the same plan.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from rec import progress
from rec.config.search import SearchConfig
from rec.errors import ERROR_LINE, InputError, Problem
from rec.plan.plan_id import searcher_keys
from rec.search import SearchResult, search_result
from rec.search.assignment import Assignment
from rec.search.candidates import Ladder
from rec.search.group import GroupResult, search_group
from rec.search.space import SearchSpace
from tasks.backend import Backend
from tasks.ray_address import check_ray_joins, parse_ray_address
from tasks.ray_loopback import start_local

log = logging.getLogger(__name__)

AUTO_RAY_MIN_TABLES = 5_000  # below this, Ray's start-up costs more than it saves
MIN_TABLES_PER_GROUP = 500

T = TypeVar("T")
R = TypeVar("R")


def default_groups(num_tables: int, cpus: int) -> int:
    """Two groups per CPU (so a slow group does not idle the others), none under 500 tables."""
    return max(1, min(2 * cpus, num_tables // MIN_TABLES_PER_GROUP))


class GroupSearcher:
    """The actor body: holds the search space once and runs the pipeline's tasks on it; an
    ordinary class, so tests can call it without Ray."""

    def __init__(self, space: SearchSpace, ladder: Ladder | None = None):
        self.space, self.ladder = space, ladder

    def run(self, fn: Callable[[SearchSpace, T], R], item: T) -> R:
        return fn(self.space, item)

    def load(self, space: SearchSpace) -> None:
        """Hold another search's space (an actor kept for the next search of a plan)."""
        self.space = space

    def search(self, tables: np.ndarray) -> GroupResult:
        """One group's candidates, as the pipeline's group task rates them (``ladder``: the global one)."""
        assert self.ladder is not None, "a GroupSearcher made without the ladder searches no group"
        return search_group(self.space, tables, self.ladder)


class RaySearcher:
    """``rec.planning.Searcher`` that searches groups on Ray actors."""

    def __init__(self, groups: int | None = None, actors: int | None = None,
                 address: str | None = None, max_group_retries: int = 3):
        self.groups, self.actors = groups, actors
        self.address = address if address is not None else os.environ.get("RAY_ADDRESS")
        self.max_group_retries = max_group_retries
        self.kept: list[Any] | None = None  # inside session(): the last search's actors, for the next
        self.refused: InputError | None = None  # inside one_ray: why Ray could not be joined, told each search

    def search(self, space: SearchSpace, config: SearchConfig, start: Assignment | None = None,
               wall_s: float | None = None) -> SearchResult:
        import ray

        if self.refused is not None:
            raise self.refused
        with ray_session(self.address):
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            groups = self.groups or default_groups(space.num_tables, cpus)
            mapper = ActorMapper(space, self.actors or min(groups, cpus), self.max_group_retries,
                                 self.after_first_wave, self.kept or [])
            try:
                result = search_result(space, config, mapper, groups, start, wall_s)
            finally:
                if self.kept is not None:
                    self.kept = mapper.actors
        return replace(result, info=searcher_keys(Backend.RAY.value, groups))

    @contextmanager
    def session(self) -> Iterator[None]:
        """Around several searches on the Ray already joined: each search's actors are sent the next
        search's space instead of new actors starting for it (about half a second each), and are
        stopped at the end. Without a running Ray (each search starts its own) nothing is kept."""
        import ray

        if self.kept is not None or not ray.is_initialized():
            yield
            return
        self.kept = []
        try:
            yield
        finally:
            kept, self.kept = self.kept, None
            for actor in kept:
                ray.kill(actor)

    def after_first_wave(self, actors: list[Any]) -> None:
        """Called once every actor has a group in flight (fault-injection point for tests)."""


class ActorMapper:
    """``rec.search.mapper.Mapper`` on Ray actors that hold the search space: every task starts at
    once (as many at a time as there are actors), and one whose actor dies runs again on a fresh
    actor, up to ``max_retries`` times."""

    def __init__(self, space: SearchSpace, n_actors: int, max_retries: int,
                 after_first_wave: Callable[[list[Any]], None] | None = None, reuse: list[Any] | None = None):
        import ray

        self.actor_cls = ray.remote(num_cpus=1)(GroupSearcher)
        self.space_ref = ray.put(space)
        self.actors: list[Any] = []
        for actor in (reuse or [])[:n_actors]:  # an earlier search's actors, given this space
            try:
                ray.get(actor.load.remote(self.space_ref))
                self.actors.append(actor)
            except ray.exceptions.RayActorError:
                log.warning("a kept Ray actor died; starting another")
        for actor in (reuse or [])[n_actors:]:
            ray.kill(actor)
        self.started = n_actors - len(self.actors)
        if self.started:
            progress.update(f"starting {self.started} Ray actor{'s' if self.started > 1 else ''}")
        self.actors += [self.actor_cls.remote(self.space_ref) for _ in range(self.started)]
        self.max_retries = max_retries
        self.after_first_wave = after_first_wave  # called once, with the first tasks in flight

    def map(self, fn: Callable[[SearchSpace, T], R], items: Iterable[T]) -> list[R]:
        import ray

        tasks = list(items)
        name = getattr(fn, "func", fn).__name__
        todo = deque(range(len(tasks)))
        attempts = [0] * len(tasks)
        pending: dict[Any, tuple[int, Any]] = {}
        results: list[Any] = [None] * len(tasks)
        idle = deque(self.actors)
        while todo or pending:
            while todo and idle:
                i = todo.popleft()
                actor = idle.popleft()
                pending[actor.run.remote(fn, tasks[i])] = (i, actor)
            if self.after_first_wave is not None:
                hook, self.after_first_wave = self.after_first_wave, None
                hook(self.actors)
            done, _ = ray.wait(list(pending), num_returns=1)
            i, actor = pending.pop(done[0])
            finished = len(tasks) - len(todo) - len(pending)
            progress.update(f"Ray: {name} {finished}/{len(tasks)}", finished, len(tasks))
            try:
                results[i] = ray.get(done[0])
                idle.append(actor)
            except ray.exceptions.RayActorError as e:
                cannot = import_failure(e)
                if cannot:  # the same on every retry: the cluster's workers lack this shardflow
                    raise InputError("The Ray cluster's workers cannot run shardflow's search:", [Problem(
                        "RAY_ADDRESS's workers", f"{cannot}: install this shardflow on every node of the cluster "
                                                 "(the same version, importable there), or plan without "
                                                 "--backend ray")]) from None
                attempts[i] += 1
                if attempts[i] > self.max_retries:
                    raise RuntimeError(f"{name} {i} failed {attempts[i]} times on Ray actors") from e
                log.warning("Ray actor died while running %s %d; running it again", name, i)
                todo.appendleft(i)
                replacement = self.actor_cls.remote(self.space_ref)
                self.actors[self.actors.index(actor)] = replacement
                idle.append(replacement)
        return results


def import_failure(error: BaseException) -> str:
    """The error a worker met importing the actor's class (``ModuleNotFoundError: No module named
    'tasks.search'``), in one line; "" where the actor died otherwise."""
    text = str(error)
    if "failed to import on the worker" not in text:
        return ""
    lines = [line.strip() for line in text.splitlines()]
    return next((line for line in reversed(lines) if ERROR_LINE.match(line)), "its import failed")[:300]


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray joined at ``address`` (or started on loopback) for the block, and shut down after it if
    the block started it; a Ray already initialized is used as it is."""
    import ray

    started_here = connect(address)
    try:
        yield
    finally:
        if started_here:
            ray.shutdown()


def connect(address: str | None) -> bool:
    """Join the cluster at ``address`` or start a local Ray, reachable on loopback only; True if
    this call started it."""
    import ray

    if ray.is_initialized():
        return False
    try:
        if address:
            if address != "auto":  # Ray's own lookup of the cluster last started on this machine
                check_ray_joins(parse_ray_address(address))
            ray.init(address=address, log_to_driver=False, configure_logging=False)
            return False
        progress.update("starting a local Ray")
        start_local()
        return True
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise InputError("Cannot reach the Ray cluster:",
                         [Problem(f"RAY_ADDRESS={address}" if address else "local Ray", str(e))]) from None


class AutoSearcher:
    """Local search for small specs; Ray for large ones, falling back to local if Ray fails (after
    which it searches locally without trying Ray again)."""

    def __init__(self, groups: int | None = None, min_tables: int = AUTO_RAY_MIN_TABLES):
        self.groups, self.min_tables = groups, min_tables
        self.ray_failed = False
        self.ray = RaySearcher(groups)

    def uses_ray(self, num_tables: int) -> bool:
        return num_tables >= self.min_tables and not self.ray_failed

    def search(self, space: SearchSpace, config: SearchConfig, start: Assignment | None = None,
               wall_s: float | None = None) -> SearchResult:
        from rec.planning import LocalSearcher

        if not self.uses_ray(space.num_tables):
            return LocalSearcher().search(space, config, start, wall_s)
        try:
            return self.ray.search(space, config, start, wall_s)
        except InputError as e:
            self.ray_failed = True
            log.warning("Ray is not available (%s); searching locally", e.problems[0])
            return LocalSearcher().search(space, config, start, wall_s)


@contextmanager
def one_ray(searcher: object, num_tables: int) -> Iterator[None]:
    """Around a whole plan, whose passes search many times: where ``searcher`` searches on Ray, Ray
    is joined (or started) once, before the first search, and a Ray started here is shut down after
    the last, instead of once per search; the searches share one set of actors
    (``RaySearcher.session``). An unreachable cluster is each searcher's to report."""
    on_ray = _ray_searcher_of(searcher, num_tables)
    with ExitStack() as stack:
        if on_ray is not None:
            try:
                stack.enter_context(ray_session(on_ray.address))
            except InputError as e:  # RaySearcher raises it on its first search; AutoSearcher falls back there
                on_ray.refused = e  # rather than wait for the same answer again (seconds, for a listener not Ray)
                stack.callback(setattr, on_ray, "refused", None)
            else:
                stack.enter_context(on_ray.session())  # one set of actors for all the searches
        yield


def _ray_searcher_of(searcher: object, num_tables: int) -> RaySearcher | None:
    """The Ray searcher ``searcher`` plans ``num_tables`` tables with, or None where it plans locally."""
    if isinstance(searcher, RaySearcher):
        return searcher
    if isinstance(searcher, AutoSearcher) and searcher.uses_ray(num_tables):
        return searcher.ray
    return None


def searcher_for_backend(backend: Backend, num_tables: int, groups: int | None = None) -> RaySearcher | AutoSearcher:
    """The searcher for ``--backend``: ``ray`` or ``auto`` (``local`` is the library default)."""
    if backend == Backend.RAY:
        return RaySearcher(groups)
    if backend == Backend.AUTO:
        return AutoSearcher(groups)
    raise ValueError(backend)
