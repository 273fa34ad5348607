"""Replanning with a previous plan moves as little as the critical-path budget allows."""

from __future__ import annotations

from typing import Any

import pytest

from rec.errors import InputError
from rec.plan import validate_plan
from rec.plan.movement import movement
from rec.planning import plan_spec, replan_spec
from rec.spec import spec_from_rows
from rec.spec.columns import table_to_row
from rec.spec.synthetic import criteo_1tb_spec, mixed_spec
from rec.topology import topology_from_dict

H100_2X8 = topology_from_dict({"world_size": 16, "local_world_size": 8, "compute_device": "cuda",
                               "hbm_cap": "80GiB", "ddr_cap": "128GiB", "batch_size": 512})


def changed(spec, add: int = 0, grow: tuple[str, ...] = (), remove: tuple[str, ...] = ()):
    rows: list[dict[str, Any]] = [table_to_row(t) for t in spec.tables if t.name not in remove]
    for row in rows:
        if row["name"] in grow:
            row["num_embeddings"] *= 2
    like = rows[len(rows) // 2]
    rows += [{**like, "name": f"added_{i}", "feature_names": [f"added_{i}"]} for i in range(add)]
    return spec_from_rows(rows)


def test_an_unchanged_spec_replans_to_a_plan_that_moves_nothing():
    spec = mixed_spec()
    previous = plan_spec(spec, H100_2X8)
    replanned = replan_spec(spec, H100_2X8, previous)
    assert replanned.movement.moved_bytes == 0
    assert replanned.plan.metrics.critical_path <= 1.02 * replanned.fresh.metrics.critical_path * (1 + 1e-9)
    assert replanned.plan.previous_plan_id == previous.plan_id
    assert not validate_plan(replanned.plan)


@pytest.mark.parametrize("max_regress", [0.02, 0.0])
def test_a_small_schema_change_moves_little_within_the_budget(max_regress):
    spec = mixed_spec()
    previous = plan_spec(spec, H100_2X8)
    new = changed(spec, add=3, grow=("medium_03",), remove=("tiny_007",))
    replanned = replan_spec(new, H100_2X8, previous, max_regress=max_regress)
    fresh_moves = movement(previous, replanned.fresh)
    m = replanned.movement
    budget = (1 + max_regress) * replanned.fresh.metrics.critical_path * (1 + 1e-9)
    assert replanned.plan.metrics.critical_path <= budget
    assert m.moved_bytes <= fresh_moves.moved_bytes
    assert (m.added_tables, m.removed_tables, m.resized_tables) == (3, 1, 1)
    if max_regress:
        assert m.moved_fraction <= 0.10
    assert replanned.plan.metrics.movement == m
    assert not validate_plan(replanned.plan)


def test_the_replan_is_deterministic_and_its_plan_id_names_the_previous_plan():
    spec = criteo_1tb_spec()
    previous = plan_spec(spec, H100_2X8)
    new = changed(spec, grow=("t_cat_0",))
    a, b = replan_spec(new, H100_2X8, previous), replan_spec(new, H100_2X8, previous)
    assert a.plan == b.plan
    assert a.plan.plan_id != a.fresh.plan_id
    assert a.plan.planner.previous_plan_id == previous.plan_id


def test_a_previous_plan_of_another_topology_is_refused():
    spec = criteo_1tb_spec()
    other = topology_from_dict({"world_size": 8, "local_world_size": 8, "compute_device": "cuda",
                                "hbm_cap": "80GiB", "ddr_cap": "128GiB"})
    with pytest.raises(InputError, match="another topology"):
        replan_spec(spec, H100_2X8, plan_spec(spec, other))


def test_a_replans_exact_stages_share_the_time_limit(monkeypatch):
    """The search from scratch, its passes' searches and the least-movement MILP share --time-limit:
    each later one runs for what the earlier left (the MILP for at least a quarter of it), each still
    sized from all of it, so that the replan is the plan it was wherever its cap is not reached."""
    import time

    import rec.planning
    from rec.config.search import SearchConfig
    from rec.planning import LEAST_MOVED_SHARE
    from rec.search.least_moved import least_moved
    from tests.rec.search_instances import RecordingSearcher

    least = []

    def recorded(space, prev, incumbent, target, seconds, wall_s=None):
        began = time.perf_counter()
        found = least_moved(space, prev, incumbent, target, seconds, wall_s)
        least.append((seconds, wall_s, time.perf_counter() - began))
        return found

    monkeypatch.setattr(rec.planning, "least_moved", recorded)
    spec, limit, searcher = mixed_spec(), 4.0, RecordingSearcher()
    previous = plan_spec(spec, H100_2X8)
    new = changed(spec, add=10)  # within the fresh plan's critical path, some data moves
    config = SearchConfig(time_limit_s=limit)
    replanned = replan_spec(new, H100_2X8, previous, 0.0, config=config, searcher=searcher)
    assert not validate_plan(replanned.plan) and replanned.movement.moved_bytes > 0
    (sized, first, spent), *later = searcher.runs
    assert sized == limit and first is None
    for sized, wall_s, exact_s in later:
        assert sized == limit and wall_s == pytest.approx(limit - spent)
        spent += exact_s
    ((seconds, wall_s, took),) = least
    assert seconds == limit and wall_s == pytest.approx(max(limit - spent, LEAST_MOVED_SHARE * limit))
    assert took <= wall_s + 1.0  # HiGHS stops within its time limit's checks
    assert replanned.plan == replan_spec(new, H100_2X8, previous, 0.0, config=config).plan
