"""``shardflow train --plan DIR/plan.json --nproc-per-node M``: run the TorchRec job on a plan.

The job loads the plan and never plans. torchrun starts one process per rank (gloo on cpu, NCCL
on cuda); for several nodes run the same command on each with ``--node-rank`` and a shared
``--rdzv-endpoint``. ``--plan-id ID`` fetches the plan from its MLflow plan run instead (or from
the outbox while MLflow is away) into OUT/plan.
"""

from __future__ import annotations

import argparse

from flows.commands.run import add_tracking_arguments


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train with a plan (torchrun; never re-plans)",
                              description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", metavar="PLAN", help="plan.json or its directory")
    source.add_argument("--plan-id", metavar="ID", help="the plan of this plan_id, from MLflow")
    p.add_argument("--out", default="out/train", metavar="DIR",
                   help="train_metrics.json, iterations.parquet and logs go here")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes on this node (default: the plan's local_world_size)")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="torchrun restarts after a rank dies; training resumes from the last checkpoint")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=None, help="per rank (default: the plan's)")
    p.add_argument("--pipeline", choices=("sparse_dist", "naive"), default="sparse_dist")
    p.add_argument("--model", choices=("auto", "dlrm", "dlrm_dcn", "concat"), default="auto")
    p.add_argument("--data", default=None, help="Parquet training data (default: synthetic)")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="default: DIR/checkpoints when checkpointing")
    p.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    add_tracking_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rec.plan import read_plan
    from tasks.launch import job_flags, plan_launch, run_training

    if args.plan_id:
        args.plan = fetch_plan_by_id(args)
    plan = read_plan(args.plan)
    plan_path = str(Path(args.plan) / "plan.json" if Path(args.plan).is_dir() else Path(args.plan))
    checkpoint_dir = args.checkpoint_dir or (
        str(Path(args.out) / "checkpoints") if args.checkpoint_every or args.resume else None)
    flags = job_flags(args.iterations, args.warmup, args.pipeline, args.model, args.batch_size,
                      args.data, checkpoint_dir, args.checkpoint_every, args.resume)
    launch = plan_launch(plan, plan_path, args.out, flags, args.nproc_per_node, args.nnodes,
                         args.node_rank, args.rdzv_endpoint, args.max_restarts)
    code = run_training(launch)
    if code != 0:
        print(f"shardflow train: the training job failed (torchrun exit {code})")
        return code
    metrics_file = Path(args.out) / "train_metrics.json"
    if metrics_file.exists():
        m = json.loads(metrics_file.read_text())
        lat = m["iteration_latency_ms"]
        print(f"plan {m['plan_id']} on {m['world_size']} ranks: iteration latency p50 "
              f"{lat['p50']:.2f} ms, p90 {lat['p90']:.2f} ms, {m['samples_per_s']:,.0f} samples/s")
        print(f"wrote {metrics_file} and {Path(args.out) / 'iterations.parquet'}")
    return 0


def fetch_plan_by_id(args: argparse.Namespace) -> str:
    """OUT/plan/plan.json of ``--plan-id``; InputError if MLflow (and the outbox) lack it."""
    import os
    from pathlib import Path

    from rec.errors import InputError, Problem
    from rec.plan import read_plan
    from tasks.plan_fetch import fetch_plan
    from tasks.tracking import tracking_for

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # two small files
    tracking = tracking_for(args.tracking_uri, args.experiment, args.state_dir)
    path = fetch_plan(tracking, args.plan_id, Path(args.out) / "plan")
    fetched = read_plan(path).plan_id
    if fetched != args.plan_id:
        raise InputError("MLflow returned another plan:", [Problem(path, f"plan_id {fetched}")])
    print(f"fetched plan {args.plan_id} into {path}")
    return path
