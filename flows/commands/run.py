"""``shardflow run SPEC --topology TOPO``: the whole pipeline — plan, then train with the plan.

Embedded defaults: Prefect's ephemeral API (``PREFECT_API_URL`` for a server), a local Ray only
with ``--backend ray|auto`` (``RAY_ADDRESS`` for a cluster), MLflow in ./mlflow.db with artifacts
in ./mlruns (``MLFLOW_TRACKING_URI`` for a server). Output goes to OUT/plan and OUT/train.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from flows.commands.plan import add_input_arguments
from rec.settings import add_flags

if TYPE_CHECKING:
    from flows.pipeline import PipelineOutcome
    from flows.plan import PlanOutcome
    from tasks.tracking import Tracking

TRAIN_FLAGS = {"iterations": "train-iterations"}  # flag names kept from shardflow's first CLI
TRAIN_WHERE = {"iterations": "--train-iterations"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from flows.parameters import TRAIN_RETRIES
    from rec.train.config import TrainConfig
    from tasks.paths import DEFAULT_OUT
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings
    from tasks.train import TrainSettings
    from tasks.write import WriteSettings

    p = subparsers.add_parser("run", help="plan, then train with the plan (Prefect pipeline, MLflow runs)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(p)
    p.add_argument("--plan-only", action="store_true",
                   help="run the plan flow: ingest, search, write and log the plan; no training")
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"write DIR/plan and DIR/train, DIR locked for the run (default: a new "
                        f"{DEFAULT_OUT}/<plan_id>/train-<time> per run, {DEFAULT_OUT}/latest the newest)")
    add_flags(p.add_argument_group("search"), SearchSettings)
    add_flags(p.add_argument_group("artifact"), WriteSettings)
    add_flags(p.add_argument_group("training job"), TrainConfig, rename=TRAIN_FLAGS,
              aliases={"iterations": ("iterations",)})
    add_flags(p.add_argument_group("processes"), TrainSettings, skip=("job", "node_rank"))
    p.add_argument("--train-retries", type=int, default=TRAIN_RETRIES,
                   help=f"Prefect retries of a failed training (default: {TRAIN_RETRIES})")
    add_flags(p.add_argument_group("tracking"), TrackingSettings)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rec.settings import check, from_flags, to_dict
    from tasks.ingest import ingest
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings
    from tasks.train import TrainingFailed, TrainSettings
    from tasks.write import WriteSettings

    searching, training = from_flags(SearchSettings, args), from_flags(TrainSettings, args)
    tracking = from_flags(TrackingSettings, args)
    # Bad input exits 2 here, before Prefect starts.
    check(searching, "Cannot plan with these settings:")
    if not args.plan_only:
        check(training, "Cannot train with these settings:", where=TRAIN_WHERE)
    if args.train_retries < 0:
        from rec.errors import InputError, Problem

        raise InputError("Cannot run:", [Problem("--train-retries", "must be at least 0")])
    ingest(args.spec, args.topology)

    from flows.logs import input_errors_without_traceback, quiet_prefect_defaults
    from flows.parameters import search_parameters, train_parameters

    quiet_prefect_defaults()
    common = {**search_parameters(searching), "chart": from_flags(WriteSettings, args).chart,
              "out_dir": args.out, **to_dict(tracking)}
    with input_errors_without_traceback():
        if args.plan_only:
            from flows.plan import plan_flow

            outcome = plan_flow(args.spec, args.topology, **common)
            print(render_plan_outcome(outcome, tracking.resolve()))
            return 0
        from flows.pipeline import pipeline_flow

        params = {k: v for k, v in train_parameters(training).items() if k != "node_rank"}
        try:
            outcome = pipeline_flow(args.spec, args.topology, **common, **params,
                                    train_retries=args.train_retries)
        except TrainingFailed as e:
            print(f"shardflow run: training failed after {args.train_retries + 1} attempts; the plan is "
                  f"written and in MLflow.\n{e}", file=sys.stderr)
            return 1
    print(render_outcome(outcome, tracking.resolve()))
    return 0


def render_plan_outcome(o: PlanOutcome, tracking: Tracking) -> str:
    how = "from the cache, not searched again" if o.cached else "searched"
    lines = [f"plan      {o.plan_path}  (plan_id {o.plan_id}, {how})"]
    if o.logged.pending:
        lines.append(f"MLflow    unreachable at {tracking.uri}: {o.logged.pending} record(s) wait in "
                     f"{tracking.outbox_dir}")
    else:
        lines.append(f"MLflow    plan run {o.logged.run_id} in experiment {tracking.experiment!r}")
    return "\n".join(lines)


def render_outcome(o: PipelineOutcome, tracking: Tracking) -> str:
    """Where to look: the plan, the training metrics, the MLflow runs and how to browse them."""
    from pathlib import Path

    from tasks.tracking import resolve_uri, sqlite_path

    m = o.trained.metrics
    lat = m["iteration_latency_ms"]
    how = "from the cache, not searched again" if o.cached else "searched"
    plan_dir = Path(o.plan_path).parent
    lines = [
        f"plan      {o.plan_path}  (plan_id {o.plan_id}, {how}); chart {plan_dir / 'rank_load.png'}",
        f"training  {Path(o.trained.out_dir) / 'train_metrics.json'}: p50 {lat['p50']:.2f} ms, "
        f"p90 {lat['p90']:.2f} ms, {m['samples_per_s']:,.0f} samples/s on {m['world_size']} ranks"
        + (f" ({o.trained.attempts} attempts)" if o.trained.attempts > 1 else ""),
    ]
    if o.pipeline_run.pending:
        lines.append(f"MLflow    unreachable at {tracking.uri}: {o.pipeline_run.pending} record(s) wait in "
                     f"{tracking.outbox_dir}; the next shardflow flow that reaches MLflow logs them")
        return "\n".join(lines)
    lines.append(f"MLflow    pipeline run {o.pipeline_run.run_id} (plan run {o.plan_run.run_id}, train run "
                 f"{o.train_run.run_id}) in experiment {tracking.experiment!r}")
    db = sqlite_path(tracking.uri)
    if db is not None:
        try:
            shown = f"sqlite:///{db.relative_to(Path.cwd())}"
        except ValueError:
            shown = tracking.uri
        lines.append(f"browse    mlflow ui --backend-store-uri {shown}")
    else:
        lines.append(f"browse    {tracking.uri}")
    default = tracking.uri == resolve_uri(None) and tracking.experiment == "shardflow"
    lines.append("compare   shardflow compare" + ("" if default else
                                                  f" --tracking-uri {tracking.uri} --experiment {tracking.experiment}"))
    return "\n".join(lines)
