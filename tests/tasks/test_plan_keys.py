"""Replans' plan cache keys: a replan is cached under its own plan_id (local search), found again,
and never served for another previous plan, budget or backend."""

from __future__ import annotations

from rec.config.search import SearchConfig
from tasks.search import Backend, SearchSettings, plan_key, search_plan


def test_a_replan_is_cached_under_its_plan_id_and_found_again(tmp_path, demo_inputs):
    inputs = demo_inputs
    previous = search_plan(inputs).plan
    settings = SearchSettings(max_regress=0.05)
    first = search_plan(inputs, settings, str(tmp_path), previous)
    again = search_plan(inputs, settings, str(tmp_path), previous)
    assert (first.cached, again.cached) == (False, True) and again.plan == first.plan
    assert first.plan.previous_plan_id == previous.plan_id
    assert first.plan.plan_id == plan_key(inputs, settings, previous) != previous.plan_id
    assert (tmp_path / first.plan.plan_id / "plan.json").is_file()


def test_a_cached_plan_is_not_served_for_another_previous_plan_budget_or_backend(tmp_path, demo_inputs):
    inputs = demo_inputs
    previous = search_plan(inputs, SearchSettings(), str(tmp_path)).plan
    other = search_plan(inputs, SearchSettings(config=SearchConfig(time_limit_s=0))).plan  # another plan_id
    replanned = search_plan(inputs, SearchSettings(), str(tmp_path), previous)
    assert not replanned.cached  # the fresh plan is cached, but it is not a replan of itself
    asks = [(SearchSettings(), None), (SearchSettings(), previous), (SearchSettings(), other),
            (SearchSettings(max_regress=0.05), previous), (SearchSettings(backend=Backend.RAY), previous),
            (SearchSettings(backend=Backend.RAY, groups=3), previous), (SearchSettings(backend=Backend.RAY), None)]
    keys = [plan_key(inputs, settings, p) for settings, p in asks]
    assert other.plan_id != previous.plan_id and len(set(keys)) == len(asks)
    for settings, p in asks[2:4]:
        assert not search_plan(inputs, settings, str(tmp_path), p).cached
