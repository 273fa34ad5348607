"""``shardflow serve``: serve the deployments of deploy/prefect.yaml (plan, pipeline and the cron
replan-on-schema-change) from this process, with Prefect's ``serve``.

``--set KEY=VALUE`` overrides a parameter of every deployment whose flow has it (e.g. where MLflow
and the outputs go); ``--replan-every SECONDS`` replans on that interval instead of the cron, for
tests and demos.

Relative paths in the deployment file are relative to its directory; those given with ``--set``,
to the working directory.

Schedules need a Prefect server: Prefect's ephemeral API has no scheduler. With
``PREFECT_API_URL`` set, that server is used; otherwise a local one is started (``prefect server
start`` on 127.0.0.1, its database and its output, shardflow-server.log, in ~/.prefect) and
stopped when serving stops (Ctrl-C, SIGTERM or SIGHUP: exit code 0). Serving stops, with exit code
1 and one line saying why, when the local server ends or a server answers no health check for two
of the runner's polls (20 s by default): without its server no schedule fires and no flow run can
report (and Prefect's runner gives up polling after three failed polls).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from types import FrameType
from typing import NoReturn

from rec.exit_codes import ExitCode


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("serve", help="serve the Prefect deployments of deploy/prefect.yaml",
                              description=__doc__)
    p.add_argument("--prefect-file", default=None, metavar="YAML",
                   help="deployments to serve (default: deploy/prefect.yaml)")
    p.add_argument("--port", type=int, default=4200, help="port of the local Prefect server, if one is started")
    p.add_argument("--limit", type=int, default=None, help="most flow runs at once")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter of every deployment whose flow has it, or with a dotted KEY one "
                        "setting of a settings parameter; VALUE is YAML (e.g. --set "
                        "tracking.tracking_uri=sqlite:///runs.db --set training.job.iterations=50); repeatable")
    p.add_argument("--replan-every", type=float, default=None, metavar="SECONDS",
                   help="replan on this interval instead of the replan deployment's cron (tests, demos)")
    p.add_argument("--list", action="store_true", help="print the deployments and their schedules; serve nothing")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from flows.deployments import PREFECT_FILE, describe_schedules, parse_overrides, runner_deployments
    from rec.errors import Collected, ProblemList, all_of

    found = Collected()  # the flags', the overrides' and the deployment file's problems: all at once

    def check_flags() -> None:
        problems = ProblemList()
        if not 1 <= args.port <= 65535:
            problems.add("--port", f"must be from 1 to 65535, got {args.port}")
        if args.limit is not None and args.limit < 1:
            problems.add("--limit", f"must be at least 1 (flow runs at once), got {args.limit}")
        problems.raise_if_any("Cannot serve with these settings:")

    found.run(check_flags)
    overrides = found.run(lambda: parse_overrides(args.overrides))
    deployments = found.run(lambda: runner_deployments(args.prefect_file or PREFECT_FILE, overrides=overrides,
                                                       replan_every=args.replan_every))
    if found.errors:
        raise all_of(found.errors, "Cannot serve the deployments:")
    assert deployments is not None
    if args.list:
        for d in deployments:
            print(f"{d.flow_name}/{d.name}  {d.entrypoint}  {d.parameters}  {describe_schedules(d)}")
        return ExitCode.OK

    from prefect import serve

    from flows.local_server import prefect_api, watched

    # Prefect's runner sets its own SIGTERM handler once it runs
    previous = {stop: signal.signal(stop, as_ctrl_c) for stop in (signal.SIGHUP, signal.SIGTERM)}
    try:
        with prefect_api(args.port) as api, watched(api, on_lost=stop_serving):
            serve(*deployments, limit=args.limit)
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
    return ExitCode.OK


def as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """A closed terminal, or SIGTERM while the server starts, stops serving as Ctrl-C does (once
    serving, Prefect's runner stops itself on SIGTERM)."""
    signal.raise_signal(signal.SIGINT)


def stop_serving(why: str) -> NoReturn:
    """The server is gone: say so in one line, end the flow runs in progress and exit now. Without
    its server Prefect's runner only logs failing calls (and no longer stops on SIGINT or SIGTERM);
    a flow run can neither finish its state nor stop cleanly, so it is killed."""
    import psutil

    print(f"shardflow: {why}; serving stopped", file=sys.stderr, flush=True)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, sys.stdout.fileno())
    os.dup2(quiet, sys.stderr.fileno())
    for process in psutil.Process().children(recursive=True):
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    os._exit(ExitCode.FAILED)
