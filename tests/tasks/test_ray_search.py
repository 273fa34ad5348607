"""Plan search on a real local Ray: as good as local, deterministic, survives a dead actor."""

from __future__ import annotations

import logging

import pytest

from rec.config.search import SearchConfig
from rec.planning import plan_spec
from rec.spec.synthetic import power_law_spec
from rec.topology import topology_from_dict
from tasks.ray_search import GroupSearcher, RaySearcher

pytestmark = pytest.mark.slow  # a local Ray cluster

ray = pytest.importorskip("ray")
TOPO = topology_from_dict(dict(world_size=32, local_world_size=8, compute_device="cuda",
                               hbm_cap="80GiB", ddr_cap="128GiB"))


@pytest.fixture(scope="module")
def local_ray():
    from tasks.ray_loopback import start_local

    start_local(num_cpus=2)  # on loopback only, as the project starts it
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def spec():
    return power_law_spec(1200, seed=4)


@pytest.fixture(scope="module")
def local_plan(spec):
    return plan_spec(spec, TOPO)


@pytest.fixture(scope="module")
def ray_plan(local_ray, spec):
    """The spec planned on the local Ray in 4 groups on 2 actors (``RaySearcher(groups=4)`` on 2
    CPUs), once: the plan several tests compare with another search's."""
    return plan_spec(spec, TOPO, searcher=RaySearcher(groups=4, actors=2))


def test_a_plan_whose_passes_search_many_times_starts_ray_once_and_stops_it_after():
    """Where memory decides, the cache-size pass searches from every start on Ray: one local Ray
    and one set of actors serve them all (first in this file: no Ray is running yet)."""
    from rec import progress
    from rec.spec.validate import spec_from_rows
    from tasks.ingest import Inputs
    from tasks.search import Backend, SearchSettings, search_plan

    assert not ray.is_initialized()
    tight = spec_from_rows([{"name": f"t{i}", "num_embeddings": 10_000_000 + 100_000 * i, "embedding_dim": 64,
                             "pooling_factor": 4.0 + i} for i in range(2)])
    topology = topology_from_dict(dict(world_size=1, local_world_size=1, compute_device="cuda", hbm_cap="1GiB",
                                       batch_size=512))
    events: list[progress.Event] = []
    with progress.reporting(events.append), progress.step("search"):
        found = search_plan(Inputs(tight, topology, "tight.yaml", "topology.yaml"),
                            SearchSettings(backend=Backend.RAY, config=SearchConfig(time_limit_s=0)))
    starts = [e for e in events if e.message == "starting a local Ray"]
    assert len(starts) == 1 and not ray.is_initialized()
    # every search after the first runs on the first one's actors, each given the new space
    actors = [e.message for e in events if "Ray actor" in e.message]
    assert len(actors) == 1 and actors[0].startswith("starting "), actors
    assert found.plan.planner.backend == "ray"
    assert plan_spec(tight, topology, config=SearchConfig(time_limit_s=0)).tables == found.plan.tables


def test_ray_plan_is_as_good_as_the_local_search(ray_plan, local_plan):
    plan = ray_plan
    assert plan.planner.backend == "ray" and plan.planner.groups == 4
    assert plan.metrics.critical_path <= 1.01 * local_plan.metrics.critical_path
    assert {t.name for t in plan.tables} == {t.name for t in local_plan.tables}


def test_the_local_ray_the_project_starts_listens_on_loopback_only(local_ray):
    """Its GCS, raylet, agents and workers (docs/security.md; the other servers:
    tests/test_loopback_servers.py)."""
    import os

    from tests.listening import listening, not_loopback

    assert ray.get(ray.remote(lambda: 1).remote()) == 1  # a worker process is up too
    found = listening(os.getpid())
    assert found, "found no listening socket of the local Ray"
    assert not_loopback(found) == {}


def test_same_inputs_and_groups_give_the_same_plan_id(ray_plan, spec):
    a = ray_plan
    b = plan_spec(spec, TOPO, searcher=RaySearcher(groups=4, actors=2))
    assert a.plan_id == b.plan_id and a.tables == b.tables


def test_ray_races_the_exact_stage_and_finds_the_local_plan(local_ray):
    # Tables as large as a rank's HBM on two hosts: the exact stage runs both strategies on two
    # actors at once under Ray; locally the whole MILP runs first, proves its plan optimal and the
    # neighbourhood search is skipped. The driver keeps the same plan. The MILP stops at its proof
    # (well within the cap, whatever the machine's load), so both runs are deterministic.
    import numpy as np

    from rec.search.exact import OPTIMALITY_TOLERANCE
    from rec.spec.validate import spec_from_rows

    rng = np.random.default_rng(1)
    spec = spec_from_rows([{"name": f"t{i}", "num_embeddings": int(10 ** rng.uniform(5.5, 6.8)),
                            "embedding_dim": int(rng.choice((32, 64, 128))),
                            "pooling_factor": float(np.round(rng.uniform(1, 30), 1))} for i in range(10)],
                          source="tight")
    topology = topology_from_dict(dict(world_size=8, local_world_size=4, compute_device="cuda",
                                       hbm_cap="2GiB", ddr_cap="128GiB", batch_size=1024))
    config = SearchConfig(time_limit_s=10)
    local = plan_spec(spec, topology, config=config)
    on_ray = plan_spec(spec, topology, config=config, searcher=RaySearcher())
    assert local.metrics.gap <= OPTIMALITY_TOLERANCE  # proven optimal: what makes the plan independent of the load
    assert on_ray.planner.groups == 1
    assert on_ray.metrics.critical_path == local.metrics.critical_path
    assert on_ray.metrics.lower_bound == local.metrics.lower_bound
    assert on_ray.tables == local.tables


def test_the_actor_body_is_an_ordinary_class(spec):
    from rec.search import build_search_space
    from rec.search.group import split_groups
    from rec.search.pipeline import prepare

    space = build_search_space(spec, TOPO)
    group = split_groups(space, 4)[0]
    _, ladder = prepare(space, SearchConfig())
    result = GroupSearcher(space, ladder).search(group)
    assert list(result.tables) == list(group) and result.choices.shape[1] == len(group)
    assert (space.options.table[result.choices] == group).all()  # every choice is its table's


class InProcessGroups:
    """The same search pipeline in this process, with table groups as Ray's driver makes them."""

    def __init__(self, groups):
        self.groups = groups

    def search(self, space, config, start=None, wall_s=None):
        from rec.search import search_result

        return search_result(space, config, groups=self.groups, start=start, wall_s=wall_s)


def test_ray_runs_the_pipeline_of_this_process_and_finds_its_plan(ray_plan, spec):
    on_ray = ray_plan
    here = plan_spec(spec, TOPO, searcher=InProcessGroups(4))
    assert on_ray.tables == here.tables
    assert on_ray.metrics.critical_path == here.metrics.critical_path
    assert on_ray.metrics.lower_bound == here.metrics.lower_bound


def test_the_check_before_joining_a_cluster_takes_a_real_gcs(local_ray):
    """What ``connect`` asks of a RAY_ADDRESS before ``ray.init`` (a gRPC answer, where ray.init dials it)
    is what Ray's GCS gives."""
    from tasks.ray_address import check_ray_joins, parse_ray_address

    check_ray_joins(parse_ray_address(ray.get_runtime_context().gcs_address))


def test_workers_that_cannot_import_the_search_are_named_in_one_line(local_ray, spec, tmp_path, monkeypatch):
    """A cluster whose workers lack shardflow (or import another `tasks`): each group was tried 4 times,
    then a 74-line traceback ended `RuntimeError: search_group 1 failed 4 times on Ray actors`."""
    from rec.errors import InputError
    from tasks import ray_search

    (tmp_path / "driver_only_searcher.py").write_text(
        "from tasks.ray_search import GroupSearcher\n\n\nclass Searcher(GroupSearcher):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # here, not on the workers' path
    import driver_only_searcher  # type: ignore[import-not-found]

    monkeypatch.setattr(ray_search, "GroupSearcher", driver_only_searcher.Searcher)
    with pytest.raises(InputError) as refused:
        plan_spec(spec, TOPO, searcher=RaySearcher(groups=2, actors=1))
    (problem,) = refused.value.problems
    assert problem.reason.startswith("ModuleNotFoundError: No module named 'driver_only_searcher': install this "
                                     "shardflow on every node of the cluster")


# Last in the file: the killed actor's CPU stays taken for a while, and the next test's actors
# would wait ~13 s for it.
class KillFirstActor(RaySearcher):
    def after_first_wave(self, actors):
        ray.kill(actors[0])


def test_a_group_whose_actor_dies_is_searched_again_and_the_plan_is_unchanged(ray_plan, spec, caplog):
    undisturbed = ray_plan
    with caplog.at_level(logging.WARNING, logger="tasks.ray_search"):
        disturbed = plan_spec(spec, TOPO, searcher=KillFirstActor(groups=4, actors=2))
    assert "actor died" in caplog.text
    assert disturbed.plan_id == undisturbed.plan_id and disturbed.tables == undisturbed.tables
