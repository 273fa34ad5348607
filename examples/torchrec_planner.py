"""A TorchRec training script that plans with shardflow: ``ShardflowPlanner`` where the script had
``EmbeddingShardingPlanner`` (docs/torchrec-planner.md). The rest is TorchRec as usual:

    torchrun --nproc-per-node 2 examples/torchrec_planner.py

Rank 0 plans the model of ``examples/train_own_model.py`` (an EmbeddingBagCollection at
``user.ebc``, an EmbeddingCollection at ``sequence.0.ec``) in well under a second and sends the plan
to the other ranks; DistributedModelParallel shards the model with it and trains a few steps.
``--plan-dir DIR`` also writes the plan as plan.json, so ``shardflow show DIR`` and ``shardflow
measure --plan DIR`` work on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from rec.errors import InputError
from rec.target import target_function
from rec.torchrec import ShardflowPlanner

OWN_MODEL = Path(__file__).parent / "train_own_model.py"  # the model and its data: examples/train_own_model.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--plan-dir", help="also write the plan here (plan.json, shards.parquet)")
    parser.add_argument("--ddr-cap", type=int, default=None, help="bytes of host memory per rank (TorchRec's default)")
    parser.add_argument("--out", help="each rank writes the ShardingPlan it got to OUT/plan-RANK.json")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    model, constraints = target_function(f"{OWN_MODEL}:build_model")()
    for path in ("user.ebc", "sequence.0.ec"):
        apply_optimizer_in_backward(RowWiseAdagrad, model.get_submodule(path).parameters(), {"lr": 0.05})
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]

    # The one line that changes: EmbeddingShardingPlanner(...) becomes ShardflowPlanner(...).
    topology = TopologyFactory.create_topology(TrainerConfig(world_size=world, local_world_size=world,
                                                             ddr_cap_bytes=args.ddr_cap),
                                               kernel_config=KernelConfig(compute_device="cpu"))
    try:  # a setting the planner refuses (a --plan-dir that is a file) is refused on every rank alike
        planner = ShardflowPlanner(topology=topology, batch_size=args.batch_size, constraints=constraints,
                                   plan_dir=args.plan_dir)
        plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    except InputError as e:  # the same message on every rank, at once
        print(f"rank {rank}: {e}", file=sys.stderr, flush=True)
        barrier(device)  # every rank says it before one exits: torchrun stops the others at the first exit
        dist.destroy_process_group()
        os._exit(2)
    if args.out:
        shardings = {path: {name: [p.sharding_type, p.compute_kernel, p.ranks] for name, p in module_plan.items()}
                     for path, module_plan in plan.plan.items()}
        Path(args.out, f"plan-{rank}.json").write_text(json.dumps(shardings, sort_keys=True))

    model = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.Adagrad(params, lr=0.01))
    pipeline = TrainPipelineSparseDist(model, CombinedOptimizer([model.fused_optimizer, dense]), device)
    batches: Any = target_function(f"{OWN_MODEL}:batches")
    data = batches(rank, world, args.batch_size, device)
    for i in range(args.iterations):
        loss, _ = pipeline.progress(data)
        if rank == 0:
            print(f"iteration {i + 1}: loss {loss.item():.4f}", flush=True)
    barrier(device)
    dist.destroy_process_group()


def barrier(device: torch.device) -> None:
    # NCCL's barrier runs on this rank's GPU (and on cuda, torch.cuda.set_device(LOCAL_RANK) comes first)
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index or 0])
    else:
        dist.barrier()


if __name__ == "__main__":
    main()
    # As examples/train_own_model.py: leave without interpreter finalization (gloo's release race).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
