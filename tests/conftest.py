"""Fixtures every test folder shares (paths are constants: ``tests.paths``).

``slow`` marks the tests that start real multi-process jobs (torchrun trainings, Prefect servers,
Ray clusters); ``make test-fast`` runs the suite without them."""

from __future__ import annotations

import os
from pathlib import Path

# Two pytest workers share the 2 cores of the CI machine: torch's default of one thread per core in
# each worker (and in every process a test starts) oversubscribes them, and its OpenMP threads spin
# while they wait. One thread each (torchrun sets the same for its ranks): the in-process trainings
# took a third less CPU. Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from tests.paths import CPU_2PROC, DEMO, ROOT
from tests.stores import make_store, store_from


def _recorded_in_the_checkout() -> set[str]:
    """What shardflow records where a command run from the repository root would: the default
    store and the outbox's entries."""
    outbox = ROOT / ".shardflow" / "outbox"
    entries = {f"outbox/{p.name}" for p in outbox.iterdir() if not p.name.startswith(".")} if outbox.is_dir() else set()
    return entries | {name for name in ("mlflow.db", "mlruns") if (ROOT / name).exists()}


@pytest.fixture(scope="session", autouse=True)
def nothing_recorded_in_the_checkout():
    """A test that runs a recording command from the repository root without a store of its own
    (or ``--no-track``) fails the session: it would leave runs in the developer's checkout."""
    before = _recorded_in_the_checkout()
    yield
    added = _recorded_in_the_checkout() - before
    assert not added, f"tests recorded into the checkout: {sorted(added)}"


@pytest.fixture(scope="session")
def demo_inputs():
    """The demo spec on two CPU processes, ingested (read, validated and hashed) once."""
    from tasks.ingest import ingest

    return ingest(str(DEMO), str(CPU_2PROC))


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An MLflow store with its tables made, once per test process (``tests.stores``)."""
    return make_store(tmp_path_factory.mktemp("mlflow-template") / "mlflow.db")


@pytest.fixture
def mlflow_uri(mlflow_template, tmp_path) -> str:
    """An empty MLflow store at tmp_path/mlflow.db (from ``mlflow_template``)."""
    return store_from(mlflow_template, tmp_path)


@pytest.fixture
def single_process_group(tmp_path):
    """A gloo process group of this process alone (rank 0 of 1): DMP shards and trains in the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test on Prefect's test server (the ``prefect_api`` fixture, a server process) is slow."""
    for item in items:
        if "prefect_api" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
