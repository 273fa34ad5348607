"""One Prefect test server for every flow test of the run (``tests.flows.shared_prefect``): it is
slow to start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.flows.shared_prefect import MIGRATED, SERVER_ENV, run_root, shared_server


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """The test server's API URL, this process's Prefect API for the session. A ``shardflow``
    subprocess given it as PREFECT_API_URL runs its flows there instead of starting a temporary
    server of its own (seconds of CPU each)."""
    from flows.logs import set_up

    # Prefect sets up its logging once per process, the first time it is used: with the CLI's quiet
    # settings, whichever test comes first (a flow called directly, or the CLI).
    set_up(verbose=False)
    import prefect.context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = shared_server(run_root(tmp_path_factory.getbasetemp()))
    # The servers tests start themselves (``shardflow serve``) keep the telemetry off, as this one.
    analytics = "PREFECT_SERVER_ANALYTICS_ENABLED"
    previous = os.environ.get(analytics)
    os.environ[analytics] = SERVER_ENV[analytics]
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}), \
                prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
            yield url
            _drain()
    finally:
        if previous is None:
            os.environ.pop(analytics, None)
        else:
            os.environ[analytics] = previous


@pytest.fixture(scope="session")
def prefect_database(prefect_api, tmp_path_factory) -> Path:
    """A Prefect database with its tables made (every migration applied) and no runs: the test
    server's as it had just started. A Prefect server of a test's own (``shardflow serve``) given a
    copy in its PREFECT_HOME starts without migrating a new one (about half of its start's CPU)."""
    return run_root(tmp_path_factory.getbasetemp()) / MIGRATED


def _drain() -> None:
    """Send this process's logs and events still queued before it stops using the server, as
    Prefect's test harness does before it stops its own."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            sent = APILogWorker.instance().drain()
            if inspect.isawaitable(sent):
                await sent
        except RuntimeError:  # never started
            pass
        events = EventsWorker.drain_all()
        if inspect.isawaitable(events):
            await events

    run_coro_as_sync(drain())
