"""Step 2, plan search (with the merge): local or on Ray actors, cached by what is planned.

The cache key is the plan_id the inputs will produce (spec hash, topology hash, planner
configuration), computed before searching. A cached plan is a plain ``plan.json`` (with its
``shards.parquet`` and a signed digest of both) under ``CACHE_DIR/<key>/`` (``tasks.plan_cache``):
it is used only if it is exactly what the search wrote for these inputs and passes every check of
a plan read back; otherwise it is searched again, with one line saying so. For the ``ray``/``auto``
backends the key covers the backend and the ``groups`` asked for (``None``: chosen at run time
from the cluster's CPUs), so it is not the plan_id itself; for ``local`` it is.

The searcher also merges: Ray's driver merges the group results and rebalances across ranks
(``rec.search.merge``), and ``plan_spec`` builds and validates the global plan.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace

from rec.config.cost import CostConfig
from rec.config.planner_identity import Planner, PlannerIdentity
from rec.config.search import SearchConfig
from rec.errors import Problem
from rec.plan import Plan
from rec.plan.plan_id import plan_id, planner_config, replan_keys, searcher_keys
from rec.planning import Searcher, plan_spec, replan_spec
from rec.search.warm import MAX_REGRESS
from rec.settings import check, knob
from tasks.backend import Backend as Backend  # re-exported: SearchSettings.backend's type
from tasks.ingest import Inputs
from tasks.plan_cache import read_entry, write_entry

log = logging.getLogger(__name__)

MAX_GROUPS = 100_000


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
    profile: str | None = field(default=None, metadata=knob(
        "hardware profile YAML: the cost model's bandwidths and coefficients (docs/profile.md); default: TorchRec's",
        metavar="FILE", path=True))
    cost: CostConfig = field(default_factory=CostConfig)
    config: SearchConfig = field(default_factory=SearchConfig)

    def problems(self) -> list[Problem]:
        """What the bounds alone do not say, of the cost model's settings too (``check``)."""
        return self.cost.problems()

    def searcher(self, num_tables: int) -> Searcher | None:
        """The searcher for ``backend`` (None: the library's local default)."""
        if self.backend is Backend.LOCAL:
            return None
        from tasks.ray_search import searcher_for_backend

        return searcher_for_backend(self.backend, num_tables, self.groups)

    def connected(self, searcher: Searcher | None, num_tables: int) -> AbstractContextManager[None]:
        """Around a plan with ``searcher``: Ray joined once for all its searches (``local``: nothing)."""
        if self.backend is Backend.LOCAL:
            return nullcontext()
        from tasks.ray_search import one_ray

        return one_ray(searcher, num_tables)

    def request(self, previous: Plan | None = None) -> PlannerIdentity:
        """What the plan cache key adds: a non-local backend, a previous plan to replan from."""
        out = PlannerIdentity() if self.backend is Backend.LOCAL else searcher_keys(self.backend.value, self.groups)
        return out if previous is None else replan_keys(previous, self.max_regress, out)

    def planner(self, previous: Plan | None = None) -> PlannerIdentity:
        """The planner configuration of the request: a local search's plan has exactly this one."""
        return planner_config(self.cost, self.config, self.request(previous))


@dataclass(frozen=True)
class Found:
    plan: Plan
    cached: bool  # True: the plan cache gave the plan back, nothing was searched
    seconds: float  # wall time of this step (the search, or reading the cached plan)


def plan_key(inputs: Inputs, settings: SearchSettings, previous: Plan | None = None) -> str:
    """The plan_id these inputs will get (local), or that of the request (ray/auto)."""
    return plan_id(inputs.spec.spec_hash, inputs.topology.topology_hash, settings.planner(previous))


def search_plan(inputs: Inputs, settings: SearchSettings = SearchSettings(),
                cache_dir: str | None = None, previous: Plan | None = None) -> Found:
    """The plan for ``inputs``: from ``cache_dir`` when planned before, else searched (and then
    cached). With ``previous``, the plan that moves least of it within ``settings.max_regress``
    (``rec.planning.replan_spec``). InputError when the tables cannot fit."""
    check(settings, "Cannot plan with these settings:")
    started = time.perf_counter()
    key = plan_key(inputs, settings, previous)
    if cache_dir:
        found = read_entry(cache_dir, key, lambda plan: _not_requested(plan, inputs, settings, previous))
        if found.plan is not None:
            return Found(found.plan, True, time.perf_counter() - started)
        if found.refused is not None:
            log.warning("plan cache: entry %s does not match its inputs (%s); searched again", key, found.refused)
    searcher = settings.searcher(len(inputs.spec))
    with settings.connected(searcher, len(inputs.spec)):
        if previous is None:
            plan = plan_spec(inputs.spec, inputs.topology, settings.cost, settings.config, searcher)
        else:
            plan = replan_spec(inputs.spec, inputs.topology, previous, settings.max_regress, settings.cost,
                               settings.config, searcher).plan
    seconds = time.perf_counter() - started
    if cache_dir:
        write_entry(cache_dir, key, plan)
    return Found(plan, False, seconds)


def torchrec_search(inputs: Inputs, cost: CostConfig, planner: Planner) -> Found:
    """The plan TorchRec's own planner chooses for ``inputs`` (``rec.torchrec.stock_plan``), rated by
    shardflow's cost model under ``cost``; never cached (TorchRec plans in the seconds to minutes this
    takes). Imports torch."""
    from rec.torchrec.stock_plan import torchrec_plan

    started = time.perf_counter()
    plan = torchrec_plan(inputs.spec, inputs.topology, cost, planner)
    return Found(plan, False, time.perf_counter() - started)


def _not_requested(plan: Plan, inputs: Inputs, settings: SearchSettings, previous: Plan | None) -> str | None:
    """Why ``plan`` is not one a search of these inputs and settings gives; None if it is."""
    if plan.spec_hash != inputs.spec.spec_hash:
        return f"its plan is for spec {plan.spec_hash}, not {inputs.spec.spec_hash}"
    if plan.topology.topology_hash != inputs.topology.topology_hash:
        return "its plan is for another topology"
    if plan.previous_plan_id != (previous.plan_id if previous else None):
        return f"its plan was replanned from {plan.previous_plan_id or 'no plan'}"
    asked = settings.planner(previous)
    if replace(plan.planner, backend=None, groups=None) != replace(asked, backend=None, groups=None):
        return "its plan was made with other planner settings"
    return None


def with_profile(settings: SearchSettings) -> SearchSettings:
    """``settings`` planning under the profile file ``settings.profile`` names (docs/profile.md); none:
    unchanged. InputError naming every problem of the file."""
    if settings.profile is None:
        return settings
    from rec.profile import read_profile

    return replace(settings, cost=replace(settings.cost, profile=read_profile(settings.profile)))
