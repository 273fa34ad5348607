"""Plan a spec end to end in the library: build the search space, search (and merge), build the Plan.

The search strategy is pluggable (a one-method protocol): the default searches in this process;
``tasks.ray_search`` provides one that searches table groups on Ray actors.
"""

from __future__ import annotations

from typing import Protocol

from rec import progress
from rec.cost.types import CostConfig
from rec.plan.build import build_plan
from rec.plan.types import Plan
from rec.search import SearchConfig, SearchResult, build_search_space, search_result
from rec.search.feasibility import packing_failure
from rec.search.pack import PackingError
from rec.search.space import SearchSpace
from rec.spec.types import Spec
from rec.topology.types import Topology


class Searcher(Protocol):
    def search(self, space: SearchSpace, config: SearchConfig) -> SearchResult: ...


class LocalSearcher:
    """Search every table in this process."""

    def search(self, space: SearchSpace, config: SearchConfig) -> SearchResult:
        return search_result(space, config)


def plan_spec(spec: Spec, topology: Topology, cost: CostConfig = CostConfig(),
              config: SearchConfig = SearchConfig(), searcher: Searcher | None = None) -> Plan:
    """The plan for ``spec`` on ``topology`` (search and merge); InputError if it cannot fit.
    ``rec.plan.check_plan`` validates it (the write step does, before writing)."""
    searcher = searcher or LocalSearcher()
    progress.update(f"cost model: the options of {len(spec):,} tables on {topology.world_size:,} ranks")
    space = build_search_space(spec, topology, cost)
    progress.update("searching")
    try:
        result = searcher.search(space, config)
    except PackingError as e:
        raise packing_failure(space, spec, e.tables) from None
    progress.update("building the plan")
    return build_plan(result, spec, topology, cost, config, result.info)
