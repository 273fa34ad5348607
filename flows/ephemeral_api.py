"""Prefect's ephemeral API, which ``shardflow run`` and ``shardflow replan`` use when no
``PREFECT_API_URL`` is set: started before the flow, with a startup budget a busy machine survives.

Prefect starts it on first use and gives up after ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``
(Prefect's default: 20 s) with a traceback. The first start also creates Prefect's database in
PREFECT_HOME, which on one busy core can take longer than that, failing the README's first command.
shardflow starts the same server itself, waiting as long as that same setting says, or
``STARTUP_TIMEOUT_S`` when the user did not set it, and reports a start that fails in one line.

The server is the one Prefect's ``SubprocessASGIServer`` runs (uvicorn serving
``prefect.server.api.server:create_app`` on 127.0.0.1, the UI off: ``flows.ephemeral_server``),
started from here because that class lives in the server's own module: importing it costs this
process the whole server (seconds of CPU) for nothing, as the server runs in its own process. The
flows reach it as ``PREFECT_API_URL`` for the duration of ``ephemeral_api()``, so Prefect's client
never loads it.

Unless ``-v``, the server's output goes to a file in the temporary directory (``SERVER_LOG``), not
PREFECT_HOME, which may be the disk that is full: a server that exits before it answers is reported
by its exit code, its last error ("database or disk is full") and that file, which is kept; else it
is removed when the server stops, unless the flows failed with an exception while it holds output.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from rec import progress, startup_gc
from rec.errors import InputError, Problem, printable
from rec.train.lifetime import parent_death_signal

# Prefect warns of a PREFECT_HOME it cannot make as it is imported; the local API's start names it
# itself, in one line (prefect_home_problems), and a server elsewhere needs none.
warnings.filterwarnings("ignore", message="Failed to create the Prefect home directory", category=UserWarning)

STARTUP_TIMEOUT_S = 120
PORTS = range(8000, 9000)  # Prefect's own range for its ephemeral server
PORT_IN_USE = 3  # uvicorn's exit code when the port was taken between the check and its bind
RELAUNCHES = 3  # ... and when the app failed to start (a broken database): relaunched this often at most
STOP_WAIT_S = 5.0
POLL_S = 0.1
# No telemetry from a server this command starts for itself (offline, it filled the output with its failures).
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
              "PREFECT_SERVER_ANALYTICS_ENABLED": "0"}
SERVER_LOG = ("shardflow-prefect-server-", ".log")  # in the temporary directory: its prefix and suffix
LOG_TAIL_BYTES = 64 * 1024  # of the server's output, read for its last error
# The last line of a Python traceback: "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database
# or disk is full" gives "database or disk is full".
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): (?:\([\w.]+\) )?(?:\[Errno \d+\] )?(?P<why>\S.*)$")


class PrefectApiUnavailable(RuntimeError):
    """Prefect's ephemeral API did not start; the message is one line saying why and what to do."""


def startup_budget_s() -> int:
    """``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` as the user set it (environment or
    Prefect profile), else ``STARTUP_TIMEOUT_S``."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    try:
        with temporary_settings(set_defaults={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: STARTUP_TIMEOUT_S}):
            budget = int(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    except ValueError as e:  # pydantic's ValidationError: not a number
        budget, why = None, printable(str(e).strip().splitlines()[-1])
    else:
        why = f"got {budget}"
    if budget is None or budget < 1:
        raise InputError("Cannot start Prefect's local API:", [Problem(
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", f"needs a number of seconds, at least 1; {why}")])
    return budget


@contextlib.contextmanager
def ephemeral_api(meanwhile: Sequence[str] = ()) -> Iterator[None]:
    """Prefect's ephemeral API for the flows run inside, unless ``PREFECT_API_URL`` names a server;
    stopped on leaving (or at exit). ``PrefectApiUnavailable`` if it does not answer within
    ``startup_budget_s``, or exits first. ``meanwhile``: modules the flows will need, imported
    while the server starts (on another core, its start and these imports overlap)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.local_server import NO_SERVER, api_problem, api_url_source

    configured = PREFECT_API_URL.value()
    if configured:
        why = api_problem(configured)
        if why is not None:  # else each flow fails with Prefect's tracebacks
            source, unset = api_url_source()
            advice = ": start it, or" if why == NO_SERVER else "; or"
            raise InputError("Cannot start the flow:", [Problem(f"PREFECT_API_URL={configured}{source}", (
                f"{why}{advice} {unset} (shardflow then starts one)"))])
        _import(meanwhile)
        yield
        return
    budget = startup_budget_s()
    problems = prefect_home_problems()
    if problems:
        raise InputError("Cannot start Prefect's local API:", problems)
    server = _Server()
    server.launch()
    try:
        _import(meanwhile)
        with progress.step("prefect", "starting Prefect's local API"):
            server.wait(budget)
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield
    except PrefectApiUnavailable:
        raise
    except Exception as e:
        failed = _server_error(e)
        if failed:  # its server failed the flow (a full disk under PREFECT_HOME): one line, not Prefect's
            why = server.last_error(exceptions_only=True)
            raise PrefectApiUnavailable(f"Prefect's local API failed: {failed}{f': {why}' if why else ''}"
                                        f"{server.see_log()}") from None
        if server.log_holds_output():  # what the server said of the failure (a 500 names only itself)
            server.keep_log = True
            e.add_note(f"Prefect's local API's output: {server.log}")
        raise
    finally:
        server.stop()


def prefect_home_problems() -> list[Problem]:
    """PREFECT_HOME (``~/.prefect`` without it), where the local API keeps its database, where it
    cannot be made or written: its server exited with code 3, "unable to open database file"."""
    from prefect.settings import PREFECT_HOME

    from tasks.paths import unmakeable

    home = str(PREFECT_HOME.value())
    if os.environ.get("PREFECT_HOME"):
        where = "PREFECT_HOME"
    elif Path(home) == Path.home() / ".prefect":
        where = f"PREFECT_HOME (unset: {home}, under HOME)"
    else:
        where = f"PREFECT_HOME={home} (from Prefect's settings)"
    return [Problem(where, f"{p.reason}: set PREFECT_HOME to a folder this user can write")
            for p in unmakeable(home, "PREFECT_HOME")]


def _server_error(e: BaseException) -> str | None:
    """``500 Internal Server Error on set_state`` where ``e`` is Prefect's client's error for an answer of
    its server's failing (5xx); None for anything else."""
    from prefect.exceptions import PrefectHTTPStatusError

    response = getattr(e, "response", None)
    if not isinstance(e, PrefectHTTPStatusError) or response is None or response.status_code < 500:
        return None
    return f"{response.status_code} {response.reason_phrase} on {response.request.url.path.rsplit('/', 1)[-1]}"


def _import(modules: Sequence[str]) -> None:
    """Import ``modules`` with the collector held (``rec.startup_gc``): the flows' modules and
    MLflow's client make objects this process keeps: collecting through them adds ~0.4 CPU-s to
    their ~3.5."""
    with startup_gc.importing():
        for module in modules:
            importlib.import_module(module)


class _Server:
    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.launched = 0.0  # time.monotonic() of the first launch
        self.log: Path | None = None  # its output, every launch's (None: on the terminal, with -v)
        self.keep_log = False  # named in a message: not removed when the server stops

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self) -> None:
        from tasks.launch import verbose

        self.launched = time.monotonic()
        if not verbose():
            try:
                fd, name = tempfile.mkstemp(prefix=SERVER_LOG[0], suffix=SERVER_LOG[1])
            except OSError:  # no temporary directory to write: its output on the terminal, as with -v
                pass
            else:
                os.close(fd)
                self.log = Path(name)
        self._launch()
        atexit.register(self.stop)

    def wait(self, budget_s: float) -> None:
        """Until the server answers; PrefectApiUnavailable if it exits first or ``budget_s``
        runs out, counted from the launch as Prefect counts its own startup timeout (whatever this
        process did meanwhile)."""
        from flows.local_server import answers

        deadline = self.launched + budget_s
        relaunches = 0
        while True:  # asked at least once: it may have started while this process was busy
            assert self.process is not None
            code = self.process.poll()
            if code == PORT_IN_USE and relaunches < RELAUNCHES and self._port_may_be_taken():
                relaunches += 1
                self._launch()
                continue
            if code is not None:  # a longer budget would not help: no advice to allow it longer
                why = self.last_error()
                raise PrefectApiUnavailable(f"Prefect's local API did not start: its server exited with code {code} "
                                            f"before it answered{f': {why}' if why else ''}{self.see_log()}")
            if answers(self.api_url):
                return
            if time.monotonic() >= deadline:
                raise _unavailable(f"it did not answer within {budget_s:g} s{self.see_log()}")
            time.sleep(POLL_S)

    def _port_may_be_taken(self) -> bool:
        """Whether its exit code 3 may be the port's (taken since it was chosen), not the app's: its
        output says so, or there is none to tell (a read-only HOME was relaunched 3 times, 840 lines)."""
        tail = self._tail()
        return not tail or "address already in use" in tail.lower()

    def log_holds_output(self) -> bool:
        try:
            return self.log is not None and self.log.stat().st_size > 0
        except OSError:
            return False

    def see_log(self) -> str:
        """Where its output is, for a message (kept then), if it holds any."""
        if not self.log_holds_output():
            return ""
        self.keep_log = True
        return f" (its output: {self.log})"

    def last_error(self, exceptions_only: bool = False) -> str:
        """The message of the last exception in its output (else its last line, unless
        ``exceptions_only``), in one line."""
        lines = [line.strip() for line in self._tail().splitlines() if line.strip()]
        errors = [m["why"] for m in map(_EXCEPTION_LINE.match, lines) if m]
        return printable(errors[-1] if errors else lines[-1] if lines and not exceptions_only else "", 200)

    def _tail(self) -> str:
        """The last ``LOG_TAIL_BYTES`` of its output ("": none, or none to read)."""
        if self.log is None:
            return ""
        try:
            with open(self.log, "rb") as output:
                output.seek(max(0, output.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                return output.read().decode(errors="replace")
        except OSError:
            return ""

    def _launch(self) -> None:
        import prefect
        from prefect.settings import get_current_settings

        self.port = _free_port()
        env = {**os.environ, **SERVER_ENV, **get_current_settings().to_environment_variables(exclude_unset=True)}
        app_dir = str(Path(prefect.__file__).parent.parent)
        with open(self.log or os.devnull, "ab") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "flows.ephemeral_server", "--app-dir", app_dir,
                 "--factory", "prefect.server.api.server:create_app",
                 "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "error", "--lifespan", "on"],
                # Its own session: Ctrl-C at the terminal stops this command, which then stops the server
                # after the flow's last states are sent; it dies with this command all the same.
                env=env, stdin=subprocess.DEVNULL, stdout=None if self.log is None else output,
                stderr=None if self.log is None else subprocess.STDOUT, start_new_session=True,
                preexec_fn=parent_death_signal())

    def stop(self) -> None:
        from flows.local_server import stop_server

        process, self.process = self.process, None
        if process is not None:
            stop_server(process, STOP_WAIT_S)
        if self.log is not None and not self.keep_log:
            self.log.unlink(missing_ok=True)


def _unavailable(why: str) -> PrefectApiUnavailable:
    return PrefectApiUnavailable(
        f"Prefect's local API did not start: {why}; allow it longer with "
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=SECONDS, or set PREFECT_API_URL to a running "
        "Prefect server")


def _free_port() -> int:
    """A port in Prefect's range that nothing on 127.0.0.1 holds now (uvicorn may still lose it to a
    race: ``PORT_IN_USE``, then another)."""
    for _ in range(50):
        port = random.choice(PORTS)
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise PrefectApiUnavailable("Prefect's local API did not start: no free port from 8000 to 8999 on 127.0.0.1; "
                                "set PREFECT_API_URL to a running Prefect server")
