"""The Prefect server of ``shardflow serve``: a local one when none is configured (schedules need
its scheduler, which Prefect's ephemeral API does not run), and a watch on whichever it uses.

The local server binds 127.0.0.1 and runs in its own session, so a Ctrl-C at the terminal reaches
serve alone, which stops its runner first and the server after it; should serve itself be killed,
the kernel stops the server too (a parent-death signal). Unless ``--verbose``, the server's output
goes to PREFECT_HOME/shardflow-server.log (under load its SQLite database logs "database is
locked" tracebacks, and retries), and serve shows none of Prefect's records of failed calls to a
lost server (the watch says it in one line) or of the tasks it cancels when serving stops. Its flow
runs inherit its quiet settings, yet no CLI prints their lines: shardflow's own INFO lines (a
replan's outcome, step progress) go to their Prefect run logs and serve's output, Prefect's own
INFO lines (every task's state) do not.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rec.errors import InputError, Problem
from rec.train.lifetime import parent_death_signal

STARTUP_TIMEOUT_S = 120
WATCH_EVERY_S = 2.0  # health checks; the exit of a local server is seen at once
HEALTH_TIMEOUT_S = 10.0
# A server that answers no health check for this many of the runner's polls is lost: Prefect's
# runner stops polling for good after three failed polls in a row, and no schedule fires after it.
UNANSWERED_POLLS = 2
STOP_TIMEOUT_S = 10.0
LOGGING_SETTINGS = "shardflow-serve-logging.yml"  # in PREFECT_HOME, for the flow runs of serve
SERVER_LOG = "shardflow-server.log"  # in PREFECT_HOME, beside the server's database
SETTINGS_ENV = "PREFECT_LOGGING_SETTINGS_PATH"
NO_SERVER = "no Prefect server answers"  # api_problem's reason where nothing answers at all
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")  # what get_run_logger() logs to
_ROOT = Path(__file__).resolve().parents[1]
OWN_PACKAGES = tuple(f"{_ROOT / package}{os.sep}" for package in ("rec", "tasks", "flows"))


@dataclass(frozen=True)
class PrefectApi:
    url: str  # http://HOST:PORT/api
    server: subprocess.Popen[bytes] | None  # the local server serve started; None: PREFECT_API_URL's
    log: Path | None = None  # the local server's output (none: on the terminal, with --verbose)


def answers(url: str, *, healthy: bool = True) -> bool:
    """Whether the API answers its health check (with ``healthy=False``: answers at all, without a
    server error; as Prefect's runner counts a failed poll, so a cloud workspace that requires
    authentication for ``/health`` is not taken for lost)."""
    import httpx

    try:
        status = httpx.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S).status_code
    except httpx.HTTPError:
        return False
    return status == 200 if healthy else status < 500


def api_problem(url: str) -> str | None:
    """Why ``url`` is no Prefect API (None: it may be): nothing answers there, or its health check
    (``{url}/health``, asked as Prefect's client asks: its credentials, custom headers and TLS
    settings, redirects followed) is not found (404) or answers a page, not JSON. The common case is a
    URL without ``/api``: Prefect's UI, or another server, answers it, and each flow then failed with
    Prefect's tracebacks. Any other answer (a proxy's 401, a server's 503) is left to Prefect's
    client, which says more."""
    import httpx

    health = f"{url.rstrip('/')}/health"
    try:
        response = httpx.get(health, timeout=HEALTH_TIMEOUT_S, follow_redirects=True, **_client_options())
    except httpx.HTTPError:
        return NO_SERVER
    if response.status_code == 200 and not _json(response):
        answer = f"GET {health} answered a page, not JSON"
    elif response.status_code == 404:
        answer = f"GET {health} answered 404"
    else:
        return None
    if "api" in urlsplit(url).path.split("/"):
        return f"no Prefect API there ({answer})"
    return f"no Prefect API there ({answer}); Prefect's API URL ends in /api (PREFECT_API_URL={url.rstrip('/')}/api)"


def _json(response: Any) -> bool:
    try:
        response.json()
    except ValueError:
        return False
    return True


def _client_options() -> dict[str, Any]:
    """What Prefect's client sends and checks: PREFECT_API_KEY (else PREFECT_API_AUTH_STRING),
    PREFECT_CLIENT_CUSTOM_HEADERS, and its TLS settings."""
    import base64

    from prefect.settings import get_current_settings

    settings = get_current_settings()
    api = settings.api
    headers = dict(settings.client.custom_headers or {})
    key = api.key.get_secret_value() if api.key else None
    auth = api.auth_string.get_secret_value() if api.auth_string else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    elif auth:
        headers["Authorization"] = f"Basic {base64.b64encode(auth.encode()).decode()}"
    verify: bool | str = False if api.tls_insecure_skip_verify else (api.ssl_cert_file or True)
    return {"headers": headers, "verify": verify}


def api_url_source() -> tuple[str, str]:
    """Where PREFECT_API_URL was set, for a message, and how to stop setting it: the environment, a
    Prefect profile (its name and file), or Prefect's settings files."""
    from prefect.settings import get_current_settings
    from prefect.settings.profiles import load_current_profile

    if os.environ.get("PREFECT_API_URL"):
        return "", "unset PREFECT_API_URL"
    try:
        profile = load_current_profile()
    except Exception:  # a profiles file Prefect cannot read: it said so already, as it loaded its settings
        profile = None
    if profile is not None and any(s.name == "PREFECT_API_URL" for s in profile.settings):
        path = get_current_settings().profiles_path
        return (f" (profile {profile.name!r} of {path})",
                f"`prefect config unset PREFECT_API_URL --profile {profile.name}`")
    return " (Prefect's settings: prefect.toml, pyproject.toml or .env here)", "remove it there"


@contextmanager
def prefect_api(port: int) -> Iterator[PrefectApi]:
    """The configured ``PREFECT_API_URL``, or a local server started on ``port`` for the block."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, get_current_settings, temporary_settings

    from tasks.launch import verbose

    configured = get_current_settings().api.url
    if configured:
        why = api_problem(configured)
        if why is not None:
            source, _ = api_url_source()
            raise InputError("Cannot serve:", [Problem(f"PREFECT_API_URL={configured}{source}", why)])
        yield PrefectApi(configured, None)
        return
    url = f"http://127.0.0.1:{port}/api"
    taken = port_taken(port)
    if taken:  # another serve's server would answer for the one started here, and get its deployments
        raise InputError("Cannot start a local Prefect server:", [Problem(f"127.0.0.1:{port}", (
            f"the port is in use ({taken}): another shardflow serve, or another program; give --port, or "
            f"PREFECT_API_URL={url} to serve on that server"))])
    log = None if verbose() else Path(PREFECT_HOME.value()) / SERVER_LOG
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log or os.devnull, "wb") as output:
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start",
                                   "--host", "127.0.0.1", "--port", str(port)],
                                  stdout=None if log is None else output, stderr=subprocess.STDOUT,
                                  start_new_session=True, preexec_fn=parent_death_signal())
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not answers(url):
            if server.poll() is not None:
                raise InputError("Cannot start a local Prefect server:", [
                    Problem(f"127.0.0.1:{port}", f"prefect server start exited {server.returncode}"
                                                 f"{_see(log)}; is the port taken? try --port or set "
                                                 "PREFECT_API_URL")])
            if time.monotonic() > deadline:
                raise InputError("Cannot start a local Prefect server:",
                                 [Problem(url, f"no answer after {STARTUP_TIMEOUT_S} s")])
            time.sleep(0.5)
        print(f"Prefect server at {url.removesuffix('/api')} (UI); stopped when serving stops", flush=True)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield PrefectApi(url, server, log)
    finally:
        stop_server(server, STOP_TIMEOUT_S)


def port_taken(port: int) -> str:
    """Why a server cannot listen on 127.0.0.1:``port`` (its bind's error), or "" where it can."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a closed one's port is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            return e.strerror or str(e)
    return ""


def stop_server(process: subprocess.Popen[Any], wait_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``wait_s``; reaped either way."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def lost(api: PrefectApi, stopping: threading.Event) -> str | None:
    """Blocks until the server is lost (returns why: the local server ended, or it answered no
    health check for ``UNANSWERED_POLLS`` polls) or ``stopping`` is set (returns None)."""
    from prefect.settings import get_current_settings

    unanswered_s = max(UNANSWERED_POLLS * get_current_settings().runner.poll_frequency, WATCH_EVERY_S)
    unanswered_since: float | None = None
    while not stopping.is_set():
        if api.server is None:
            stopping.wait(WATCH_EVERY_S)
        else:
            try:
                code = api.server.wait(timeout=WATCH_EVERY_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                return None if stopping.is_set() else \
                    f"the Prefect server it started at {api.url.removesuffix('/api')} {_ended(code)}{_see(api.log)}"
        if stopping.is_set():
            return None
        if answers(api.url, healthy=False):
            unanswered_since = None
        elif unanswered_since is None:
            unanswered_since = time.monotonic()
        elif time.monotonic() - unanswered_since >= unanswered_s:
            return f"the Prefect server at {api.url.removesuffix('/api')} has not answered for {unanswered_s:g} s"
    return None


@contextmanager
def watched(api: PrefectApi, on_lost: Callable[[str], object]) -> Iterator[None]:
    """Calls ``on_lost(why)`` from a watching thread if the server is lost while the block runs;
    meanwhile (unless ``--verbose``) neither this process nor the flow runs it starts show records
    of interruptions (``HideInterruptions``): a flow run in progress would log the lost server
    before the watch could stop it, and Prefect's runner logs the tasks it cancels as it stops."""
    from tasks.launch import verbose

    stopping = threading.Event()
    handlers = [] if verbose() else logging.getLogger().handlers
    quiet = HideInterruptions()
    for handler in handlers:
        handler.addFilter(quiet)
    previous = os.environ.get(SETTINGS_ENV)
    if not verbose():
        os.environ[SETTINGS_ENV] = str(_logging_settings_for_flow_runs())

    def watch() -> None:
        why = lost(api, stopping)
        if why is not None:
            on_lost(why)

    thread = threading.Thread(target=watch, name="prefect-server-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopping.set()
        for handler in handlers:
            handler.removeFilter(quiet)
        if previous is None:
            os.environ.pop(SETTINGS_ENV, None)
        else:
            os.environ[SETTINGS_ENV] = previous


class HideInterruptions(logging.Filter):
    """Drops the records of an interruption (their exception, or one it was raised from): a failed
    connection (the server is lost, which the watch says in one line) or a cancelled task (serving
    is stopping)."""

    def filter(self, record: logging.LogRecord) -> bool:
        import asyncio

        import httpx
        from websockets.exceptions import WebSocketException

        interruptions = (ConnectionError, EOFError, httpx.TransportError, WebSocketException, asyncio.CancelledError)
        error = record.exc_info[1] if record.exc_info else None
        while error is not None:
            if isinstance(error, interruptions):
                return False
            error = error.__cause__ or error.__context__
        return True


class InputErrorsWithoutTraceback(logging.Filter):
    """A flow run's record of bad input (an ``InputError``, whose message names every problem)
    without its traceback: a served run that fails so once printed ~165 lines on every schedule tick."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        while error is not None:
            if isinstance(error, InputError):
                record.exc_info, record.exc_text = None, None
                break
            error = error.__cause__ or error.__context__
        return True


class OwnInfoLines(logging.Filter):
    """A served flow run's INFO lines of shardflow's own modules (those the CLI prints: a replan's
    outcome, step progress), not Prefect's (every task's state), and every warning and error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or _own_file(record.pathname)


@lru_cache(maxsize=256)
def _own_file(path: str) -> bool:
    return os.path.realpath(path).startswith(OWN_PACKAGES)


def _logging_settings_for_flow_runs() -> Path:
    """Prefect's logging settings (the user's, or Prefect's own) with ``HideInterruptions`` and
    ``InputErrorsWithoutTraceback`` on its console handler, and Prefect's run loggers at INFO
    through ``OwnInfoLines`` (unless those settings give them a level of their own): serve's quiet
    ``PREFECT_LOGGING_LEVEL=WARNING``, which they would inherit, once dropped the very lines a served
    run is looked at for, such as an unchanged replan's check. Written to PREFECT_HOME for the
    flow-run processes to read."""
    import yaml
    from prefect.logging.configuration import DEFAULT_LOGGING_SETTINGS_PATH
    from prefect.settings import PREFECT_HOME, PREFECT_LOGGING_LEVEL, PREFECT_LOGGING_SETTINGS_PATH

    own = PREFECT_LOGGING_SETTINGS_PATH.value()
    settings = yaml.safe_load((own if own.exists() else DEFAULT_LOGGING_SETTINGS_PATH).read_text())
    ours = {"hide_interruptions": HideInterruptions, "input_errors_without_traceback": InputErrorsWithoutTraceback}
    for name, cls in ours.items():
        settings.setdefault("filters", {})[name] = {"()": f"{cls.__module__}.{cls.__name__}"}
    console = settings.get("handlers", {}).get("console")
    if console is not None:
        console["filters"] = [*console.get("filters", []), *ours]
    settings["filters"]["own_info_lines"] = {"()": f"{OwnInfoLines.__module__}.{OwnInfoLines.__name__}"}
    quiet = logging.getLevelNamesMapping().get(str(PREFECT_LOGGING_LEVEL.value()).upper(), 0) > logging.INFO
    for name in RUN_LOGGERS:
        logger = settings.setdefault("loggers", {}).setdefault(name, {})
        if quiet and logger.get("level", "NOTSET") == "NOTSET":  # NOTSET: the level of the logger "prefect"
            logger["level"] = "INFO"
            logger["filters"] = [*logger.get("filters", []), "own_info_lines"]
    path = Path(PREFECT_HOME.value()) / LOGGING_SETTINGS
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_name(f".{path.name}.{os.getpid()}")
    written.write_text(yaml.safe_dump(settings, sort_keys=False))
    written.replace(path)
    return path


def _see(log: Path | None) -> str:
    return "" if log is None else f" (its output: {log})"


def _ended(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
