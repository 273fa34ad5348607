"""Use a shardflow plan in your own training script (docs/own-training-script.md).

A model with two embedding modules at nested paths — an EmbeddingBagCollection in the user tower
(``user.ebc``) and an EmbeddingCollection in a sequence block (``sequence.0.ec``, one embedding per
id of the browsing history) — is planned by shardflow and sharded by DistributedModelParallel with
exactly that plan, then trained a few steps with TorchRec's sparse-dist pipeline:

    shardflow spec from-model examples/train_own_model.py:build_model --out own_model.parquet
    shardflow plan own_model.parquet --topology examples/topologies/cpu_2proc.yaml --out out/own_plan
    torchrun --nproc-per-node 2 examples/train_own_model.py --plan out/own_plan

The same model trains under ``shardflow train`` too, which times it and checkpoints it:

    shardflow train --plan out/own_plan --model examples/train_own_model.py:shardflow_model
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from rec.errors import InputError
from rec.plan import read_plan
from rec.plan.torchrec_plan import plan_modules, sharders_for, to_sharding_plan

META = torch.device("meta")  # nothing is allocated until DMP places each shard on its rank
USER_FEATURES = {"user_id": 20_000, "user_country": 200}  # feature -> rows of its table
HISTORY_FEATURES = {"viewed_items": 50_000, "searches": 5_000}
HISTORY_LENGTH = 8.0  # mean ids per sample in each history feature
DIM = 16


class UserTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection([
            EmbeddingBagConfig(name=f"{f}_table", num_embeddings=rows, embedding_dim=DIM, feature_names=[f],
                               pooling=PoolingType.SUM) for f, rows in USER_FEATURES.items()], device=META)
        self.mlp = nn.Linear(DIM * len(USER_FEATURES), DIM, device=META)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.ebc(features).to_dict()
        return torch.relu(self.mlp(torch.cat([pooled[f] for f in USER_FEATURES], dim=1)))


class SequenceBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ec = EmbeddingCollection([
            EmbeddingConfig(name=f"{f}_table", num_embeddings=rows, embedding_dim=DIM, feature_names=[f])
            for f, rows in HISTORY_FEATURES.items()], device=META)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        per_id = self.ec(features)  # {feature: JaggedTensor of one embedding per id}
        means = []
        for f in HISTORY_FEATURES:  # the mean over each sample's history
            values, lengths = per_id[f].values(), per_id[f].lengths()
            summed = values.new_zeros((lengths.size(0), DIM)).index_add(0, torch.repeat_interleave(lengths), values)
            means.append(summed / lengths.clamp(min=1).unsqueeze(1).to(values.dtype))
        return torch.cat(means, dim=1)


class ShopModel(nn.Module):
    """forward(batch) returns (loss, output), TorchRec's convention (as DLRMTrain): its train
    pipelines run backward on the loss and return the output."""

    def __init__(self) -> None:
        super().__init__()
        self.user = UserTower()
        self.sequence = nn.ModuleList([SequenceBlock()])
        self.head = nn.Linear(DIM + DIM * len(HISTORY_FEATURES), 1, device=META)

    def forward(self, batch: ShopBatch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        hidden = torch.cat([self.user(batch.user), self.sequence[0](batch.history)], dim=1)
        logits = self.head(hidden).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach())


@dataclass
class ShopBatch(Pipelineable):
    """What TrainPipelineSparseDist moves to the device: one KJT per embedding module, labels."""

    user: KeyedJaggedTensor
    history: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> ShopBatch:
        return ShopBatch(self.user.to(device, non_blocking=non_blocking),
                         self.history.to(device, non_blocking=non_blocking),
                         self.labels.to(device, non_blocking=non_blocking))

    def record_stream(self, stream: torch.Stream) -> None:
        self.user.record_stream(stream)
        self.history.record_stream(stream)
        self.labels.record_stream(stream)

    def pin_memory(self) -> ShopBatch:
        return ShopBatch(self.user.pin_memory(), self.history.pin_memory(), self.labels.pin_memory())


def build_model() -> tuple[ShopModel, dict[str, ParameterConstraints]]:
    """For ``shardflow spec from-model``: the model, and what the planner should know about its
    features (ids per sample), keyed by table name as TorchRec's planner keys them."""
    constraints = {f"{f}_table": ParameterConstraints(pooling_factors=[HISTORY_LENGTH]) for f in HISTORY_FEATURES}
    return ShopModel(), constraints


def batches(rank: int, world_size: int, batch_size: int, device: torch.device) -> Iterator[ShopBatch]:
    """Synthetic batches for one rank (its own random ids); a real script reads its data here."""
    rng = np.random.default_rng(rank)

    def kjt(features: dict[str, int], mean_length: float) -> KeyedJaggedTensor:
        lengths = rng.poisson(mean_length, (len(features), batch_size))
        values = np.concatenate([rng.integers(0, rows, n.sum()) for rows, n in zip(features.values(), lengths,
                                                                                   strict=True)])
        return KeyedJaggedTensor.from_lengths_sync(keys=list(features), values=torch.from_numpy(values),
                                                   lengths=torch.from_numpy(lengths.ravel().astype(np.int32)))

    while True:
        yield ShopBatch(kjt(USER_FEATURES, 1.0), kjt(HISTORY_FEATURES, HISTORY_LENGTH),
                        torch.from_numpy((rng.random(batch_size) < 0.3).astype(np.float32)))


def shardflow_model() -> tuple[ShopModel, object]:
    """For ``shardflow train --model``: the model and its batch source (docs/training.md)."""
    return ShopModel(), batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True, help="the plan directory (or its plan.json)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--applied", help="rank 0 writes the sharding DMP applied here (JSON), read back "
                                          "from the sharded modules")
    args = parser.parse_args()
    try:
        plan = read_plan(args.plan)  # checked: sound and unedited
    except InputError as e:  # a wrong path, or a plan edited or damaged: its problems, not a traceback per rank
        print(f"{parser.prog}: {e.render()} (working directory {os.getcwd()})", file=sys.stderr)
        sys.exit(2)

    dist.init_process_group("gloo")  # torchrun's environment; "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")

    model = ShopModel()
    # Fused row-wise Adagrad for the tables of every planned module (user.ebc, sequence.0.ec): it
    # runs inside the sharded kernels' backward.
    for path in plan_modules(plan):
        apply_optimizer_in_backward(RowWiseAdagrad, model.get_submodule(path).parameters(), {"lr": 0.05})
    model = DistributedModelParallel(model, device=device, plan=to_sharding_plan(plan), sharders=sharders_for(plan))
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.Adagrad(params, lr=0.01))
    pipeline = TrainPipelineSparseDist(model, CombinedOptimizer([model.fused_optimizer, dense]), device)

    data = batches(rank, world, args.batch_size, device)
    for i in range(args.iterations):
        loss, _ = pipeline.progress(data)
        if rank == 0:
            print(f"iteration {i + 1}: loss {loss.item():.4f}", flush=True)

    if args.applied and rank == 0:
        from rec.train.applied import applied_tables  # what DMP did, from the sharded modules

        with open(args.applied, "w") as f:
            json.dump([t.to_dict() for t in applied_tables(model)], f, indent=1)
    # NCCL's barrier runs on this rank's GPU (and on cuda, torch.cuda.set_device(LOCAL_RANK) comes first)
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index or 0])
    else:
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is written. On gloo, a worker thread may still release a finished collective's
    # tensors (the pipeline has the next batch's input distribution in flight); if that lands in
    # interpreter finalization the process aborts ("terminate called without an active
    # exception") and torchrun reports a finished job as failed. So leave without finalization,
    # as shardflow's own training job does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
