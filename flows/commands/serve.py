"""``shardflow serve``: serve the deployments of deploy/prefect.yaml (plan, pipeline and the cron
replan-on-schema-change) from this process, with Prefect's ``serve``.

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
    p.add_argument("--list", action="store_true", help="print the deployments and their schedules; serve nothing")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from flows.deployments import PREFECT_FILE, runner_deployments

    deployments = runner_deployments(args.prefect_file or PREFECT_FILE)
    if args.list:
        for d in deployments:
            crons = ", ".join(f"cron {s.schedule.cron!r}" for s in d.schedules or []
                              if getattr(s.schedule, "cron", None))
            print(f"{d.flow_name}/{d.name}  {d.entrypoint}  {d.parameters}  {crons or 'on demand'}")
        return 0

    from prefect import serve

    from flows.local_server import prefect_api

    with prefect_api(args.port):
        serve(*deployments, limit=args.limit)
    return 0
