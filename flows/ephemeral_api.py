"""Prefect's ephemeral API, which ``shardflow run`` and ``shardflow replan`` use when no
``PREFECT_API_URL`` is set: started before the flow, with a startup budget a busy machine survives.

Prefect starts it on first use and gives up after ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``
(Prefect's default: 20 s) with a traceback. The first start also creates Prefect's database in
PREFECT_HOME: with one busy core that took longer than 20 s, and the README's first command failed.
shardflow starts the same server itself, waiting as long as that same setting says, or
``STARTUP_TIMEOUT_S`` when the user did not set it, and reports a start that fails in one line.
"""

from __future__ import annotations

from rec import progress

STARTUP_TIMEOUT_S = 120


class PrefectApiUnavailable(RuntimeError):
    """Prefect's ephemeral API did not start; the message is one line saying why and what to do."""


def startup_budget_s() -> int:
    """``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` as the user set it (environment or
    Prefect profile), else ``STARTUP_TIMEOUT_S``."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    with temporary_settings(set_defaults={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: STARTUP_TIMEOUT_S}):
        return int(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())


def start_ephemeral_api() -> None:
    """Start Prefect's ephemeral API for this process now, unless ``PREFECT_API_URL`` names a
    server; the flows then use it (Prefect keeps one per process). ``PrefectApiUnavailable`` if it
    does not answer within ``startup_budget_s``, or exits first."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    budget = startup_budget_s()
    server = SubprocessASGIServer()
    with progress.step("prefect", "starting Prefect's local API"):
        try:
            server.start(timeout=budget)
        except Exception:  # Prefect raises RuntimeError with the server's output; one line says more
            code = server.server_process.poll() if server.server_process is not None else None
            server.stop()
            why = (f"its server exited with code {code} before it answered" if code is not None
                   else f"it did not answer within {budget} s")
            raise PrefectApiUnavailable(
                f"Prefect's local API did not start: {why}; allow it longer with "
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=SECONDS, or set PREFECT_API_URL to a running "
                "Prefect server") from None
