"""``shardflow train --plan DIR/plan.json``: run the TorchRec job on a plan; it never plans.

torchrun starts one process per rank (gloo on cpu, NCCL on cuda); for several nodes run the same
command on each with ``--node-rank`` and a shared ``--rdzv-endpoint``. ``--plan-id ID`` fetches the
plan from its MLflow plan run instead (or from the outbox while MLflow is away) into OUT/plan.
The plan is checked (sound, unedited, for this many processes) before any process starts.
"""

from __future__ import annotations

import argparse

from rec.settings import add_flags


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from rec.train.config import TrainConfig
    from tasks.tracking import TrackingSettings
    from tasks.train import TrainSettings

    p = subparsers.add_parser("train", help="train with a plan (torchrun; never re-plans)",
                              description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", metavar="PLAN", help="plan.json or its directory")
    source.add_argument("--plan-id", metavar="ID", help="the plan of this plan_id, from MLflow")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="train_metrics.json, iterations.parquet and logs go here, DIR locked for the run "
                        "(default: a new out/<plan_id>/train-<time>, out/latest the newest)")
    add_flags(p.add_argument_group("training job"), TrainConfig)
    add_flags(p.add_argument_group("processes"), TrainSettings, skip=("job",))
    add_flags(p.add_argument_group("tracking (for --plan-id)"), TrackingSettings)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rec.plan import read_plan
    from rec.settings import from_flags
    from tasks.run_dirs import RunDirs
    from tasks.train import TrainingFailed, TrainSettings, train

    settings = from_flags(TrainSettings, args)
    dirs = RunDirs.of(args.out)
    with dirs.locked(settings.node_rank):
        if args.plan_id:
            out = dirs.train_dir(args.plan_id, nested=False)
            args.plan = fetch_plan_by_id(args, out)
        else:
            out = dirs.train_dir(read_plan(args.plan).plan_id, nested=False)
        try:
            train(args.plan, out, settings)
        except TrainingFailed as e:
            print(f"shardflow train: the training job failed: {str(e).splitlines()[0]}")
            return 1
        dirs.mark_latest(out)
    metrics_file = Path(out) / "train_metrics.json"
    if metrics_file.exists():
        m = json.loads(metrics_file.read_text())
        lat = m["iteration_latency_ms"]
        print(f"plan {m['plan_id']} on {m['world_size']} ranks: iteration latency p50 "
              f"{lat['p50']:.2f} ms, p90 {lat['p90']:.2f} ms, {m['samples_per_s']:,.0f} samples/s")
        print(f"wrote {metrics_file} and {Path(out) / 'iterations.parquet'}")
    return 0


def fetch_plan_by_id(args: argparse.Namespace, out: str) -> str:
    """OUT/plan/plan.json of ``--plan-id``; InputError if MLflow (and the outbox) lack it."""
    import os
    from pathlib import Path

    from rec.errors import InputError, Problem
    from rec.plan import read_plan
    from rec.settings import from_flags
    from tasks.paths import PLAN_SUBDIR
    from tasks.plan_fetch import fetch_plan
    from tasks.tracking import TrackingSettings

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # two small files
    tracking = from_flags(TrackingSettings, args).resolve()
    path = fetch_plan(tracking, args.plan_id, Path(out) / PLAN_SUBDIR)
    fetched = read_plan(path).plan_id
    if fetched != args.plan_id:
        raise InputError("MLflow returned another plan:", [Problem(path, f"plan_id {fetched}")])
    print(f"fetched plan {args.plan_id} into {path}")
    return path
