"""``shardflow run SPEC --topology TOPO``: the whole pipeline — plan, then train with the plan.

Embedded defaults: Prefect's ephemeral API (``PREFECT_API_URL`` for a server), a local Ray only
with ``--backend ray|auto`` (``RAY_ADDRESS`` for a cluster), MLflow in ./mlflow.db with artifacts
in ./mlruns (``MLFLOW_TRACKING_URI`` for a server). Output goes to OUT/plan and OUT/train.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.pipeline import PipelineOutcome
    from tasks.tracking import Tracking


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="plan, then train with the plan (Prefect pipeline, MLflow runs)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", metavar="SPEC", help="table spec: .parquet .arrow .feather .csv .yaml .json")
    p.add_argument("--topology", metavar="TOPO", required=True, help="topology YAML")
    p.add_argument("--backend", choices=("local", "ray", "auto"), default="local")
    p.add_argument("--groups", type=int, default=None, help="table groups for the Ray backend")
    p.add_argument("--train-iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10, help="iterations left out of the latency statistics")
    p.add_argument("--batch-size", type=int, default=None, help="per rank (default: the topology's)")
    p.add_argument("--nproc-per-node", type=int, default=None)
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts before Prefect retries")
    p.add_argument("--train-retries", type=int, default=2, help="Prefect retries of a failed training")
    p.add_argument("--out", default="out", metavar="DIR", help="OUT/plan and OUT/train (default: out)")
    add_tracking_arguments(p)
    p.set_defaults(handler=run)


def add_tracking_arguments(p: argparse.ArgumentParser) -> None:
    """Where runs go; shared by the commands that talk to MLflow."""
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    p.add_argument("--experiment", default="shardflow", help="MLflow experiment (default: shardflow)")
    p.add_argument("--state-dir", default=".shardflow",
                   help="outbox and plan cache (default: .shardflow)")


def run(args: argparse.Namespace) -> int:
    from rec.spec import read_spec
    from rec.topology import read_topology

    # Bad input exits 2 here, before Prefect starts.
    read_spec(args.spec)
    read_topology(args.topology)

    import os

    # The embedded Prefect server's telemetry cannot reach the internet from closed networks and
    # would print an ERROR line; a user's own setting wins.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.logs import input_errors_without_traceback
    from flows.pipeline import pipeline_flow
    from tasks.tracking import tracking_for
    from tasks.training import TrainingFailed

    try:
        with input_errors_without_traceback():
            outcome = pipeline_flow(
                args.spec, args.topology, backend=args.backend, groups=args.groups,
                train_iterations=args.train_iterations, warmup=args.warmup, batch_size=args.batch_size,
                nproc_per_node=args.nproc_per_node, max_restarts=args.max_restarts,
                train_retries=args.train_retries, out_dir=args.out, tracking_uri=args.tracking_uri,
                experiment=args.experiment, state_dir=args.state_dir)
    except TrainingFailed as e:
        print(f"shardflow run: training failed after {args.train_retries + 1} attempts; the plan is in "
              f"{args.out}/plan and in MLflow.\n{e}", file=sys.stderr)
        return 1
    print(render_outcome(outcome, tracking_for(args.tracking_uri, args.experiment, args.state_dir)))
    return 0


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
