"""``shardflow replan SPEC --topology TOPO``: replan only if the spec changed since it was last planned.

Runs the Prefect ``replan`` flow once (the ``replan-on-schema-change`` deployment runs it on a
schedule): it hashes the spec and compares the hash with the newest successful planning of the
same spec file on the same topology in MLflow (a plan of ``shardflow plan``, ``run`` or an
earlier replan, under whatever profile: a replan follows the schema, and a new profile is planned
with ``shardflow plan --profile``). Unchanged: nothing is recorded in MLflow (the check is the
Prefect flow run).
Changed, or never planned: a new plan is searched from the last one, written to OUT/plan and
logged; what it moved is printed as ``shardflow plan --previous`` prints it.
"""

from __future__ import annotations

import argparse
import sys

from flows.commands.plan import add_input_arguments
from rec.exit_codes import ExitCode
from rec.settings import add_flags


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tasks.paths import DEFAULT_OUT
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings
    from tasks.write import WriteSettings

    p = subparsers.add_parser("replan", help="replan a spec if it changed since its last plan (Prefect flow)",
                              description=__doc__)
    add_input_arguments(p)
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"a new plan goes to DIR/plan (default: {DEFAULT_OUT}/<plan_id>/plan)")
    add_flags(p.add_argument_group("search"), SearchSettings)
    add_flags(p.add_argument_group("artifact"), WriteSettings)
    add_flags(p.add_argument_group("tracking"), TrackingSettings, skip=("track",))
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import contextlib

    from flows.ephemeral_api import PrefectApiUnavailable, ephemeral_api
    from flows.logs import input_errors_without_traceback
    from flows.progress import on_terminal
    from flows.start import Ingested
    from rec.errors import InputError
    from rec.settings import check, from_flags
    from tasks.ingest import ingest
    from tasks.outbox import kept_message
    from tasks.paths import unmakeable
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings
    from tasks.write import WriteSettings

    searching = from_flags(SearchSettings, args)
    check(searching, "Cannot plan with these settings:")
    tracking = from_flags(TrackingSettings, args)  # a name that cannot be used exits 2 here
    resolved = tracking.resolve()  # what the environment gives MLflow in the flags' place: checked before the work
    problems = unmakeable(args.out, "--out") + unmakeable(tracking.state_dir, "--state-dir")
    if problems:
        raise InputError("Cannot replan:", problems)
    inputs = ingest(args.spec, args.topology)  # bad input exits 2 here, before Prefect
    from flows.replan import replan_flow

    try:
        with on_terminal(), input_errors_without_traceback(), contextlib.ExitStack() as prefect:
            prefect.enter_context(ephemeral_api(meanwhile=resolved.client_modules))
            # The flow takes the inputs read here: read, validated and hashed once.
            outcome = replan_flow(args.spec, args.topology, searching=searching,
                                  chart=from_flags(WriteSettings, args).chart, out_dir=args.out,
                                  tracking=tracking, ingested=Ingested(inputs))
    except PrefectApiUnavailable as e:  # did not start, or failed the flow
        print(f"shardflow replan: {e}", file=sys.stderr)
        return ExitCode.FAILED
    print(outcome.summary())
    if outcome.plan_path:
        from flows.reports import render_movement
        from rec.plan import read_plan

        print(render_movement(read_plan(outcome.plan_path)), end="")
    if outcome.pending:
        print(kept_message(resolved, outcome.pending, outcome.tracking_error))
    return ExitCode.OK
