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
from enum import Enum
from pathlib import Path

from rec.cost.types import CostConfig
from rec.errors import InputError
from rec.plan import Plan, check_plan, read_plan, write_plan
from rec.plan.identity import plan_id, planner_config
from rec.planning import Searcher, plan_spec
from rec.search import SearchConfig
from rec.settings import check, knob
from tasks.ingest import Inputs

MAX_GROUPS = 100_000


class Backend(str, Enum):
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
    cost: CostConfig = field(default_factory=CostConfig)
    config: SearchConfig = field(default_factory=SearchConfig)

    def searcher(self, num_tables: int) -> Searcher | None:
        """The searcher for ``backend`` (None: the library's local default)."""
        if self.backend is Backend.LOCAL:
            return None
        from tasks.ray_search import searcher_for_backend

        return searcher_for_backend(self.backend.value, num_tables, self.groups)

    def request(self) -> dict:
        """What the plan cache key adds for a non-local backend."""
        if self.backend is Backend.LOCAL:
            return {}
        return {"backend": self.backend.value, "groups": self.groups}


@dataclass(frozen=True)
class Found:
    plan: Plan
    cached: bool  # True: the plan cache gave the plan back, nothing was searched
    seconds: float  # wall time of this step (the search, or reading the cached plan)


def plan_key(inputs: Inputs, settings: SearchSettings) -> str:
    """The plan_id these inputs will get (local), or that of the request (ray/auto)."""
    return plan_id(inputs.spec.spec_hash, inputs.topology.topology_hash,
                   planner_config(settings.cost, settings.config, settings.request()))


def search_plan(inputs: Inputs, settings: SearchSettings = SearchSettings(),
                cache_dir: str | None = None) -> Found:
    """The validated plan for ``inputs``: from ``cache_dir`` when planned before, else searched
    (and then cached). InputError when the tables cannot fit."""
    check(settings, "Cannot plan with these settings:")
    started = time.perf_counter()
    key = plan_key(inputs, settings)
    cached = _cached(Path(cache_dir, key)) if cache_dir else None
    if cached is not None:
        return Found(cached, True, time.perf_counter() - started)
    plan = plan_spec(inputs.spec, inputs.topology, settings.cost, settings.config,
                     settings.searcher(len(inputs.spec)))
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
