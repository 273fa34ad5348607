"""``shardflow ui``: MLflow's web UI for the project's store, on 127.0.0.1 only.

Starts ``mlflow ui`` with one worker and no background job runner for the store the other commands
use (``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else mlflow.db in the working directory) and
prints the address of the experiment's runs table. A store that does not exist, or is not MLflow's,
is refused as ``compare`` refuses it: this command never creates or migrates one. Ctrl-C stops the
UI (exit code 0).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile

from rec.exit_codes import ExitCode
from rec.settings import add_flags
from rec.train.lifetime import parent_death_signal

HOST = "127.0.0.1"  # never another interface: the UI can delete runs
DEFAULT_PORT = 5000
STOP_WAIT_S = 5.0  # a UI that has not stopped by then is killed

def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("ui", help="MLflow's web UI for the project's runs, on 127.0.0.1",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})")
    from tasks.tracking import TrackingSettings

    add_flags(p, TrackingSettings, skip=("track", "state_dir"))
    p.set_defaults(handler=run)


def runs_url(port: int, experiment_id: str | None) -> str:
    """The runs table of the experiment (MLflow's home page without one)."""
    base = f"http://{HOST}:{port}/"
    return f"{base}#/experiments/{experiment_id}" if experiment_id is not None else base


def ui_command(uri: str, port: int) -> list[str]:
    """``mlflow ui`` for the store ``uri`` on HOST:``port``, one worker."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", HOST, "--port", str(port),
            "--workers", "1"]


def run(args: argparse.Namespace) -> int:
    from rec.errors import InputError
    from rec.settings import from_flags
    from tasks.launch import verbose
    from tasks.tracking import TrackingSettings, TrackingUnavailable
    from tasks.tracking.store import open_read_only

    if not 0 < args.port < 65536:
        raise InputError(f"Cannot start the MLflow UI: --port must be 1 to 65535, got {args.port}")
    # Ctrl-C stops it even where it was started with SIGINT ignored (a disposition children inherit).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tracking = from_flags(TrackingSettings, args).resolve()
    try:  # read only: the store must exist and be MLflow's
        _, experiment_id = open_read_only(tracking)
    except TrackingUnavailable as e:
        raise InputError(f"Cannot read MLflow at {tracking.uri}: {e}") from None
    taken = port_taken(args.port)
    if taken:
        raise InputError(f"Cannot start the MLflow UI: port {args.port} on {HOST} {taken}; choose another --port")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner processes
    with tempfile.TemporaryFile("w+") as log:
        quiet = not verbose()
        # A session of its own (the terminal's Ctrl-C reaches this command, which stops it), yet it
        # dies with this command when that is killed outright.
        server = subprocess.Popen(ui_command(tracking.uri, args.port), env=env, start_new_session=True,
                                  preexec_fn=parent_death_signal(),
                                  stdout=log if quiet else None, stderr=subprocess.STDOUT if quiet else None)
        url = runs_url(args.port, experiment_id)
        if experiment_id is None:
            print(f"MLflow UI at {url} (experiment {tracking.experiment!r} does not exist yet); Ctrl-C stops it",
                  flush=True)
        else:
            print(f"MLflow UI: runs of {tracking.experiment!r} at {url}; Ctrl-C stops it", flush=True)
        try:
            code = server.wait()
        except KeyboardInterrupt:
            stop(server)
            print("shardflow: MLflow UI stopped", file=sys.stderr)
            return ExitCode.OK
        log.seek(0)
        lines = [line.strip() for line in log.read().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]  # the cause, not the shutdown lines after it
    why = (errors or lines)[-1] if lines else f"exit code {code}"
    print(f"shardflow: the MLflow UI ended: {why}", file=sys.stderr)
    return ExitCode.FAILED


def port_taken(port: int) -> str | None:
    """Why the UI's server could not listen on HOST:``port`` (another process does: "is in use"), or
    None. Checked as the server binds (SO_REUSEADDR: a closed connection's port is free), before the
    address is printed for a server that would end at once."""
    import errno
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as e:
            return "is in use" if e.errno == errno.EADDRINUSE else f"cannot be listened on ({e.strerror or e})"
    return None


def stop(server: subprocess.Popen[bytes]) -> None:
    """The UI and its worker (its own process group), SIGTERM then, after ``STOP_WAIT_S``, SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
