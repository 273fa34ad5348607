"""``shardflow train --plan DIR/plan.json``: run the TorchRec job on a plan; it never plans.

torchrun starts one process per rank (gloo on cpu, NCCL on cuda); for several nodes run the same
command on each with ``--node-rank`` and a shared ``--rdzv-endpoint``. ``--plan-id ID`` fetches the
plan from its MLflow plan run instead (or from the outbox while MLflow is away) into OUT/plan.
Before any process starts, the plan and this machine are checked (sound, unedited, for this many
processes, the device and backend it needs, the data): a problem exits 2 in seconds.

The run is recorded in MLflow (node 0; ``--no-track`` to keep only the files), a failed one as a
FAILED run with its cause and the ranks' logs. Each rank logs to OUT/logs/rank-<RANK>.log.
SIGTERM, SIGINT or SIGHUP stop torchrun and every rank before the command exits (128 + the
signal); the ranks die with the command even when it is killed.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rec.exit_codes import ExitCode
from rec.settings import add_flags

if TYPE_CHECKING:
    from rec.plan import Plan
    from tasks.recorder import Logged
    from tasks.tracking import TrackingSettings
    from tasks.train import Trained, TrainSettings


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from rec.train.config import TrainConfig
    from tasks.tracking import TrackingSettings
    from tasks.train import TrainSettings

    p = subparsers.add_parser("train", help="train with a plan (torchrun; never re-plans)",
                              description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", metavar="PLAN", help="plan.json or its directory")
    source.add_argument("--plan-id", metavar="ID", help="the plan of this plan_id, from MLflow")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="train_metrics.json, iterations.parquet and logs/ go here, DIR locked for the run "
                        "(default: a new out/<plan_id>/train-<time>, out/latest the newest)")
    add_flags(p.add_argument_group("training job"), TrainConfig)
    add_flags(p.add_argument_group("processes"), TrainSettings, skip=("job",))
    add_flags(p.add_argument_group("tracking"), TrackingSettings)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import os
    import shutil
    import sys
    import time

    from flows.commands.launch_faults import launch_faults
    from flows.progress import on_terminal
    from rec.errors import InputError
    from rec.plan import read_plan
    from rec.settings import from_flags
    from tasks.records import now_ms
    from tasks.run_dirs import RunDirs
    from tasks.tracking import TrackingSettings
    from tasks.train import TrainingFailed, TrainSettings, check_settings, listed, train

    started, started_ms = time.perf_counter(), now_ms()
    settings = from_flags(TrainSettings, args)
    check_settings(settings, args.plan)
    tracking = from_flags(TrackingSettings, args)
    resolved = tracking.resolve()  # what the environment gives MLflow in the flags' place: checked before the work
    records_run = tracking.track and settings.node_rank == 0
    dirs = RunDirs.of(args.out)
    out = args.out
    with launch_faults("shardflow train", lambda: out or ".", lambda: newest_checkpoint(settings, out)) as fault, \
            on_terminal() as shown, dirs.locked(settings.node_rank, settings.nnodes):
        if args.plan_id:
            plan_id = args.plan_id
            out = dirs.train_dir(plan_id, nested=False)
            fresh = not os.path.lexists(out)  # a new out/<plan_id>/train-<time>: nothing else in it
        else:
            plan_id = read_plan(args.plan).plan_id
            out = dirs.train_dir(plan_id, nested=False)
            fresh = False
        try:
            if args.plan_id:
                args.plan = fetch_plan_by_id(args, out)
            trained = train(args.plan, out, settings)
        except InputError:  # refused before launch: the plan fetched for it is not kept
            if fresh:
                shutil.rmtree(out, ignore_errors=True)
            raise
        except TrainingFailed as e:
            print(f"shardflow train: the training failed: {e.cause}{listed(e.problems)}\n  logs: {e.logs}",
                  file=sys.stderr)
            if records_run:
                from tasks.recorder import record_failed_training

                failed = record_failed_training(resolved, plan_id, settings, out, e, e.attempt,
                                                started_ms, plan_path=args.plan)
                print(render_logged(failed, tracking, "FAILED train run"), file=sys.stderr)
            return ExitCode.of_failure(e.deterministic)
        dirs.mark_latest(out)
        logged: Logged | None = None
        if records_run:
            from tasks.recorder import record_training

            logged = record_training(resolved, trained)
    if fault.code is not None:
        return fault.code
    print(render_trained(trained, read_plan(args.plan)))
    if logged is not None:
        print(render_logged(logged, tracking, "train run"))
    print(f"time      {shown.summary(time.perf_counter() - started)}")
    return ExitCode.OK


def newest_checkpoint(settings: TrainSettings, out: str | None) -> str:
    """``; newest complete checkpoint: DIR`` (--resume continues from it), or nothing."""
    from rec.train.ownership import own_checkpoint

    step = own_checkpoint(settings.job, out) if out else None  # another run's is not where this one stopped
    return f"; newest complete checkpoint: {step} (--resume continues from it)" if step else ""


def render_trained(trained: Trained, plan: Plan | None = None) -> str:
    """Measured latency and loss; the plan's predicted iteration time beside the measured one (as
    ``plan`` and ``measure`` print it); where a resume came from and what it restored."""
    from pathlib import Path

    from flows.reports import checkpoint_lines, data_lines, predicted_line, resumed_lines
    from rec.train.metrics import ITERATIONS_FILE, METRICS_FILE
    from rec.train.rank_log import LOG_DIR

    out = Path(trained.out_dir)
    if not trained.metrics:  # another node's share: rank 0 reports
        return (f"training  done on node {trained.settings.node_rank}; --node-rank 0 reports the metrics "
                f"(logs in {out / LOG_DIR})")
    m = trained.metrics
    lat = m.iteration_latency_ms
    lines = [f"training  plan {m.plan_id} on {m.world_size} ranks: iteration latency p50 {lat.p50:.2f} ms, "
             f"p90 {lat.p90:.2f} ms, {m.samples_per_s:,.0f} samples/s; loss {m.loss.first:.4f} -> {m.loss.last:.4f}"]
    if plan is not None:
        lines.append(predicted_line(plan, m))
    lines += resumed_lines(trained)
    lines += data_lines(m)
    lines.append(f"wrote     {out / METRICS_FILE}, {out / ITERATIONS_FILE} (logs in {out / LOG_DIR})")
    lines += checkpoint_lines(trained)
    return "\n".join(lines)


def render_logged(logged: Logged, tracking: TrackingSettings, what: str) -> str:
    resolved = tracking.resolve()
    if logged.run_id is None:
        from tasks.outbox import kept_message

        return kept_message(resolved, logged.pending, logged.error, logged.lost)
    return f"MLflow    {what} {logged.run_id} in experiment {resolved.experiment!r}"


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
