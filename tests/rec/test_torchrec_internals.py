"""TorchRec's private attributes shardflow reads (``rec.torchrec_internals``), checked on the installed
TorchRec with real objects: a release that renames one fails here, not in a user's training."""

from __future__ import annotations

from importlib import metadata

import pytest

from rec import torchrec_internals as internals


def test_the_installed_torchrec_is_one_the_fence_was_checked_on():
    assert metadata.version("torchrec") in internals.CHECKED_ON


def test_the_optimizer_mark_is_what_apply_optimizer_in_backward_sets():
    import torch
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    marked, mine, plain = (torch.nn.Parameter(torch.zeros(2, 2)) for _ in range(3))
    apply_optimizer_in_backward(RowWiseAdagrad, [marked], {"lr": 0.1})
    internals.mark_optimizer(mine, RowWiseAdagrad)
    assert internals.optimizer_classes(marked) == [RowWiseAdagrad] == internals.optimizer_classes(mine)
    assert internals.optimizer_classes(plain) == []
    assert internals.optimizer_kwargs(marked) == [{"lr": 0.1}] and internals.optimizer_kwargs(plain) == []
    import torch.distributed.optim.apply_optimizer_in_backward as in_backward

    dropped = torch.nn.Parameter(torch.ones(2))
    apply_optimizer_in_backward(torch.optim.SGD, [dropped], {"lr": 1.0})
    internals.drop_in_backward_optimizers(dropped, in_backward)
    (2 * dropped).sum().backward()  # no SGD step in backward, and the gradient is kept for a step after it
    assert torch.equal(dropped.detach(), torch.ones(2)) and torch.equal(dropped.grad, torch.full((2,), 2.0))
    assert internals.optimizer_classes(dropped) == [] and not hasattr(dropped, "_in_backward_optimizers")


def test_a_planner_run_and_its_reservation_are_read(tmp_path):
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    from rec.spec.synthetic import issue2282_spec
    from rec.topology import topology_from_dict
    from rec.torchrec.score import run_torchrec_planner

    topology = topology_from_dict({"world_size": 2, "local_world_size": 2, "compute_device": "cuda",
                                   "hbm_cap": 1 << 33, "batch_size": 64})
    run = run_torchrec_planner(issue2282_spec(6), topology)
    assert run.num_proposals >= 1 and run.num_plans >= 1 and sum(run.sharding_types.values()) == 6
    assert "Proposer" in run.proposer
    assert internals.reservation_percentage(HeuristicalStorageReservation(percentage=0.3)) == pytest.approx(0.3)
    heuristic = HeuristicalStorageReservation(percentage=0.3, parameter_multiplier=2.0, dense_tensor_estimate=7)
    assert internals.reservation_dense(heuristic) == (2.0, 7)
    assert internals.reservation_dense(HeuristicalStorageReservation(percentage=0.3)) == (6.0, None)
    from torchrec.distributed.planner import storage_reservations as kinds

    assert internals.reservation_percentage(kinds.FixedPercentageStorageReservation(0.25)) == pytest.approx(0.25)
    if hasattr(kinds, "FixedAbsoluteStorageReservation"):  # not in TorchRec 1.6.1, the GPU image's
        assert internals.reservation_absolute_bytes(kinds.FixedAbsoluteStorageReservation(1 << 20)) == 1 << 20


@pytest.mark.parametrize("unpooled", [False, True])
def test_the_shardings_dmp_applied_are_read_from_both_sharded_module_kinds(single_process_group, unpooled):
    import torch
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from rec.plan.torchrec_plan import sharders_for, to_sharding_plan
    from rec.planning import plan_spec
    from rec.spec import spec_from_rows
    from rec.spec.torchrec_modules import spec_model
    from rec.topology import topology_from_dict

    rows = [{"name": f"t{i}", "num_embeddings": 100, "embedding_dim": 8, "module": "m",
             **({"pooling": "NONE"} if unpooled else {})} for i in range(3)]
    spec = spec_from_rows(rows)
    plan = plan_spec(spec, topology_from_dict({"world_size": 1, "local_world_size": 1, "compute_device": "cpu",
                                               "batch_size": 8}))
    dmp = DistributedModelParallel(spec_model(spec), device=torch.device("cpu"), plan=to_sharding_plan(plan),
                                   sharders=sharders_for(plan))
    sharded = dmp.module.get_submodule("m")
    shardings = internals.module_shardings(sharded)
    tables = {t.name for _, sharding in shardings for t in sharding.embedding_tables()}
    assert tables == {"t0", "t1", "t2"}
    assert {st for st, _ in shardings} == {t.sharding_type.value for t in plan.tables}
