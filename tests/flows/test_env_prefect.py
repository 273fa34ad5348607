"""A Prefect API URL that answers but is no Prefect API, an unwritable PREFECT_HOME, and a
PREFECT_API_URL set in a Prefect profile are refused before any flow runs, in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from flows.local_server import api_problem
from tests.paths import CPU_2PROC, DEMO

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plain_http_server() -> Iterator[str]:
    """A web server on 127.0.0.1 that is no Prefect API (``python -m http.server``)."""
    server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_plan_only(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``shardflow run --plan-only`` in a process of its own (Prefect reads its settings as it is imported)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    environment.update(env, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "flows.cli", "run", str(DEMO), "--topology", str(CPU_2PROC),
                           "--plan-only", "--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state"),
                           "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
                          cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)


def test_a_server_that_is_no_prefect_api_is_named_with_the_api_form_of_its_url(plain_http_server):
    assert api_problem(plain_http_server) == (
        f"no Prefect API there (GET {plain_http_server}/health answered 404); Prefect's API URL ends in /api "
        f"(PREFECT_API_URL={plain_http_server}/api)")
    assert api_problem(f"{plain_http_server}/api") == \
        f"no Prefect API there (GET {plain_http_server}/api/health answered 404)"


def test_a_workspace_url_and_a_server_that_wants_credentials_are_not_taken_for_no_api(plain_http_server):
    """A Prefect Cloud-style URL (a path after /api) is not told to end in /api; an auth proxy's 401 (its
    header set by PREFECT_CLIENT_CUSTOM_HEADERS, which this check may lack) is left to Prefect's client."""
    workspace = f"{plain_http_server}/api/accounts/a1/workspaces/w1"
    assert api_problem(workspace) == f"no Prefect API there (GET {workspace}/health answered 404)"

    class Guarded(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.end_headers()

    server = HTTPServer(("127.0.0.1", 0), Guarded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert api_problem(f"http://127.0.0.1:{server.server_address[1]}/api") is None
    finally:
        server.shutdown()
        server.server_close()


def test_run_refuses_a_prefect_api_url_without_api_in_one_line_exit_2(plain_http_server, tmp_path):
    done = run_plan_only(tmp_path, PREFECT_API_URL=plain_http_server, PREFECT_HOME=str(tmp_path / "prefect"))
    assert done.returncode == 2, done.stderr
    assert f"PREFECT_API_URL={plain_http_server}: no Prefect API there" in done.stderr
    assert "ends in /api" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_run_refuses_a_prefect_home_it_cannot_make_naming_it(tmp_path):
    (tmp_path / "a-file").write_text("")
    done = run_plan_only(tmp_path, PREFECT_HOME=str(tmp_path / "a-file" / "prefect"))
    assert done.returncode == 2, done.stderr
    assert "PREFECT_HOME: " in done.stderr and "is a file, not a folder" in done.stderr
    assert "Warning" not in done.stderr and "Traceback" not in done.stderr


def test_a_prefect_api_url_from_a_profile_is_named_by_its_profile_not_the_environment(tmp_path):
    home = tmp_path / "prefect"
    home.mkdir()
    (home / "profiles.toml").write_text('active = "mine"\n[profiles.mine]\nPREFECT_API_URL = "http://127.0.0.1:9/api"\n')
    done = run_plan_only(tmp_path, PREFECT_HOME=str(home))
    assert done.returncode == 2, done.stderr
    assert f"(profile 'mine' of {home / 'profiles.toml'})" in done.stderr
    assert "unset PREFECT_API_URL (" not in done.stderr
    assert "`prefect config unset PREFECT_API_URL --profile mine`" in done.stderr
