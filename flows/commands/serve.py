"""``shardflow serve``: serve the deployments of deploy/prefect.yaml (plan, pipeline and the cron
replan-on-schema-change) from this process, with Prefect's ``serve``.

``--set KEY=VALUE`` overrides a parameter of every deployment whose flow has it (e.g. where MLflow
and the outputs go); ``--replan-every SECONDS`` replans on that interval instead of the cron, for
tests and demos.

Schedules need a Prefect server: Prefect's ephemeral API has no scheduler. With
``PREFECT_API_URL`` set, that server is used; otherwise a local one is started (``prefect server
start`` on 127.0.0.1, its database in ~/.prefect) and stopped on exit.
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve the Prefect deployments of deploy/prefect.yaml",
                              description=__doc__)
    p.add_argument("--prefect-file", default=None, metavar="YAML",
                   help="deployments to serve (default: deploy/prefect.yaml)")
    p.add_argument("--port", type=int, default=4200, help="port of the local Prefect server, if one is started")
    p.add_argument("--limit", type=int, default=None, help="most flow runs at once")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter of every deployment whose flow has it; VALUE is YAML "
                        "(e.g. --set tracking_uri=sqlite:///runs.db --set train_iterations=5); repeatable")
    p.add_argument("--replan-every", type=float, default=None, metavar="SECONDS",
                   help="replan on this interval instead of the replan deployment's cron (tests, demos)")
    p.add_argument("--list", action="store_true", help="print the deployments and their schedules; serve nothing")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from flows.deployments import PREFECT_FILE, describe_schedules, parse_overrides, runner_deployments

    deployments = runner_deployments(args.prefect_file or PREFECT_FILE,
                                     overrides=parse_overrides(args.overrides),
                                     replan_every=args.replan_every)
    if args.list:
        for d in deployments:
            print(f"{d.flow_name}/{d.name}  {d.entrypoint}  {d.parameters}  {describe_schedules(d)}")
        return 0

    from prefect import serve

    from flows.local_server import prefect_api

    with prefect_api(args.port):
        serve(*deployments, limit=args.limit)
    return 0
