"""``shardflow run SPEC --topology TOPO``: the whole pipeline — plan, then train with the plan.

Embedded defaults: Prefect's ephemeral API (``PREFECT_API_URL`` for a server; its start may take
``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``, 120 s unless set), a local Ray only
with ``--backend ray|auto`` (``RAY_ADDRESS`` for a cluster), MLflow in ./mlflow.db with artifacts
in ./mlruns (``MLFLOW_TRACKING_URI`` for a server). Output goes to a new out/<plan_id>/train-<time>
per run (out/latest the newest), or to OUT/plan and OUT/train with ``--out OUT``.

Everything that would fail for certain (bad input, settings, a machine without what the plan
needs) exits 2 before Prefect starts; a training that fails anyway is recorded as a FAILED MLflow
run with its cause, shown once here.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from flows.commands.plan import add_input_arguments
from rec.exit_codes import ExitCode
from rec.settings import add_flags

if TYPE_CHECKING:
    from flows.pipeline import PipelineOutcome
    from flows.plan import PlanOutcome
    from tasks.launch import Stopped
    from tasks.tracking import Tracking
    from tasks.train import TrainingFailed, TrainSettings


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from rec.train.config import TrainConfig
    from tasks.paths import DEFAULT_OUT
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings
    from tasks.train import TRAIN_RETRIES, TrainSettings
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
    add_flags(p.add_argument_group("training job"), TrainConfig,
              aliases={"iterations": ("train-iterations",)})  # the flag's name in shardflow's first CLI
    add_flags(p.add_argument_group("processes"), TrainSettings, skip=("job", "node_rank"))
    p.add_argument("--train-retries", type=int, default=TRAIN_RETRIES, metavar="N",
                   help=f"Prefect retries of a failed training that may pass on retry (default: {TRAIN_RETRIES})")
    add_flags(p.add_argument_group("tracking"), TrackingSettings, skip=("track",))
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import contextlib
    import time

    from flows.ephemeral_api import PrefectApiUnavailable, ephemeral_api
    from flows.logs import input_errors_without_traceback
    from flows.progress import on_terminal
    from flows.start import Ingested
    from rec.errors import InputError, Problem
    from rec.exit_codes import stopped_by
    from rec.settings import from_flags, settings_problems
    from tasks.ingest import ingest
    from tasks.launch import Stopped
    from tasks.paths import unmakeable
    from tasks.search import SearchSettings
    from tasks.step_progress import ingesting
    from tasks.tracking import TrackingSettings
    from tasks.train import TrainingFailed, TrainSettings, preflight
    from tasks.write import WriteSettings

    started = time.perf_counter()
    searching, training = from_flags(SearchSettings, args), from_flags(TrainSettings, args)
    tracking = from_flags(TrackingSettings, args)
    resolved = tracking.resolve()  # what the environment gives MLflow in the flags' place: checked before the work
    # What would fail for certain exits 2 here, in seconds, before Prefect starts.
    problems = settings_problems(searching) + ([] if args.plan_only else settings_problems(training))
    problems += unmakeable(args.out, "--out") + unmakeable(tracking.state_dir, "--state-dir")
    if args.train_retries < 0:
        problems.append(Problem("--train-retries", "must be at least 0"))
    if problems:
        raise InputError("Cannot run:", problems)
    with on_terminal() as shown:
        with ingesting(args.spec):
            inputs = ingest(args.spec, args.topology)
        if not args.plan_only:
            preflight(training, inputs.topology, inputs.spec)

        # The flow takes the inputs read and checked here: read, validated and hashed once.
        common = {"searching": searching, "chart": from_flags(WriteSettings, args).chart, "out_dir": args.out,
                  "tracking": tracking, "ingested": Ingested(inputs)}
        try:
            with input_errors_without_traceback(), contextlib.ExitStack() as prefect:
                flow = "flows.plan" if args.plan_only else "flows.pipeline"
                prefect.enter_context(ephemeral_api(meanwhile=(flow, *resolved.client_modules)))
                if args.plan_only:
                    from flows.plan import plan_flow

                    plan_outcome = plan_flow(args.spec, args.topology, **common)
                else:
                    from flows.pipeline import pipeline_flow

                    try:
                        outcome = pipeline_flow(args.spec, args.topology, **common, training=training,
                                                train_retries=args.train_retries)
                    except TrainingFailed as e:
                        print(render_failure(e, resolved), file=sys.stderr)
                        return ExitCode.of_failure(e.deterministic)
                    except Stopped as e:
                        print(render_stopped(e, training, args.out, time.perf_counter() - started), file=sys.stderr)
                        return stopped_by(e.signum)
        except PrefectApiUnavailable as e:  # did not start, or failed the flows
            print(f"shardflow run: {e}", file=sys.stderr)
            return ExitCode.FAILED
    total = time.perf_counter() - started
    if args.plan_only:
        print(render_plan_outcome(plan_outcome, resolved))
    else:
        print(render_outcome(outcome, resolved))
    print(f"time      {shown.summary(total, other='Prefect and start-up')}")
    return ExitCode.OK


def render_stopped(e: Stopped, training: TrainSettings, out: str | None, seconds: float) -> str:
    """One line for a training stopped as asked (Ctrl-C, SIGTERM): that nothing runs on, and where
    the same command goes on from (its newest checkpoint) or that it has none to go on from."""
    from rec.train.ownership import own_checkpoint
    from rec.train.resume import checkpoint_dir

    line = f"shardflow run: stopped by {e.name} after {seconds:.0f} s: torchrun and every rank have exited"
    step = own_checkpoint(training.job, e.out_dir) if e.out_dir else None
    if e.out_dir is None or step is None:
        return f"{line}; no checkpoint to resume from (--checkpoint-every N writes them)"
    again = "--resume" if out else f"--checkpoint-dir {checkpoint_dir(training.job, e.out_dir)} --resume"
    return f"{line}; newest checkpoint {step}: the same command with {again} goes on from it"


def render_failure(e: TrainingFailed, tracking: Tracking) -> str:
    from tasks.train import listed

    retried = "" if e.deterministic else f" after {e.attempt} attempt{'s' if e.attempt > 1 else ''}"
    return (f"shardflow run: the training failed{retried}: {e.cause}{listed(e.problems)}\n"
            f"  logs:   {e.logs}\n"
            f"  MLflow: a FAILED train run with this cause (shardflow.error) and the logs, in experiment "
            f"{tracking.experiment!r} at {tracking.uri}; the plan is written and logged")


def render_plan_outcome(o: PlanOutcome, tracking: Tracking) -> str:
    lines = [o.summary()]
    if o.logged.unrecorded:
        from tasks.outbox import kept_message

        lines.append(kept_message(tracking, o.logged.pending, o.logged.error, o.logged.lost))
    else:
        lines.append(f"MLflow    plan run {o.logged.run_id} in experiment {tracking.experiment!r}")
    return "\n".join(lines + hints(tracking, o.plan_path))


def render_outcome(o: PipelineOutcome, tracking: Tracking) -> str:
    """Where to look: the plan, the training metrics, the MLflow runs and how to browse them."""
    lines = o.summary().splitlines()
    if o.pipeline_run.run_id is None:
        from tasks.outbox import kept_message

        lines.append(kept_message(tracking, o.pipeline_run.pending, o.pipeline_run.error, o.pipeline_run.lost))
    else:
        lines.append(f"MLflow    pipeline run {o.pipeline_run.run_id} (plan run {o.plan_run.run_id}, train run "
                     f"{o.train_run.run_id}) in experiment {tracking.experiment!r}")
    return "\n".join(lines + hints(tracking, o.plan_path))


def hints(tracking: Tracking, plan_path: str) -> list[str]:
    """Commands to look further, as they work when typed from here (shell-quoted; ``--flag=VALUE``,
    so that a value starting with '-' is no flag)."""
    from pathlib import Path
    from shlex import quote

    from flows.reports import command, shell_path
    from tasks.tracking import DEFAULT_EXPERIMENT, resolve_uri, sqlite_path, sqlite_uri

    out = [f"show      {command('shardflow')} show {shell_path(Path(plan_path).parent)}"]
    default = tracking.uri == resolve_uri(None) and tracking.experiment == DEFAULT_EXPERIMENT

    def where(uri: str) -> str:
        return "" if default else f" --tracking-uri={quote(uri)} --experiment={quote(tracking.experiment)}"

    db = sqlite_path(tracking.uri)
    if db is not None:
        try:
            shown = sqlite_uri(db.relative_to(Path.cwd()))
        except ValueError:
            shown = tracking.uri
        out.append(f"browse    {command('shardflow')} ui{where(shown)}")
    else:
        out.append(f"browse    {tracking.uri}")
    out.append(f"compare   {command('shardflow')} compare{where(tracking.uri)}")
    return out
