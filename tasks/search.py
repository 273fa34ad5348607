"""Step 2, plan search (with the merge): local or on Ray actors, cached by what is planned.

The cache key is the plan_id the inputs will produce (spec hash, topology hash, planner
configuration), computed before searching. A cached plan is a plain ``plan.json`` (with its
``shards.parquet``) under ``CACHE_DIR/<key>/``, read back through the same validation as any plan
a user hands over: nothing is unpickled. For the ``ray``/``auto`` backends the key covers the
backend and the ``groups`` asked for (``None``: chosen at run time from the cluster's CPUs), so
it is not the plan_id itself; for ``local`` it is.

The searcher also merges: Ray's driver merges the group results and rebalances across ranks
(``rec.search.merge``), and ``plan_spec`` builds and validates the global plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from rec.cost.types import CostConfig
from rec.errors import InputError
from rec.plan import Plan, check_plan, read_plan, write_plan
from rec.plan.identity import plan_id, planner_config
from rec.planning import Searcher, plan_spec, replan_spec
from rec.search import SearchConfig
from rec.search.warm import MAX_REGRESS
from rec.settings import check, knob
from tasks.ingest import Inputs

MAX_GROUPS = 100_000


class Backend(StrEnum):
    LOCAL = "local"  # search in this process
    RAY = "ray"  # table groups on Ray actors (RAY_ADDRESS, or a local Ray started on demand)
    AUTO = "auto"  # Ray from AUTO_RAY_MIN_TABLES tables on, local below or when Ray is away


@dataclass(frozen=True)
class SearchSettings:
    """How to search; everything but ``backend``/``groups`` also goes into the plan_id."""

    backend: Backend = field(default=Backend.LOCAL, metadata=knob(
        "search in this process, on Ray actors, or pick by spec size"))
    groups: int | None = field(default=None, metadata=knob(
        "table groups for the Ray backend; none: from the table count and cluster CPUs",
        minimum=1, maximum=MAX_GROUPS))
    max_regress: float = field(default=MAX_REGRESS, metadata=knob(
        "with a previous plan: the critical path may be this much above a plan searched from scratch "
        "(0.02: 2 percent), and within it the fewest bytes move; 0: as good as from scratch", minimum=0.0,
        maximum=1.0))
    cost: CostConfig = field(default_factory=CostConfig)
    config: SearchConfig = field(default_factory=SearchConfig)

    def searcher(self, num_tables: int) -> Searcher | None:
        """The searcher for ``backend`` (None: the library's local default)."""
        if self.backend is Backend.LOCAL:
            return None
        from tasks.ray_search import searcher_for_backend

        return searcher_for_backend(self.backend.value, num_tables, self.groups)

    def request(self, previous: Plan | None = None) -> dict:
        """What the plan cache key adds: a non-local backend, a previous plan to replan from."""
        out: dict = {} if self.backend is Backend.LOCAL else {"backend": self.backend.value, "groups": self.groups}
        if previous is not None:
            out.update(previous_plan_id=previous.plan_id, max_regress=self.max_regress)
        return out


@dataclass(frozen=True)
class Found:
    plan: Plan
    cached: bool  # True: the plan cache gave the plan back, nothing was searched
    seconds: float  # wall time of this step (the search, or reading the cached plan)


def plan_key(inputs: Inputs, settings: SearchSettings, previous: Plan | None = None) -> str:
    """The plan_id these inputs will get (local), or that of the request (ray/auto)."""
    return plan_id(inputs.spec.spec_hash, inputs.topology.topology_hash,
                   planner_config(settings.cost, settings.config, settings.request(previous)))


def search_plan(inputs: Inputs, settings: SearchSettings = SearchSettings(),
                cache_dir: str | None = None, previous: Plan | None = None) -> Found:
    """The plan for ``inputs``: from ``cache_dir`` when planned before, else searched (and then
    cached). With ``previous``, the plan that moves least of it within ``settings.max_regress``
    (``rec.planning.replan_spec``). InputError when the tables cannot fit."""
    check(settings, "Cannot plan with these settings:")
    started = time.perf_counter()
    key = plan_key(inputs, settings, previous)
    cached = _cached(Path(cache_dir, key)) if cache_dir else None
    if cached is not None:
        return Found(cached, True, time.perf_counter() - started)
    searcher = settings.searcher(len(inputs.spec))
    if previous is None:
        plan = plan_spec(inputs.spec, inputs.topology, settings.cost, settings.config, searcher)
    else:
        plan = replan_spec(inputs.spec, inputs.topology, previous, settings.max_regress, settings.cost,
                           settings.config, searcher).plan
    seconds = time.perf_counter() - started
    if cache_dir:
        write_plan(plan, Path(cache_dir, key))
    return Found(plan, False, seconds)


def _cached(entry: Path) -> Plan | None:
    """The plan cached in ``entry``; None if absent, unreadable or no longer valid (replanned)."""
    if not (entry / "plan.json").is_file():
        return None
    try:
        plan = read_plan(entry)
        check_plan(plan)
    except InputError:
        return None
    return plan
