"""One Prefect test harness (a temporary Prefect server) for every flow test: it is slow to start."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def prefect_api():
    """The test server's API URL. A ``shardflow`` subprocess given it as PREFECT_API_URL runs its
    flows there instead of starting a temporary server of its own (seconds of CPU each)."""
    from flows.logs import set_up

    # Prefect sets up its logging once per process, the first time it is used: with the CLI's quiet
    # settings, whichever test comes first (a flow called directly, or the CLI).
    set_up(verbose=False)
    from prefect.testing.utilities import prefect_test_harness

    # The server's telemetry write races its own start-up on SQLite ("database is locked").
    previous = os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    try:
        with prefect_test_harness(server_startup_timeout=180):
            from prefect.settings import PREFECT_API_URL

            yield PREFECT_API_URL.value()
    finally:
        if previous is None:
            os.environ.pop("PREFECT_SERVER_ANALYTICS_ENABLED", None)
        else:
            os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = previous
