"""``shardflow replan SPEC --topology TOPO``: replan only if the spec changed since it was last planned.

Runs the Prefect ``replan`` flow once (the ``replan-on-schema-change`` deployment runs it on a
schedule): it hashes the spec and compares the hash with the newest successful planning of the
same spec file on the same topology in MLflow. Unchanged: a small MLflow run records the check.
Changed, or never planned: a new plan is searched, written to OUT/plan and logged.
"""

from __future__ import annotations

import argparse

from flows.commands.plan import add_input_arguments
from rec.settings import add_flags


def add_parser(subparsers: argparse._SubParsersAction) -> None:
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
    from flows.logs import input_errors_without_traceback
    from flows.parameters import search_parameters
    from flows.progress import on_terminal
    from rec.settings import check, from_flags
    from tasks.ingest import ingest
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings
    from tasks.write import WriteSettings

    searching = from_flags(SearchSettings, args)
    check(searching, "Cannot plan with these settings:")
    ingest(args.spec, args.topology)  # bad input exits 2 here, before Prefect starts
    from flows.replan import replan_flow

    with on_terminal(), input_errors_without_traceback():
        outcome = replan_flow(args.spec, args.topology, **search_parameters(searching),
                              chart=from_flags(WriteSettings, args).chart, out_dir=args.out,
                              **from_flags(TrackingSettings, args).flow_parameters())
    if outcome.outcome == "unchanged":
        print(f"unchanged: spec hash {outcome.spec_hash} was last planned as plan {outcome.plan_id}; "
              "nothing replanned")
    else:
        before = f" (was {outcome.previous_spec_hash})" if outcome.previous_spec_hash else " (first plan)"
        print(f"replanned: spec hash {outcome.spec_hash}{before} -> plan {outcome.plan_id} in "
              f"{outcome.plan_path}")
    return 0
