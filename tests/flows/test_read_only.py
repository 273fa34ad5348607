"""Commands that only read MLflow (``compare``) never create, migrate or write a store: a missing
store, or a SQLite file that is not MLflow's, is a one-line error (exit 2) and stays byte for byte
as it was (docs/security.md)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.flows.cli_in_process import shardflow_here

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def refused(capfd: pytest.CaptureFixture[str], uri: str, why: str) -> None:
    result = shardflow_here(capfd, "compare", "--tracking-uri", uri)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert why in result.stderr


def test_a_database_of_someone_else_stays_as_it_was(tmp_path, capfd):
    db = tmp_path / "other.db"
    with closing(sqlite3.connect(db)) as con:
        con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("INSERT INTO users (name) VALUES ('ada')")
        con.commit()
    before = files(tmp_path)
    refused(capfd, f"sqlite:///{db}", "is not an MLflow store")
    assert files(tmp_path) == before


def test_a_missing_store_is_not_made(tmp_path, capfd):
    refused(capfd, f"sqlite:///{tmp_path / 'mlflow.db'}", "no MLflow store at")
    refused(capfd, str(tmp_path / "mlruns"), "no MLflow store at")
    refused(capfd, (tmp_path / "mlruns").as_uri(), "no MLflow store at")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_directory_is_no_file_store(tmp_path, capfd):
    refused(capfd, str(tmp_path), "is not an MLflow store")
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_store_given_as_a_plain_path_is_named_with_its_uri(tmp_path, capfd):
    from tests.stores import make_store

    make_store(tmp_path / "mlflow.db")
    refused(capfd, str(tmp_path / "mlflow.db"), "is a file, not a file store (a folder): a SQLite store is named "
                                                "sqlite:///")


def test_an_mlflow_store_is_read_and_left_as_it_was(tmp_path, capfd, monkeypatch):
    from tests.stores import make_store

    make_store(tmp_path / "mlflow.db")
    before = files(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = shardflow_here(capfd, "compare", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                            "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 0, result
    assert "no experiment 'shardflow'" in result.stdout
    assert files(tmp_path) == before


@pytest.mark.parametrize("uri", ["mysql://u:p@127.0.0.1:1/mlflow", "postgresql://u:p@127.0.0.1:1/mlflow"])
def test_a_database_store_whose_driver_is_not_installed_is_named_in_one_line(capfd, uri):
    """SQLAlchemy imports a database's driver only when the store opens: its absence is the store's
    problem, named, not a traceback."""
    refused(capfd, uri, "the store's database driver is not installed here (no module")


def test_outbox_list_of_a_state_dir_that_is_a_file_names_it(tmp_path, capfd):
    (tmp_path / "state").write_text("")
    result = shardflow_here(capfd, "outbox", "list", "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 2 and "is a file, not a folder" in result.stderr
    assert "nothing waits" not in result.stdout
