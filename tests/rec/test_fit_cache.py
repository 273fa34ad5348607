"""Calibrating the caches on cuda: the probes that vary a cache's size and its ids' skew, the fitted
``cache_miss_multiplier`` (rec.calibrate.fit), and the confidence a fit reports of every number."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rec.analysis.rank_times import predicted_ms
from rec.calibrate.fit import (
    MISSES,
    Fit,
    Kind,
    Measured,
    base_profile,
    design,
    fit_profile,
    measured_types,
    misses_fitted,
    parameters,
    relative_errors,
    types_everywhere,
    types_in_several_modules,
    with_value,
)
from rec.calibrate.probes import FLAT_CURVE, SKEWED_CURVE, probe_plans, probe_specs
from rec.profile import DEFAULT_PROFILE
from rec.sharding import ComputeDevice, ComputeKernel, ShardingType
from rec.topology.validate import MS_PER_S
from tests.rec.test_profile_fit import one_gpu

CACHING = 0.2
PLANTED_MISSES = 2.5


@pytest.fixture(scope="module", name="cuda_probes")
def _cuda_probes():
    return probe_plans(one_gpu())


@pytest.fixture(scope="module")
def planted(cuda_probes):
    """The probes' parameters, a profile of known values (the misses' multiplier ``PLANTED_MISSES``),
    the values, and the probes' times under it."""
    plans = [p.plan for p in cuda_probes]
    types, kernels = measured_types(plans)
    params = parameters(types, types_everywhere(plans), kernels, widths=True, misses=True,
                        modules=types_in_several_modules(plans))
    truth = base_profile(one_gpu(), types, kernels, CACHING, misses=True)
    rng = np.random.default_rng(7)
    values = []
    for parameter in params:
        if parameter.name == MISSES:
            value = PLANTED_MISSES
        elif parameter.kind is Kind.INVERSE_BANDWIDTH:
            value = MS_PER_S / rng.uniform(1e10, 1e12)
        else:
            value = rng.uniform(0.001, 0.05) if parameter.kind is Kind.MS else rng.uniform(0.05, 3.0)
        values.append(value)
        truth = with_value(truth, parameter, value)
    times = np.array([float(predicted_ms(p.plan, truth).max()) for p in cuda_probes])
    return params, truth, values, times


def caching_groups(device, quick=False):
    return [g for p in probe_specs(device, quick) for g in p.groups if g.kernel is ComputeKernel.FUSED_UVM_CACHING]


def test_the_cuda_probes_vary_the_cache_size_and_the_ids_skew():
    groups = [g for g in caching_groups(ComputeDevice.CUDA) if g.cache_load_factor is not None]
    assert {g.cache_load_factor for g in groups} >= {0.05, 0.2, 0.6}
    assert {g.hit_rate_curve for g in groups} == {None, SKEWED_CURVE, FLAT_CURVE}
    assert {g.sharding_type for g in groups} >= {ShardingType.TABLE_WISE, ShardingType.ROW_WISE}
    quick = [g for g in caching_groups(ComputeDevice.CUDA, quick=True) if g.cache_load_factor is not None]
    assert len({g.cache_load_factor for g in quick}) >= 2  # --quick fits the misses too
    assert not caching_groups(ComputeDevice.CPU)  # no uvm on cpu


def test_a_probe_varies_the_ids_per_sample_at_the_bytes_of_the_base():
    for device in (ComputeDevice.CPU, ComputeDevice.CUDA):
        probes = {p.name: p for p in probe_specs(device)}
        base, more_ids = probes["table_wise"].groups[-1], probes["table_wise_pf16_dim16"].groups[-1]
        assert more_ids.pooling_factor == 4 * base.pooling_factor
        assert more_ids.pooling_factor * more_ids.dim == base.pooling_factor * base.dim


def test_the_planned_cache_probes_keep_their_cache_size_and_miss_differently(cuda_probes):
    from rec.cost.tables import table_arrays
    from rec.plan.load_factors import chosen_load_factors

    misses = set()
    for probe in cuda_probes:
        plan = probe.plan
        if "_cache" not in probe.name:
            continue
        arrays = table_arrays(plan.spec, plan.topology.batch_size, plan.planner.cost, chosen_load_factors(plan),
                              world_size=plan.world_size)
        cached = np.array([t.compute_kernel is ComputeKernel.FUSED_UVM_CACHING for t in plan.tables])
        assert cached.any(), probe.name
        misses.add(round(float(arrays.miss_rate[cached].max()), 3))
    assert len(misses) >= 5 and min(misses) < 0.1 and max(misses) > 0.7


def test_the_misses_are_fitted_only_where_a_cache_runs_on_cuda():
    cuda, cpu = one_gpu(), replace(one_gpu(), compute_device=ComputeDevice.CPU)
    assert misses_fitted(cuda, (ComputeKernel.FUSED, ComputeKernel.FUSED_UVM_CACHING))
    assert not misses_fitted(cuda, (ComputeKernel.FUSED, ComputeKernel.FUSED_UVM))
    assert not misses_fitted(cpu, (ComputeKernel.FUSED_UVM_CACHING,))


def test_with_the_misses_the_predicted_time_is_still_linear_in_the_fitted_numbers(cuda_probes, planted):
    params, truth, values, _ = planted
    chosen = [p for p in cuda_probes if "caching" in p.name or p.name in ("table_wise", "row_wise_dims16+256")]
    plans = [p.plan for p in chosen]
    types, kernels = measured_types([p.plan for p in cuda_probes])
    columns = design(plans, base_profile(one_gpu(), types, kernels, CACHING, misses=True), params)
    miss = [p.name for p in params].index(MISSES)
    assert (columns[:, :, miss] > 0).any()
    without = with_value(truth, params[miss], 0.0)
    for i, plan in enumerate(plans):
        np.testing.assert_allclose(predicted_ms(plan, truth), columns[i] @ values, rtol=1e-12)
        misses = columns[i, :, miss] * PLANTED_MISSES
        np.testing.assert_allclose(predicted_ms(plan, without), columns[i] @ values - misses, rtol=1e-12)
    assert truth.extensions.cache_miss_multiplier == PLANTED_MISSES  # the switch on: every column as under it


def test_the_fit_recovers_the_planted_miss_multiplier_with_a_small_error(cuda_probes, planted):
    params, _, values, times = planted
    measured = [Measured(p.name, p.plan, t) for p, t in zip(cuda_probes, times, strict=True)]

    fit = fit_profile(measured, one_gpu(), CACHING)

    assert fit.values[MISSES] == pytest.approx(PLANTED_MISSES, rel=1e-5)
    for parameter, value in zip(params, values, strict=True):
        if parameter.name in fit.values:
            written = MS_PER_S / value if parameter.kind is Kind.INVERSE_BANDWIDTH else value
            assert fit.values[parameter.name] == pytest.approx(written, rel=1e-4), parameter.name
    assert fit.profile.extensions.cache_miss_multiplier == pytest.approx(PLANTED_MISSES, rel=1e-5)
    assert fit.max_abs_error < 1e-5
    for name, error in fit.relative_errors.items():
        assert error is not None and error < 1e-6, name
    assert fit.poorly_determined == ()


def test_a_fit_without_misses_writes_a_profile_that_predicts_what_it_fitted(cuda_probes, planted):
    params, truth, _, _ = planted
    none = with_value(truth, params[[p.name for p in params].index(MISSES)], 0.0)
    measured = [Measured(p.name, p.plan, float(predicted_ms(p.plan, none).max())) for p in cuda_probes]

    fit = fit_profile(measured, one_gpu(), CACHING)

    assert fit.values[MISSES] < 1e-6 and fit.relative_errors[MISSES] is None  # at its bound: no error
    assert fit.max_abs_error < 1e-5  # the caching kernel at fused's bandwidth, whatever the multiplier


def test_with_noisy_times_the_errors_are_larger_and_the_misses_still_determined(cuda_probes, planted):
    _, _, _, times = planted
    noise = np.random.default_rng(3).normal(0.0, 0.03, len(times))
    measured = [Measured(p.name, p.plan, t * (1 + e)) for p, t, e in zip(cuda_probes, times, noise, strict=True)]

    fit = fit_profile(measured, one_gpu(), CACHING)

    errors = fit.relative_errors
    assert errors[MISSES] is not None and 1e-4 < errors[MISSES] < 0.5
    assert fit.values[MISSES] == pytest.approx(PLANTED_MISSES, rel=4 * errors[MISSES])
    assert all(e is None or e > 1e-4 for e in errors.values())
    assert set(fit.poorly_determined) == {n for n, e in errors.items() if e is not None and e > 0.5}


def test_relative_errors_match_least_squares_and_mark_the_undetermined():
    rng = np.random.default_rng(0)
    rows = rng.uniform(0.1, 1.0, (40, 3))
    x = np.linalg.lstsq(rows, np.ones(40), rcond=None)[0]
    residual = rows @ x - 1
    covariance = residual @ residual / (40 - 3) * np.linalg.inv(rows.T @ rows)
    np.testing.assert_allclose(relative_errors(rows, x, np.ones(40)), np.sqrt(np.diag(covariance)) / x, rtol=1e-9)

    twin = np.column_stack([rows[:, 0], rows[:, 0], rows[:, 1]])  # two columns alike: only their sum is known
    errors = relative_errors(twin, np.array([0.5, 0.5, 1.0]), np.ones(40))
    assert np.isinf(errors[:2]).all() and np.isfinite(errors[2])
    assert np.isnan(relative_errors(rows, np.array([x[0], 0.0, x[2]]), np.ones(40))[1])  # at the bound


def test_the_fit_report_and_summary_name_the_poorly_determined(tmp_path):
    from flows.commands.calibrate import render_calibrated
    from rec.calibrate.fit import ProbeFit
    from rec.topology import read_topology
    from tasks.calibrate import Calibrated, CalibrateSettings, ProbeResult, _fit_report
    from tests.paths import CPU_2PROC

    fit = Fit(DEFAULT_PROFILE, {"iteration_ms": 1.0, MISSES: 0.3, "intra_host_bw": 1e9},
              (ProbeFit("p", 2.0, 2.1),), (), {"iteration_ms": 0.01, MISSES: 0.9, "intra_host_bw": None})
    assert fit.poorly_determined == (MISSES,)
    report = _fit_report(fit, (ProbeResult("p", "id", (2.0,)),), (), str(CPU_2PROC), read_topology(CPU_2PROC),
                         str(tmp_path / "p.yaml"), CalibrateSettings())
    assert report["relative_errors"] == {"iteration_ms": 0.01, MISSES: 0.9, "intra_host_bw": None}
    assert report["poorly_determined"] == [MISSES]
    text = render_calibrated(Calibrated("p.yaml", "p.fit.json", str(tmp_path), fit, (), (), 1.0))
    assert f"poorly determined (standard error over 50%): {MISSES}\n" in text
    many = replace(fit, relative_errors={f"n{i}": 1.0 + i for i in range(6)})
    text = render_calibrated(Calibrated("p.yaml", "p.fit.json", str(tmp_path), many, (), (), 1.0))
    assert "over 50%): n5, n4, n3, n2 and 2 more (p.fit.json)" in text  # worst first
