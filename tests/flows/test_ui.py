"""``shardflow ui``: MLflow's UI for a store made the way the commands make one, answering on
127.0.0.1 only, printing the runs table's address, and stopping on Ctrl-C; a missing store is refused."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tasks.tracking import connect, tracking_for
from tests.flows.cli_in_process import shardflow_here
from tests.paths import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def other_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent
            address = str(s.getsockname()[0])
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_ui_serves_the_store_on_loopback_and_stops_on_ctrl_c(tmp_path: Path, mlflow_uri: str):
    tracking = tracking_for(mlflow_uri, state_dir=str(tmp_path / "state"))
    _, experiment_id = connect(tracking)  # the experiment as the commands make it
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "flows.cli", "ui", "--port", str(port), "--tracking-uri",
                           tracking.uri], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        assert f"http://127.0.0.1:{port}/#/experiments/{experiment_id}" in line, line
        deadline = time.monotonic() + 60  # MLflow's server imports MLflow first: seconds more on busy cores
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "the UI did not answer"
                time.sleep(0.2)
        address = other_address()
        if address is not None:
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=1):
                pass
        ui.send_signal(signal.SIGINT)
        _, err = ui.communicate(timeout=30)
        assert ui.returncode in (0, 130)
        assert err.strip().splitlines() == ["shardflow: MLflow UI stopped"]
    finally:
        if ui.poll() is None:
            ui.kill()
            ui.wait()


def test_ui_refuses_a_missing_store(tmp_path, capfd):
    result = shardflow_here(capfd, "ui", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "no MLflow store at" in result.stderr
    assert os.listdir(tmp_path) == []


def test_a_port_another_process_listens_on_is_named_before_any_address_is_printed(capfd, mlflow_uri: str):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = shardflow_here(capfd, "ui", "--tracking-uri", mlflow_uri, "--port", str(port))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (f"shardflow: Cannot start the MLflow UI: port {port} on 127.0.0.1 is in use; "
                                     "choose another --port")


def test_the_ui_server_dies_with_a_killed_ui_command(tmp_path: Path, mlflow_uri: str):
    """``shardflow ui`` SIGKILLed (no Ctrl-C to stop its server): MLflow's server goes with it."""
    import psutil

    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "flows.cli", "ui", "--port", str(port), "--tracking-uri",
                           mlflow_uri], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert ui.stdout is not None and "MLflow UI" in ui.stdout.readline()
        servers = psutil.Process(ui.pid).children()
        assert servers
    finally:
        ui.kill()
        ui.wait()
    _, alive = psutil.wait_procs(servers, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]
