"""The dense optimizer of float16 data_parallel tables (``rec.train.float32_adagrad``): torch's Adagrad
exactly on float32 parameters; on float16 ones, rows without a gradient stay as they are (torch's
own makes them NaN) and the others follow the float32 run to float16's precision."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rec.train.float32_adagrad import Float32Adagrad  # noqa: E402


def steps(param, optimizer_class, grads):
    optimizer = optimizer_class([param], lr=0.05)
    for g in grads:
        param.grad = g.to(param.dtype)
        optimizer.step()
    return param.detach()


def table_grads():
    """Gradients of an 8-row table whose rows 4-7 are never looked up (their gradient is 0)."""
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(8, 4, generator=generator) * 1e-3 for _ in range(5)]
    for g in grads:
        g[4:] = 0
    return grads


def test_on_float32_parameters_it_is_torchs_adagrad():
    start = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    ours = steps(torch.nn.Parameter(start.clone()), Float32Adagrad, table_grads())
    torchs = steps(torch.nn.Parameter(start.clone()), torch.optim.Adagrad, table_grads())
    assert torch.equal(ours, torchs)


def test_a_float16_tables_untouched_rows_stay_and_the_rest_follow_the_float32_run():
    start = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)).half()
    assert torch.isnan(steps(torch.nn.Parameter(start.clone()), torch.optim.Adagrad, table_grads())).any()
    half = steps(torch.nn.Parameter(start.clone()), Float32Adagrad, table_grads())
    full = steps(torch.nn.Parameter(start.float()), torch.optim.Adagrad, table_grads())
    assert half.dtype is torch.float16 and torch.equal(half[4:], start[4:])
    assert torch.allclose(half.float(), full, atol=2e-3, rtol=2e-3)


def test_a_resumed_training_of_a_float16_data_parallel_table_is_the_same_as_an_unbroken_one(single_process_group,
                                                                                             tmp_path):
    """Its Adagrad makes its state at the first step: a resume once loaded none of the checkpoint's
    into it, and went on from a sum of 0."""
    from dataclasses import replace

    import numpy as np
    import pyarrow.parquet as pq

    from rec.plan import read_plan, write_plan
    from rec.planning import plan_spec
    from rec.spec import spec_from_rows
    from rec.topology import topology_from_dict
    from rec.train.config import TrainConfig
    from rec.train.job import train
    from tests.rec.test_training_data import Output

    spec = spec_from_rows([dict(name="a", num_embeddings=100, embedding_dim=8, data_type="FP16",
                                sharding_types=["data_parallel"]), dict(name="b", num_embeddings=100, embedding_dim=8)])
    topology = topology_from_dict(dict(world_size=1, compute_device="cpu", ddr_cap="4GiB", batch_size=16))
    plan = read_plan(write_plan(plan_spec(spec, topology), tmp_path / "plan"))
    config = TrainConfig(iterations=3, warmup=1, dense_lr=0.1)
    train(plan, config, str(tmp_path / "a"), Output())
    train(plan, replace(config, iterations=2, checkpoint_every=2), str(tmp_path / "b"), Output())
    train(plan, replace(config, checkpoint_every=2, resume=True), str(tmp_path / "b"), Output())
    losses = [pq.read_table(tmp_path / run / "iterations.parquet").column("loss").to_numpy() for run in ("a", "b")]
    assert np.array_equal(*losses)
