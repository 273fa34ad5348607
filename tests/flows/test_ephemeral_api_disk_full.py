"""Prefect's ephemeral API whose server cannot make its database (PREFECT_HOME on a full disk, or in
a place that cannot hold it): one line naming the server's exit code, its last error and the file
holding its output, instead of its tracebacks on the terminal and advice to wait longer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.flows.test_ephemeral_api import plan_only, servers_of


def test_a_server_that_cannot_make_its_database_is_reported_in_one_line_with_its_error(tmp_path):
    """A folder where the server's database goes (PREFECT_HOME itself usable: one that is not is refused
    before the server starts): the server fails to open its database, as on a full disk, whoever runs
    the test (root too). Its output goes to a file in the temporary directory (here TMPDIR), which the
    line names and which holds the tracebacks the terminal no longer shows."""
    (tmp_path / "prefect" / "prefect.db").mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    run = plan_only(tmp_path, "full", PREFECT_HOME=str(tmp_path / "prefect"), TMPDIR=str(tmp_path / "tmp"))
    out, err = run.communicate(timeout=300)
    assert run.returncode == 1, out + err
    assert "Traceback" not in out + err and len((out + err).splitlines()) < 10, out + err
    (line,) = [line for line in err.splitlines() if line.startswith("shardflow run:")]
    assert "Prefect's local API did not start: its server exited with code 3 before it answered: " \
           "unable to open database file (its output: " in line, line
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" not in line  # a longer wait would not help
    (log,) = (tmp_path / "tmp").iterdir()
    assert line.endswith(f"(its output: {log})") and "Traceback" in log.read_text()
    assert not (tmp_path / "full").exists() and not servers_of(tmp_path)


@pytest.mark.parametrize("says", ["", "sqlite3.OperationalError: database or disk is full"])
def test_the_servers_output_is_named_when_it_says_something_and_removed_when_it_is_not(
        tmp_path, monkeypatch, says):
    """A server that never answers (an interpreter in its place, writing ``says`` to its output):
    the timeout, with its advice, names the output only if there is some, and keeps only that."""
    from flows import ephemeral_api

    def never_answers(server):
        server.port = ephemeral_api._free_port()
        with open(server.log, "ab") as output:
            says_it = f"import sys, time; sys.stdout.write({says!r}); sys.stdout.flush(); time.sleep(60)"
            server.process = subprocess.Popen([sys.executable, "-c", says_it], stdout=output)

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("SHARDFLOW_VERBOSE", raising=False)
    monkeypatch.setattr(ephemeral_api.tempfile, "tempdir", None)  # TMPDIR read again
    monkeypatch.setattr(ephemeral_api._Server, "_launch", never_answers)
    server = ephemeral_api._Server()
    server.launch()
    log = server.log
    assert log is not None and log.parent == tmp_path
    with pytest.raises(ephemeral_api.PrefectApiUnavailable) as e:
        server.wait(1)
    server.stop()
    message = str(e.value)
    assert "it did not answer within 1 s" in message and "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in message
    if says:
        assert f"(its output: {log})" in message and Path(log).read_text().strip() == says
    else:
        assert "its output" not in message and not log.exists()


def test_a_server_that_fails_the_flows_is_one_line_not_prefects_traceback(monkeypatch):
    """PREFECT_HOME filled after the server started: every state change answered 500, and `shardflow run`
    ended in ~2,000 lines of Prefect's tracebacks."""
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.ephemeral_api import PrefectApiUnavailable, ephemeral_api

    request = httpx.Request("POST", "http://127.0.0.1:9/api/flow_runs/3e17/set_state")
    failed = httpx.HTTPStatusError("500", request=request, response=httpx.Response(500, request=request))
    with temporary_settings(updates={PREFECT_API_URL: None}), pytest.raises(PrefectApiUnavailable) as e:
        with ephemeral_api():
            raise PrefectHTTPStatusError.from_httpx_error(failed)
    assert str(e.value) == "Prefect's local API failed: 500 Internal Server Error on set_state"


@pytest.mark.parametrize(("says", "launches"), [
    ("sqlite3.OperationalError: unable to open database file", 1),  # the app's: relaunching cannot help
    ("ERROR: [Errno 98] error while attempting to bind on address: address already in use", 4),
])
def test_a_server_exiting_3_is_relaunched_only_where_its_port_may_have_been_taken(tmp_path, monkeypatch, says,
                                                                                 launches):
    """uvicorn exits 3 for a port taken and for an app that failed to start: a read-only HOME was relaunched
    3 times (840 lines of tracebacks then)."""
    from flows import ephemeral_api

    launched = []

    def fails_at_once(server):
        server.port = ephemeral_api._free_port()
        with open(server.log, "ab") as output:
            fail = f"import sys; print({says!r}); raise SystemExit(3)"
            server.process = subprocess.Popen([sys.executable, "-c", fail], stdout=output)
        launched.append(server.process)

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("SHARDFLOW_VERBOSE", raising=False)
    monkeypatch.setattr(ephemeral_api.tempfile, "tempdir", None)
    monkeypatch.setattr(ephemeral_api._Server, "_launch", fails_at_once)
    server = ephemeral_api._Server()
    server.launch()
    with pytest.raises(ephemeral_api.PrefectApiUnavailable, match="its server exited with code 3 before it answered"):
        server.wait(60)
    server.stop()
    assert len(launched) == launches == 1 + ephemeral_api.RELAUNCHES * (launches > 1)
