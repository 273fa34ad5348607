"""MLflow stores for tests whose subject is not making one: MLflow's migrations of a new SQLite
store take seconds of CPU, so the suite makes one per test process and copies it."""

from __future__ import annotations

import shutil
from pathlib import Path


def make_store(db: Path) -> Path:
    """A new MLflow store at ``db`` with its tables made (what MLflow does on first use)."""
    from mlflow import MlflowClient

    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


def store_from(template: Path, directory: Path) -> str:
    """A new, empty MLflow store at ``directory``/mlflow.db, copied from ``template``; its URI."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, directory / "mlflow.db")
    return f"sqlite:///{directory / 'mlflow.db'}"
