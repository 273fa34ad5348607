"""What each further embedding module using a sharding type costs (``module_sharding_type_ms``):
predicted for the plans that have it, fitted from the probes that split a type over two modules,
and weighed by the search's plan-level pass."""

from __future__ import annotations

import numpy as np
import pytest

from rec.analysis.rank_times import plan_level_ms, predicted_ms
from rec.calibrate.fit import (
    Kind,
    Measured,
    base_profile,
    fit_profile,
    measured_types,
    parameters,
    types_everywhere,
    types_in_several_modules,
    with_value,
)
from rec.calibrate.probes import probe_plans
from rec.config.cost import CostConfig
from rec.planning import plan_spec
from rec.profile import DEFAULT_PROFILE, profile_from_dict, profile_to_dict
from rec.sharding import ShardingType, modules_using
from rec.spec import spec_from_rows
from rec.topology import read_topology
from rec.topology.validate import MS_PER_S
from tests.paths import CPU_2PROC

ROWS = (100_000, 50_000, 20_000, 20_000)


def tables_in(modules: int, allowed=("table_wise",)) -> list[dict]:
    """Four tables spread over ``modules`` embedding modules, each allowed ``allowed``."""
    return [{"name": f"t{i}", "num_embeddings": rows, "embedding_dim": 32, "pooling_factor": 2.0,
             "sharding_types": list(allowed), "module": f"model.m{i % modules}"} for i, rows in enumerate(ROWS)]


def test_a_further_module_of_a_sharding_type_costs_its_distributions_again():
    topology = read_topology(CPU_2PROC)
    profile = profile_from_dict({"extensions": {"iteration_ms": 1.0, "sharding_type_ms": {"table_wise": 0.5},
                                                "module_sharding_type_ms": {"table_wise": 2.0}}})
    older = profile_from_dict({"extensions": {"iteration_ms": 1.0, "sharding_type_ms": {"table_wise": 0.5}}})
    for modules in (1, 2, 4):
        plan = plan_spec(spec_from_rows(tables_in(modules)), topology)
        assert modules_using(plan.columns.sharding_type, plan.columns.modules) == {ShardingType.TABLE_WISE: modules}
        assert plan_level_ms(plan, profile) == 1.5 + 2.0 * (modules - 1)
        assert plan_level_ms(plan, older) == 1.5  # a profile without the key predicts as before
        assert plan_level_ms(plan, DEFAULT_PROFILE) == 0.0
        np.testing.assert_allclose(predicted_ms(plan, profile) - predicted_ms(plan, older), 2.0 * (modules - 1))
    assert "module_sharding_type_ms" not in str(profile_to_dict(older))  # older profiles keep their hash


def test_the_fit_recovers_a_planted_module_cost_from_the_probes_that_split_a_type():
    topology = read_topology(CPU_2PROC)
    probes = probe_plans(topology)
    plans = [p.plan for p in probes]
    types, kernels = measured_types(plans)
    several = types_in_several_modules(plans)
    assert set(several) == set(types)  # every measured type has a probe over two modules
    params = parameters(types, types_everywhere(plans), kernels, modules=several)
    truth = base_profile(topology, types, kernels, 0.2)
    rng = np.random.default_rng(3)
    for p in params:
        value = MS_PER_S / rng.uniform(2e8, 2e9) if p.kind is Kind.INVERSE_BANDWIDTH else (
            rng.uniform(0.01, 5.0) if p.kind is Kind.MS else rng.uniform(0.5, 3000.0))
        truth = with_value(truth, p, value)
    measured = [Measured(p.name, p.plan, float(predicted_ms(p.plan, truth).max())) for p in probes]

    fit = fit_profile(measured, topology, 0.2)

    for st in types:
        assert fit.profile.extensions.module_sharding_type_cost(st) == pytest.approx(
            truth.extensions.module_sharding_type_cost(st), rel=1e-4), st
    assert fit.max_abs_error < 1e-5


def test_a_type_a_second_module_would_pay_for_is_left_out_when_it_saves_less():
    topology = read_topology(CPU_2PROC)
    free_dp = {"coefficients": {"data_parallel": {"fwd": {"input_read_size_multiplier": 0, "lookup_size_multiplier": 0,
                                                          "embedding_output_multiplier": 0}}},
               "extensions": {"dp_optimizer_factor": 0}, "bandwidths": {"inter_host_bw": 1e18}}
    spec = spec_from_rows(tables_in(2, ("table_wise", "data_parallel")))
    assert {t.sharding_type for t in plan_spec(spec, topology, CostConfig(profile=profile_from_dict(free_dp))).tables} \
        == {ShardingType.DATA_PARALLEL}  # free per shard: every table replicated, in both modules
    costly = profile_from_dict({**free_dp, "extensions": {**free_dp["extensions"],
                                                          "module_sharding_type_ms": {"data_parallel": 50.0}}})
    plan = plan_spec(spec, topology, CostConfig(profile=costly))
    assert modules_using(plan.columns.sharding_type, plan.columns.modules).get(ShardingType.DATA_PARALLEL, 0) <= 1
    assert predicted_ms(plan).max() < 50.0
