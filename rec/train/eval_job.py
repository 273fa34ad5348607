"""The evaluation job, one process per rank under torchrun: a checkpoint's model, sharded with the
plan it was trained with, evaluated on data (``shardflow eval``).

    torchrun --nproc-per-node 2 -m rec.train.eval_job --plan CKPT/plan.json --out OUT \\
        --checkpoint CKPT/step_00000100 --eval-data eval.parquet [the training job's model flags]

Each rank loads its shards of the checkpoint and runs forward over its share of the data, as the
training's own evaluations do (``rec.train.evaluate``); rank 0 writes OUT/eval_metrics.json.
Logs and failures as the training job's (``rec.train.rank_log``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from rec.data.columns import CHECKPOINT_EVALUATION
from rec.disk_full import write_whole
from rec.plan import Plan, read_plan
from rec.settings import add_flags, from_flags
from rec.train import checkpoint
from rec.train.agreement import check_agreement, shared_settings
from rec.train.config import TrainConfig
from rec.train.job import evaluator_of, model_and_feed, shard_with_plan
from rec.train.lifetime import exit_skipping_finalization
from rec.train.rank_log import RankOutput
from rec.train.rank_process import check_world_size, process_group, run_rank
from rec.train.resume import step_of
from rec.units import counted

EVAL_METRICS_FILE = "eval_metrics.json"


def evaluate_checkpoint(plan: Plan, config: TrainConfig, step: Path, out_dir: str, output: RankOutput) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world_size(plan, world)
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if plan.topology.compute_device == "cuda"
              else torch.device("cpu"))
    batch_size = config.batch_size or plan.topology.batch_size
    output.progress("building the model")
    model, feed = model_and_feed(plan, plan.spec, config, device, world, batch_size)
    evaluator = evaluator_of(config, feed, batch_size, device, "--data", CHECKPOINT_EVALUATION)  # shardflow eval's
    assert evaluator is not None, "the evaluation job needs --eval-data"
    output.progress(f"sharding {len(plan.tables):,} tables on {counted(world, 'rank')} with the plan")
    dmp, optimizer = shard_with_plan(model, plan, config, device)
    number = step_of(step.name)
    assert number is not None
    output.progress(f"loading the checkpoint of iteration {number}")
    checkpoint.load(step.parent, number, dmp, optimizer)
    output.progress("evaluating")
    result = evaluator.run(dmp, number)
    if rank == 0 and result is not None:
        record = {"plan_id": plan.plan_id, "checkpoint": str(step), "step": number, "world_size": world,
                  "batch_size": batch_size, "data": config.eval_data,
                  "eval": {k: v for k, v in result.to_dict().items() if k != "iteration"}}
        write_whole(Path(out_dir) / EVAL_METRICS_FILE, json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rec.train.eval_job", description=__doc__)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", required=True, help="the checkpoint's step directory")
    add_flags(p, TrainConfig)
    args = p.parse_args(argv)
    config = from_flags(TrainConfig, args)

    def work(output: RankOutput) -> None:
        output.progress("loading the plan")
        plan = read_plan(args.plan)
        with process_group(plan.topology.compute_device, config.collective_timeout) as group:
            check_agreement(group, {**shared_settings(plan, config), "--checkpoint": os.path.abspath(args.checkpoint)})
            evaluate_checkpoint(plan, config, Path(args.checkpoint), args.out, output)

    return run_rank("eval", args.out, work)


if __name__ == "__main__":
    exit_skipping_finalization(main())
