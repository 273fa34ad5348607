"""Commands that only read MLflow (``compare``) never create, migrate or write a store: a missing
store, or a SQLite file that is not MLflow's, is a one-line error (exit 2) and stays byte for byte
as it was (docs/security.md)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, DEMO

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


def test_a_missing_store_is_not_made(tmp_path, capfd, monkeypatch):
    refused(capfd, f"sqlite:///{tmp_path / 'mlflow.db'}", "no MLflow store at")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store without it
    refused(capfd, str(tmp_path / "mlruns"), "no MLflow store at")
    refused(capfd, (tmp_path / "mlruns").as_uri(), "no MLflow store at")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_directory_is_no_file_store(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    refused(capfd, str(tmp_path), "is not an MLflow store")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri,why", [
    ("sqlite://", "is an in-memory SQLite database, whose runs end with the command"),  # once: runs lost, exit 0
    (" ", "is empty"), ("bogus://x", "MLflow has no store for the scheme 'bogus'"), ("http://", "names no host"),
    ("mlruns", "is a file store (a folder of runs), which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true"),
])
def test_a_uri_no_run_could_ever_reach_is_refused_by_every_command(tmp_path, capfd, uri, why):
    """Recording commands once took these, said the run was recorded (or kept it in the outbox for
    good), and exited 0."""
    result = shardflow_here(capfd, "compare", "--tracking-uri", uri)
    assert result.returncode == 2 and why in result.stderr and "Traceback" not in result.stderr, result
    result = shardflow_here(capfd, "plan", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "p"),
                            "--tracking-uri", uri, "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 2 and why in result.stderr, result
    assert not (tmp_path / "p").exists() and not (tmp_path / "state").exists()


def test_a_sqlite_store_given_as_a_plain_path_is_named_with_its_uri(tmp_path, capfd):
    from tests.stores import make_store

    make_store(tmp_path / "mlflow.db")
    result = shardflow_here(capfd, "compare", "--tracking-uri", str(tmp_path / "mlflow.db"))
    assert result.returncode == 2, result
    assert f"is a file, not a file store (a folder): a SQLite store is named sqlite:///{tmp_path}" in result.stderr


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
