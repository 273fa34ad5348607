"""``shardflow outbox list|retry``: the MLflow records kept on local disk, and sending them again.

Every record goes through the outbox (STATE_DIR/outbox) before MLflow takes it; it stays there
while its store is unavailable, and a record that MLflow does not take three times while the store
works is set aside (STATE_DIR/outbox/set-aside). ``list`` shows what waits and what is set aside,
with the last reason; ``retry`` returns set-aside records (those named, or all) to the queue and
delivers everything waiting now, each record to the store it was meant for. Exit 0 when nothing is
left waiting, 1 when something still waits.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rec.exit_codes import ExitCode
from rec.settings import add_flags


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``outbox list`` and ``outbox retry``."""
    from tasks.tracking import TrackingSettings

    parser = subparsers.add_parser("outbox", help="list or retry the MLflow records kept on local disk",
                                   description=__doc__)
    commands = parser.add_subparsers(title="outbox commands", metavar="COMMAND", required=True)
    listing = commands.add_parser("list", help="records waiting for MLflow and records set aside, with why")
    add_flags(listing, TrackingSettings, skip=("track", "tracking_uri", "experiment"))
    listing.set_defaults(handler=run_list)
    retry = commands.add_parser("retry", help="return set-aside records to the queue and deliver all now")
    retry.add_argument("entries", metavar="ENTRY", nargs="*",
                       help="set-aside records to retry, by entry name or record key (as `list` and the "
                            "warning print them); none: every set-aside record")
    add_flags(retry, TrackingSettings, skip=("track",))
    retry.set_defaults(handler=run_retry)


def run_list(args: argparse.Namespace) -> int:
    from rec.errors import InputError, Problem, printable
    from rec.settings import from_flags
    from rec.text_table import render_table
    from tasks.outbox import Outbox
    from tasks.tracking import TrackingSettings

    # Listing reads only the state folder: MLflow's settings in the environment are not its business.
    settings = from_flags(TrackingSettings, args, track=False)
    tracking = settings.resolve()
    state = Path(settings.state_dir)
    if state.exists() and not state.is_dir():  # not "nothing waits"
        raise InputError("Cannot list the outbox:", [Problem(f"--state-dir {settings.state_dir}", (
            "is a file, not a folder: name shardflow's state folder"))])
    entries = Outbox(tracking.outbox_dir).describe()
    if not entries:
        print(f"nothing waits in {tracking.outbox_dir}")
        return ExitCode.OK
    # Every cell escaped: whoever can write the outbox chose these names, URIs and reasons.
    rows = [(printable(e.name), "set aside" if e.set_aside else "waiting", printable(e.what),
             printable(e.destination.uri) if e.destination else "-" if e.problem else "(the next delivery's)",
             printable(e.destination.experiment) if e.destination else "-",
             str(e.attempts), printable(e.problem or e.last_error or "-", 120)) for e in entries]
    print(render_table(("entry", "state", "record", "for", "experiment", "attempts", "last error"), rows,
                       right=("attempts",)))
    return ExitCode.OK


def run_retry(args: argparse.Namespace) -> int:
    from rec.settings import from_flags
    from tasks.outbox import Outbox, kept_message
    from tasks.tracking import Tracking, TrackingSettings

    tracking = from_flags(TrackingSettings, args).resolve()
    outbox = Outbox(tracking.outbox_dir)
    returned = outbox.retry(args.entries)
    if returned:
        print(f"returned {len(returned)} set-aside record(s) to the queue")
    delivery = outbox.deliver(tracking)
    print(f"delivered {len(delivery.run_ids)} record(s) to MLflow")
    for uri, waiting in delivery.waiting.items():
        print(kept_message(Tracking(uri, tracking.experiment, tracking.outbox_dir), waiting,
                           delivery.errors.get(uri)))
    return ExitCode.FAILED if delivery.pending else ExitCode.OK
