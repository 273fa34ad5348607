"""The GPU's kernel groups: FBGEMM runs a rank's tables of one sharding type at the widest one's
width (rec.cost.widest), and the search keeps narrow tables out of a wide table's group when that
is faster (rec.passes.split_widths). Its fit on cuda: tests/rec/test_profile_fit.py."""

from __future__ import annotations

from itertools import product

import pytest

from rec.analysis.iteration_time import prediction
from rec.analysis.rank_times import mixes_widths, predicted_critical_path, predicted_ms, widest_ms
from rec.config.cost import CostConfig
from rec.cost.bandwidth import kernel_bw, links
from rec.planning import plan_spec
from rec.profile import profile_from_dict
from rec.sharding import ComputeKernel
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict

ONE_GPU = {"world_size": 1, "local_world_size": 1, "compute_device": "cuda", "hbm_cap": "80GB", "ddr_cap": "128GB",
           "batch_size": 512}
TWO_GPUS = {**ONE_GPU, "world_size": 2, "local_world_size": 2}
WIDEST = 0.5


def gpus(d=ONE_GPU):
    return topology_from_dict(d, source="test")


def table(name, dim, pf=1.0, types=("table_wise",), kernels=("fused",), rows=100_000):
    return {"name": name, "num_embeddings": rows, "embedding_dim": dim, "pooling_factor": pf,
            "sharding_types": list(types), "compute_kernels": list(kernels)}


def profile(multiplier=WIDEST, **extensions):
    return profile_from_dict({"extensions": {"widest_dim_multiplier": multiplier, **extensions}})


def planned(rows, prof=None, topology=None):
    topology = topology or gpus()
    return plan_spec(spec_from_rows(rows, source="test"), topology, CostConfig(profile=prof or profile()))


def test_a_narrow_table_beside_a_wide_one_pays_for_the_lanes_up_to_128_columns():
    plan = planned([table("narrow", 16, pf=8.0), table("wide", 256)])
    fused = kernel_bw(links(plan.topology, plan.planner.profile), plan.planner.profile, ComputeKernel.FUSED, 0.2)
    ids = 512 * 8.0  # the narrow table's ids per iteration on one rank
    assert widest_ms(plan) == pytest.approx([WIDEST * ids * (128 - 16) * 4 / fused], rel=1e-12)
    assert predicted_ms(plan) - predicted_ms(plan, profile(0.0)) == pytest.approx(widest_ms(plan), rel=1e-12)


def test_tables_of_one_width_or_of_different_sharding_types_do_not_pay():
    assert not widest_ms(planned([table("a", 64, pf=8.0), table("b", 64)])).any()
    apart = planned([table("narrow", 16, pf=8.0), table("wide", 256, types=("row_wise",))])
    assert not mixes_widths(apart) and not widest_ms(apart).any()


def test_uvm_rows_in_the_fused_group_pay_at_the_hbm_kernels_bandwidth_not_the_host_links():
    hbm = planned([table("narrow", 16, pf=8.0), table("wide", 256)])
    uvm = planned([table("narrow", 16, pf=8.0, kernels=("fused_uvm",)), table("wide", 256)])
    assert widest_ms(uvm) == pytest.approx(widest_ms(hbm), rel=1e-12)  # one TBE: fused and fused_uvm share it


def test_only_tables_on_the_same_rank_share_a_group():
    rows = [table("narrow", 16, pf=8.0), table("wide", 256, pf=8.0)]
    plan = planned(rows, topology=gpus(TWO_GPUS))
    ranks = {t.name: t.ranks for t in plan.tables}
    if ranks["narrow"] != ranks["wide"]:  # balanced: one table per rank, nothing shares a kernel
        assert not widest_ms(plan).any()
    assert predicted_critical_path(plan) == pytest.approx(float(predicted_ms(plan).max()), rel=1e-12)


def test_the_plans_prediction_names_the_widest_rows_and_adds_up():
    plan = planned([table("narrow", 16, pf=8.0), table("wide", 256)], profile(WIDEST, iteration_ms=1.0))
    p = prediction(plan)
    assert p.widest_ms > 0 and p.iteration_ms == pytest.approx(predicted_critical_path(plan), rel=1e-12)
    assert "the kernel groups' widest rows" in p.text() and "plan-level terms 1.0000 ms" in p.text()
    default = prediction(planned([table("narrow", 16, pf=8.0), table("wide", 256)], profile(0.0)))
    assert default.widest_ms == 0 and "widest" not in default.text()


KINDS = ("table_wise", "row_wise")
SPLIT_ROWS = [table("wide", 256, pf=1.0, types=KINDS)] + [table(f"narrow{i}", 16, pf=16.0, types=KINDS)
                                                           for i in range(3)]
# row_wise dearer per id than table_wise: per shard the search puts every table table_wise
ROW_WISE_DEARER = {"coefficients": {"row_wise": {"fwd": {"input_read_size_multiplier": 4.0,
                                                         "lookup_size_multiplier": 4.0}}}}


def split_profile(multiplier):
    return profile_from_dict({**ROW_WISE_DEARER, "extensions": {"widest_dim_multiplier": multiplier}})


def test_per_shard_the_search_puts_narrow_and_wide_tables_in_one_group():
    plain = planned(SPLIT_ROWS, split_profile(0.0))
    assert {t.sharding_type.value for t in plain.tables} == {"table_wise"}


def test_the_search_keeps_narrow_tables_out_of_a_wide_tables_group_as_a_brute_force_would():
    prof = split_profile(2.0)
    every = [[{**r, "sharding_types": [st]} for r, st in zip(SPLIT_ROWS, choice, strict=True)]
             for choice in product(KINDS, repeat=len(SPLIT_ROWS))]
    best = min(predicted_critical_path(planned(rows, prof)) for rows in every)
    plan = planned(SPLIT_ROWS, prof)
    assert predicted_critical_path(plan) == pytest.approx(best, rel=1e-9)
    together = planned([{**r, "sharding_types": ["table_wise"]} for r in SPLIT_ROWS], prof)
    assert predicted_critical_path(plan) < predicted_critical_path(together)
    types = {t.name: t.sharding_type.value for t in plan.tables}
    assert types["wide"] not in {types[f"narrow{i}"] for i in range(3)}
