"""``shardflow plan SPEC --topology TOPO --out DIR``: search a sharding plan and write it.

The same three steps as the Prefect ``plan`` flow (ingest, search, write: plan.json,
shards.parquet, rank_load.png), without Prefect or MLflow (whose imports would take seconds):
the plan run is queued in the outbox (``--no-track``: the files only) and the next command that
records delivers it (``shardflow outbox retry`` at once), ``shardflow replan`` before it compares;
once delivered, replan and ``compare`` find it as they find the flows' plans (``compare``, which
only reads, says how many records still wait). ``shardflow run --plan-only`` runs the steps as the flow, with the
plan cache. Prints the per-rank table (the critical rank marked; a summary beyond 32 ranks), the
plan's quality, the topology's defaults in use and the wall time of each step. ``shardflow show
DIR`` tells which tables sit where.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rec.config.planner_identity import Planner
from rec.errors import Problem
from rec.exit_codes import ExitCode
from rec.settings import add_flags, knob

if TYPE_CHECKING:
    from rec.plan import Plan
    from tasks.tracking import Tracking


@dataclass(frozen=True)
class PlannerChoice:
    """Who plans: shardflow's search, or TorchRec's own planner for comparison."""

    planner: Planner = field(default=Planner.SHARDFLOW, metadata=knob(
        "who plans: shardflow's search; torchrec: TorchRec's EmbeddingShardingPlanner with its default proposers; "
        "torchrec-dp: with its DynamicProgrammingProposer (cuda only). TorchRec's plan is written as a shardflow "
        "plan, rated by shardflow's cost model"))

    def conflicts(self, args: argparse.Namespace) -> list[Problem]:
        """What TorchRec's planner cannot do: replan from a previous plan, search on Ray."""
        if self.planner is Planner.SHARDFLOW:
            return []
        out = []
        if args.previous or args.previous_plan_id:
            out.append(Problem("--previous", f"--planner {self.planner.value} plans from scratch; replan with "
                                             "--planner shardflow"))
        if args.backend != "local":
            out.append(Problem("--backend", f"--planner {self.planner.value} runs TorchRec's planner in this "
                                            "process; leave --backend local"))
        return out


@dataclass(frozen=True)
class ReportSettings:
    """How much of a plan the CLI prints."""

    all_ranks: bool = field(default=False, metadata=knob(
        "a row for every rank, also beyond 32 ranks (where the table otherwise shows min, median and max "
        "of each column and the busiest ranks)"))


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings
    from tasks.write import WriteSettings

    parser = subparsers.add_parser("plan", help="search a sharding plan and write plan.json",
                                   description=__doc__)
    add_input_arguments(parser)
    parser.add_argument("--out", metavar="DIR", required=True,
                        help="where plan.json, shards.parquet and rank_load.png go")
    search = parser.add_argument_group("search")
    add_flags(search, PlannerChoice)
    add_flags(search, SearchSettings)
    add_previous_arguments(parser)
    add_flags(parser.add_argument_group("artifact"), WriteSettings)
    add_flags(parser.add_argument_group("tracking"), TrackingSettings)
    add_flags(parser.add_argument_group("report"), ReportSettings)
    parser.set_defaults(handler=run)


def add_previous_arguments(parser: argparse.ArgumentParser) -> None:
    """--previous / --previous-plan-id: replan from a plan, moving as little of it as --max-regress allows
    (a plan id is looked up where the tracking flags say)."""
    group = parser.add_argument_group("replan from a previous plan (moves as little as --max-regress allows)")
    source = group.add_mutually_exclusive_group()
    source.add_argument("--previous", metavar="PLAN", help="the previous plan.json (or its directory)")
    source.add_argument("--previous-plan-id", metavar="ID",
                        help="the previous plan by its plan_id, from MLflow (or the outbox)")


def previous_plan(args: argparse.Namespace) -> Plan | None:
    """The plan ``--previous`` or ``--previous-plan-id`` names, checked; None without either."""
    import tempfile

    from rec.analysis import check_plan
    from rec.plan import read_plan
    from rec.settings import from_flags
    from tasks.plan_fetch import fetch_plan
    from tasks.tracking import TrackingSettings

    if args.previous:
        plan = read_plan(args.previous)
    elif args.previous_plan_id:
        tracking = from_flags(TrackingSettings, args).resolve()
        with tempfile.TemporaryDirectory(prefix="shardflow-previous-") as tmp:
            plan = read_plan(fetch_plan(tracking, args.previous_plan_id, tmp))
    else:
        return None
    check_plan(plan, source=f"the previous plan {plan.plan_id}")
    return plan


def render_queued(where: Tracking) -> str:
    """The plan run, queued in the outbox for MLflow (``tasks.recorder.queue_plan``), as one line."""
    return (f"mlflow:        plan run queued for experiment {where.experiment!r} at {where.uri}: the next command "
            f"that records (train, run, replan, outbox retry) delivers it")


SPEC_FILES = ".parquet .pq .arrow .feather .ipc .csv .yaml .yml .json"  # rec.spec.read.FORMATS (tests)


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """SPEC and --topology, for every command that plans."""
    parser.add_argument("spec", metavar="SPEC", help=f"table spec: {SPEC_FILES}")
    parser.add_argument("--topology", metavar="TOPO", required=True, help="topology YAML")


def check_out_free(out: str) -> None:
    """InputError where ``out`` is, or is the plan folder of, the ``--out`` a run holds (``run --out O``
    plans into ``O/plan`` and trains that plan): its ranks would refuse the plan changed under them."""
    from rec.errors import InputError, Problem
    from tasks.run_dirs import run_in

    for directory in (Path(out), Path(out).parent):
        holder = run_in(directory)
        if holder:
            raise InputError(f"Cannot plan into {out}:", [Problem(out, (
                f"{directory} is in use by another shardflow run (locked by {holder}), which trains the plan "
                "there; wait for it to finish, or plan into another --out"))])


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from flows.progress import on_terminal
    from flows.reports import render_made_by, render_plan, render_topology_line
    from rec.errors import Collected, InputError
    from rec.plan.io import DISK_FULL_ERRNOS
    from rec.profile import describe_profile
    from rec.settings import check, from_flags
    from tasks.ingest import ingest
    from tasks.paths import unmakeable
    from tasks.search import SearchSettings, search_plan, torchrec_search, with_profile
    from tasks.step_progress import ingesting, searching, writing
    from tasks.tracking import TrackingSettings
    from tasks.write import WriteSettings, write_plan_artifact

    started = time.perf_counter()
    tracking = from_flags(TrackingSettings, args)  # a name that cannot be used exits 2 here
    bad = Collected()  # the settings', the profile's, the spec's and the topology's problems: all at once
    search_settings = from_flags(SearchSettings, args)
    search_settings = bad.run(lambda: with_profile(search_settings)) or search_settings
    bad.run(lambda: check(search_settings, "Cannot plan with these settings:"))
    choice = from_flags(PlannerChoice, args)
    if choice.conflicts(args):
        bad.errors.append(InputError("Cannot plan with these settings:", choice.conflicts(args)))
    bad.run(lambda: check_out_free(args.out))
    folders = unmakeable(args.out, "--out") + (unmakeable(tracking.state_dir, "--state-dir") if tracking.track else [])
    if folders:  # the plan would be searched and shown, then not written, or not queued (--no-track skips that)
        bad.errors.append(InputError("Cannot write there:", folders))
    # MLflow's variables in the environment, checked before the search, as a flag's value is: not after
    # the plan is written
    where = bad.run(tracking.resolve) if tracking.track else None
    with on_terminal() as shown:
        with ingesting(args.spec):
            read = bad.run(lambda: ingest(args.spec, args.topology))
        bad.raise_if_any()
        assert read is not None
        inputs = read
        previous = previous_plan(args)
        with searching(inputs, search_settings):
            if choice.planner is Planner.SHARDFLOW:
                found = search_plan(inputs, search_settings, previous=previous)
            else:
                found = torchrec_search(inputs, search_settings.cost, choice.planner)
        try:
            with writing(args.out):
                written = write_plan_artifact(found.plan, args.out, from_flags(WriteSettings, args))
        except OSError as e:
            if e.errno not in DISK_FULL_ERRNOS:
                raise
            print(f"shardflow plan: cannot write {e.filename or args.out}: {e.strerror}; nothing in {args.out} "
                  "was replaced", file=sys.stderr)
            return ExitCode.FAILED
    print(render_plan(found.plan, from_flags(ReportSettings, args).all_ranks))
    print(render_made_by(found.plan), end="")
    print(render_topology_line(inputs.topology, args.topology, found.plan.planner.profile))
    if args.profile:
        print(f"profile:       {describe_profile(search_settings.cost.profile)}")
    if where is not None:
        from tasks.recorder import queue_plan

        lost = queue_plan(where, found.plan, written.plan_path, inputs, found.seconds)
        if lost:  # MLflow trouble never fails the work: the plan is written
            from tasks.outbox import kept_message

            print(kept_message(where, 0, None, lost))
        else:
            print(render_queued(where))
    print(f"time:          {shown.summary(time.perf_counter() - started)}")
    print(f"\nwrote {', '.join(written.files)}")
    return ExitCode.OK
