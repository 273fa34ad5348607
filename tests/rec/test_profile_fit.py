"""Fitting a profile to measurements (rec.calibrate.fit), the probes it fits on, and the prediction
``shardflow measure`` compares with (rec.analysis.rank_times)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rec.analysis.rank_times import mixes_widths, plan_level_ms, predicted_ms, shard_rank_perf
from rec.calibrate.fit import (
    Kind,
    Measured,
    base_profile,
    design,
    fit_profile,
    measured_types,
    parameters,
    types_everywhere,
    with_value,
)
from rec.calibrate.probes import probe_plans
from rec.cost.unique import expected_distinct
from rec.errors import InputError
from rec.planning import plan_spec
from rec.profile import DEFAULT_PROFILE, profile_from_dict, profile_to_dict
from rec.profile.types import Machine
from rec.sharding import ComputeDevice, ComputeKernel, ShardingType
from rec.spec import read_spec
from rec.topology import read_topology, topology_from_dict
from rec.topology.validate import MS_PER_S
from tests.paths import CPU_2PROC, DEMO, ROOT

CACHING = 0.2


@pytest.fixture(scope="module")
def topology():
    return read_topology(CPU_2PROC)


@pytest.fixture(scope="module")
def probes(topology):
    return probe_plans(topology)


def true_values(params, seed=0):
    """Plausible fitted numbers for a cpu host: every one of them non-zero."""
    rng = np.random.default_rng(seed)
    out = []
    for p in params:
        if p.kind is Kind.INVERSE_BANDWIDTH:
            out.append(MS_PER_S / rng.uniform(2e8, 2e9))  # ms per byte of a 0.2-2 GB/s link
        elif p.kind is Kind.MS:
            out.append(rng.uniform(0.01, 5.0))
        else:
            out.append(rng.uniform(0.5, 3000.0))
    return out


def test_the_fit_recovers_the_numbers_that_made_the_measurements(topology, probes):
    plans = [p.plan for p in probes]
    types, kernels = measured_types(plans)
    params = parameters(types, types_everywhere(plans))
    truth = base_profile(topology, types, kernels, CACHING)
    values = true_values(params)
    for parameter, value in zip(params, values, strict=True):
        truth = with_value(truth, parameter, value)
    measured = [Measured(p.name, p.plan, float(predicted_ms(p.plan, truth).max())) for p in probes]
    machine = Machine(ComputeDevice.CPU, world_size=2, local_world_size=2)

    fit = fit_profile(measured, topology, CACHING, name="oracle", machine=machine)

    for parameter, value in zip(params, values, strict=True):
        written = MS_PER_S / value if parameter.kind is Kind.INVERSE_BANDWIDTH else value
        assert fit.values[parameter.name] == pytest.approx(written, rel=1e-5), parameter.name
    assert fit.left_out == ()
    assert fit.max_abs_error < 1e-5
    assert fit.profile.machine == machine and fit.profile.name == "oracle"
    assert profile_from_dict(profile_to_dict(fit.profile)) == fit.profile  # a valid profile file
    # The measuring job gives every sample a pooled vector (no variable batches): so does the profile.
    assert fit.profile.extensions.empty_bag_output_multiplier == 1.0


def test_every_probe_loads_every_rank_alike_so_its_time_is_one_number(probes):
    for probe in probes:
        ranks = shard_rank_perf(probe.plan)
        assert ranks.max() - ranks.min() <= 1e-9 * ranks.max(), probe.name


def test_the_probes_pin_down_every_fitted_number(topology, probes):
    plans = [p.plan for p in probes]
    types, kernels = measured_types(plans)
    params = parameters(types, types_everywhere(plans))
    a = design(plans, base_profile(topology, types, kernels, CACHING), params)[:, 0, :]
    scaled = a / np.linalg.norm(a, axis=0)
    assert np.linalg.matrix_rank(scaled, tol=1e-9) == len(params)


def test_quick_probes_are_about_half_and_still_pin_down_every_number(topology, probes):
    quick = probe_plans(topology, quick=True)
    assert len(quick) <= len(probes) * 0.6
    plans = [p.plan for p in quick]
    types, kernels = measured_types(plans)
    params = parameters(types, types_everywhere(plans))
    a = design(plans, base_profile(topology, types, kernels, CACHING), params)[:, 0, :]
    assert np.linalg.matrix_rank(a / np.linalg.norm(a, axis=0), tol=1e-9) == len(params)


def test_the_predicted_time_is_linear_in_the_fitted_numbers(topology, probes):
    plans = [p.plan for p in probes[::7]]
    types, kernels = measured_types([p.plan for p in probes])
    params = parameters(types, types_everywhere(plans))
    base = base_profile(topology, types, kernels, CACHING)
    columns = design(plans, base, params)
    values = true_values(params, seed=3)
    profile = base
    for parameter, value in zip(params, values, strict=True):
        profile = with_value(profile, parameter, value)
    for i, plan in enumerate(plans):
        np.testing.assert_allclose(predicted_ms(plan, profile), columns[i] @ values, rtol=1e-12)


def test_under_its_own_profile_the_prediction_is_the_plans_rank_perf(tmp_path):
    spec = read_spec(DEMO)
    topology = read_topology(CPU_2PROC)
    profile = profile_from_dict({"coefficients": {"table_wise": {"fwd": {"lookup_size_multiplier": 3.0,
                                                                          "unique_read_size_multiplier": 400.0}}},
                                 "bandwidths": {"intra_host_bw": "1GB/s"},
                                 "extensions": {"iteration_ms": 2.0, "sharding_type_ms": {"table_wise": 1.5}}})
    from rec.config.cost import CostConfig

    for cost in (CostConfig(), CostConfig(profile=profile)):
        plan = plan_spec(spec, topology, cost)
        np.testing.assert_allclose(shard_rank_perf(plan), plan.metrics.rank_perf, rtol=1e-12)
        level = plan_level_ms(plan)
        assert level == (0.0 if cost.profile.is_default else 2.0 + 1.5 * any(
            t.sharding_type.value == "table_wise" for t in plan.tables))
        np.testing.assert_allclose(predicted_ms(plan), np.asarray(plan.metrics.rank_perf) + level, rtol=1e-12)


def test_another_profile_rerates_the_same_placement():
    plan = plan_spec(read_spec(DEMO), read_topology(CPU_2PROC))
    slower = profile_from_dict({"bandwidths": {"intra_host_bw": "1GB/s"}})
    assert (predicted_ms(plan, slower) > predicted_ms(plan, DEFAULT_PROFILE)).all()
    np.testing.assert_allclose(predicted_ms(plan, DEFAULT_PROFILE), plan.metrics.rank_perf, rtol=1e-12)


def test_a_fit_without_measurements_fails_with_a_clear_message(topology, probes):
    timed_out = [Measured(p.name, p.plan, math.nan) for p in probes]
    with pytest.raises(InputError, match="no plan was measured"):
        fit_profile(timed_out, topology, CACHING)


def test_a_fit_with_fewer_plans_than_numbers_fails_naming_both(topology, probes):
    few = [Measured(p.name, p.plan, 10.0) for p in probes[:5]]
    with pytest.raises(InputError) as e:
        fit_profile(few, topology, CACHING)
    assert "5 plans measured" in str(e.value) and "numbers to fit" in str(e.value)


def test_a_fit_outside_the_profile_ranges_fails_instead_of_writing_nonsense(topology, probes):
    absurd = [Measured(p.name, p.plan, 1e15) for p in probes]  # days per iteration
    with pytest.raises(InputError, match="fitted"):
        fit_profile(absurd, topology, CACHING)


@pytest.mark.parametrize(("ids", "rows"), [(10, 1000), (1000, 1000), (41_000, 10_000), (41_000, 1_000_000),
                                           (400_000, 1000), (100, 10_000_000)])
def test_expected_distinct_rows_match_the_exact_sum_for_the_jobs_ids(ids, rows):
    k = np.arange(rows, dtype=float)
    p = ((k + 1) / rows) ** (1 / 3) - (k / rows) ** (1 / 3)  # rows x u**3, as rec.data.synthetic draws ids
    exact = float((1 - (1 - p) ** ids).sum())
    assert float(expected_distinct(ids, rows)) == pytest.approx(exact, rel=2e-3, abs=0.5)
    assert float(expected_distinct(ids, rows)) <= min(ids, rows)


def test_distinct_rows_are_few_for_a_small_table_and_all_ids_for_a_huge_one():
    assert float(expected_distinct(1e6, 1000)) == pytest.approx(1000)
    assert float(expected_distinct(100, 1e9)) == pytest.approx(100, rel=1e-3)
    assert float(expected_distinct(0, 1000)) == 0 and float(expected_distinct(5, 0)) == 0


def test_a_sharding_type_whose_collectives_cost_more_than_it_saves_is_left_out_of_the_plan():
    from rec.analysis import check_plan
    from rec.config.cost import CostConfig

    spec, topology = read_spec(DEMO), read_topology(CPU_2PROC)
    free_dp = {"coefficients": {"data_parallel": {"fwd": {"input_read_size_multiplier": 0, "lookup_size_multiplier": 0,
                                                          "embedding_output_multiplier": 0}}},
               "extensions": {"dp_optimizer_factor": 0}, "bandwidths": {"inter_host_bw": 1e18}}
    per_shard_only = profile_from_dict(free_dp)
    assert {t.sharding_type.value for t in plan_spec(spec, topology, CostConfig(profile=per_shard_only)).tables} \
        == {"data_parallel"}  # free per shard: every table replicated
    costly = profile_from_dict({**free_dp, "extensions": {**free_dp["extensions"],
                                                          "sharding_type_ms": {"data_parallel": 50.0}}})
    plan = plan_spec(spec, topology, CostConfig(profile=costly))
    assert "data_parallel" not in {t.sharding_type.value for t in plan.tables}
    assert predicted_ms(plan).max() < 50.0
    check_plan(plan)  # its bound, gap and estimates hold when the plan is read back


def test_a_replan_does_not_keep_a_sharding_type_whose_collectives_cost_more_than_moving_saves():
    from rec.analysis.rank_times import predicted_critical_path
    from rec.config.cost import CostConfig
    from rec.planning import replan_spec

    spec, topology = read_spec(DEMO), read_topology(CPU_2PROC)
    free_dp = {"coefficients": {"data_parallel": {"fwd": {"input_read_size_multiplier": 0, "lookup_size_multiplier": 0,
                                                          "embedding_output_multiplier": 0}}},
               "extensions": {"dp_optimizer_factor": 0}, "bandwidths": {"inter_host_bw": 1e18}}
    previous = plan_spec(spec, topology, CostConfig(profile=profile_from_dict(free_dp)))
    assert {t.sharding_type.value for t in previous.tables} == {"data_parallel"}
    costly = profile_from_dict({**free_dp, "extensions": {**free_dp["extensions"],
                                                          "sharding_type_ms": {"data_parallel": 50.0}}})
    replanned = replan_spec(spec, topology, previous, cost=CostConfig(profile=costly))
    # keeping every table in place would move nothing, but costs 50 ms an iteration more than moving
    assert "data_parallel" not in {t.sharding_type.value for t in replanned.plan.tables}
    assert predicted_critical_path(replanned.plan) <= 1.02 * predicted_critical_path(replanned.fresh) + 1e-9
    assert predicted_critical_path(replanned.plan) < 50.0


def one_gpu():
    return topology_from_dict({"world_size": 1, "local_world_size": 1, "compute_device": "cuda", "hbm_cap": "80GB",
                               "ddr_cap": "128GB", "batch_size": 512}, source="test")


@pytest.fixture(scope="module")
def cuda_probes():
    return probe_plans(one_gpu())


def test_on_cuda_the_fit_recovers_the_uvm_lookups_the_widest_rows_and_the_misses(cuda_probes):
    plans = [p.plan for p in cuda_probes]
    types, kernels = measured_types(plans)
    assert any(map(mixes_widths, plans))
    params = parameters(types, types_everywhere(plans), kernels, widths=True, misses=True)
    topology = one_gpu()
    base = base_profile(topology, types, kernels, 0.2, misses=True)
    moved = np.abs(design(plans, base, params)).max(axis=(0, 1)) > 0
    rng = np.random.default_rng(1)
    truth, values = base, []
    for parameter in params:
        value = MS_PER_S / rng.uniform(1e10, 1e12) if parameter.kind is Kind.INVERSE_BANDWIDTH else \
            rng.uniform(0.001, 0.05) if parameter.kind is Kind.MS else rng.uniform(0.05, 3.0)
        values.append(value)
        truth = with_value(truth, parameter, value)
    measured = [Measured(p.name, p.plan, float(predicted_ms(p.plan, truth).max())) for p in cuda_probes]

    fit = fit_profile(measured, topology, 0.2)

    for parameter, value, ok in zip(params, values, moved, strict=True):
        if ok:
            written = MS_PER_S / value if parameter.kind is Kind.INVERSE_BANDWIDTH else value
            assert fit.values[parameter.name] == pytest.approx(written, rel=1e-4), parameter.name
    assert {"fused_uvm.fwd.lookup_size_multiplier", "fused_uvm_caching.fwd.lookup_size_multiplier",
            "widest_dim_multiplier", "cache_miss_multiplier"} <= set(fit.values)
    assert fit.max_abs_error < 1e-4
    uvm = fit.profile.coefficients.of(ShardingType.TABLE_WISE, ComputeKernel.FUSED_UVM)
    assert uvm.fwd.input_read_size_multiplier == 0  # over the host link: its lookups alone


def test_the_cuda_probes_pin_down_every_number_they_move(cuda_probes):
    plans = [p.plan for p in cuda_probes]
    types, kernels = measured_types(plans)
    params = parameters(types, types_everywhere(plans), kernels, widths=True, misses=True)
    a = design(plans, base_profile(one_gpu(), types, kernels, 0.2, misses=True), params)[:, 0, :]
    a = a[:, np.abs(a).max(axis=0) > 0]
    assert np.linalg.matrix_rank(a / np.linalg.norm(a, axis=0), tol=1e-9) == a.shape[1]


@pytest.mark.parametrize("quick", [True, False])
def test_the_cuda_probes_of_two_nodes_of_8_gpus_fit_their_ranks_at_the_largest_batch_that_does(quick):
    """``shardflow calibrate --topology examples/topologies/h100_2x8.yaml`` refused its own probes
    (a rank's input buffers at the one-GPU batch of 1,048,576: "-12.0 GiB HBM"): a rank's buffers
    grow with the ranks. Each probe is now planned at the largest of its batches, halving, that fits,
    and the design still pins down every number the probes move."""
    sixteen = read_topology(ROOT / "examples/topologies/h100_2x8.yaml")
    probes = probe_plans(sixteen, quick=quick)
    alone = {p.name: p.plan.topology.batch_size for p in probe_plans(one_gpu(), quick=quick)}
    batches = {p.name: p.plan.topology.batch_size for p in probes}
    assert batches.keys() == alone.keys()
    assert all(batches[name] <= alone[name] for name in batches)
    assert any(batches[name] < alone[name] for name in batches)  # smaller where the ranks' memory decides
    plans = [p.plan for p in probes]
    types, kernels = measured_types(plans)
    params = parameters(types, types_everywhere(plans), kernels, widths=True, misses=True)
    a = design(plans, base_profile(sixteen, types, kernels, 0.2, misses=True), params)[:, 0, :]
    a = a[:, np.abs(a).max(axis=0) > 0]
    assert np.linalg.matrix_rank(a / np.linalg.norm(a, axis=0), tol=1e-9) == a.shape[1]
