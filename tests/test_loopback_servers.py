"""Every server the project, its tests and benches start listens on loopback only (docs/security.md):
a local Ray as ``shardflow plan --backend ray`` and the Ray tests start it, the scale bench's
two-node Ray cluster, and Prefect's ephemeral API as ``shardflow run`` starts it: each test lists
the listening sockets of the processes it started and their children. MLflow's UI (``shardflow ui``,
and the ``mlflow ui`` command ``shardflow run`` prints) is checked by its command line here, served
in tests/flows/test_ui.py."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.slow  # Ray clusters, a Prefect server


def listening(*roots: int) -> dict[str, set[str]]:
    """The addresses the processes ``roots`` and their children listen on, each with the names of
    the processes listening there."""
    processes: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            processes |= {p.pid: p for p in (root, *root.children(recursive=True))}
        except psutil.NoSuchProcess:
            continue
    found: dict[str, set[str]] = {}
    for process in processes.values():
        try:
            connections = process.net_connections(kind="inet")
            name = process.name()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        for c in connections:
            if c.status == psutil.CONN_LISTEN:
                found.setdefault(c.laddr.ip, set()).add(name)
    return found


def not_loopback(found: dict[str, set[str]]) -> dict[str, set[str]]:
    """The addresses other than 127.0.0.1 and ::1 (an IPv4-mapped 127.0.0.1 is loopback too)."""
    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip.split("%")[0])
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address) in (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))

    return {ip: names for ip, names in found.items() if not loopback(ip)}


def test_a_local_ray_as_the_project_and_its_tests_start_it_listens_on_loopback_only():
    import ray

    from tasks.ray_loopback import start_local

    start_local(num_cpus=1)
    try:
        assert ray.get(ray.remote(lambda: 1).remote()) == 1  # a worker process is up too
        found = listening(os.getpid())
    finally:
        ray.shutdown()
    assert found, "found no listening socket of the local Ray"
    assert not_loopback(found) == {}


def test_the_scale_benchs_two_node_ray_cluster_listens_on_loopback_only_and_shardflow_joins_it(tmp_path,
                                                                                            monkeypatch):
    from bench import scale_bench
    from rec.spec import write_spec
    from rec.spec.synthetic import power_law_spec

    seen: dict[str, dict[str, set[str]]] = {}
    run_plan = scale_bench.run_plan

    def run_plan_on_the_cluster(*args, **kwargs):
        seen["cluster"] = listening(os.getpid())  # the cluster's nodes are this process's children
        row = run_plan(*args, **kwargs)  # `shardflow plan --backend ray` with RAY_ADDRESS
        return row

    monkeypatch.setattr(scale_bench, "run_plan", run_plan_on_the_cluster)
    spec = tmp_path / "spec.parquet"
    write_spec(power_law_spec(200, seed=0), spec)
    row = scale_bench.two_node_cluster(spec, scale_bench.topology_file(tmp_path, 8), tmp_path / "plan")
    assert row["ray_nodes"] == 2 and row["backend"] == "ray" and row["groups"] == 4
    assert seen["cluster"], "found no listening socket of the two-node cluster"
    assert not_loopback(seen["cluster"]) == {}


def test_prefects_ephemeral_api_as_shardflow_run_starts_it_listens_on_loopback_only(tmp_path):
    script = ("import sys\nfrom flows.ephemeral_api import ephemeral_api\nwith ephemeral_api():\n"
              "    print('up', flush=True)\n    sys.stdin.read()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "up", process.stderr
        found = listening(process.pid)
    finally:
        process.communicate("", timeout=60)  # stdin closed: the flow's block ends and the server stops
    assert found, "found no listening socket of Prefect's server"
    assert not_loopback(found) == {}


def test_the_mlflow_ui_commands_the_project_starts_and_prints_bind_loopback():
    """``shardflow ui`` starts MLflow's UI with ``--host 127.0.0.1`` (served and probed from another
    address in tests/flows/test_ui.py); the ``mlflow ui`` command ``shardflow run`` prints names no
    host, so MLflow's default, 127.0.0.1, holds. (Started here each would take 20 s more.)"""
    from mlflow.cli import cli

    from flows.commands.ui import ui_command

    command = ui_command("sqlite:///mlflow.db", 5000)
    assert command[command.index("--host") + 1] == "127.0.0.1"
    host = next(p for p in cli.commands["server"].params if p.name == "host")  # `mlflow ui` is `mlflow server`
    assert host.default == "127.0.0.1"
    printed = next(line for line in (ROOT / "flows" / "commands" / "run.py").read_text().splitlines()
                   if "ui --backend-store-uri" in line)
    assert "--host" not in printed


def test_the_tests_and_benches_start_ray_only_through_the_loopback_module():
    """A new ``ray.init()`` or ``ray start`` elsewhere would start Ray on the machine's network address."""
    offenders = []
    for folder in ("tasks", "flows", "bench", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == Path(__file__).name or path == ROOT / "tasks" / "ray_loopback.py":
                continue
            text = path.read_text(encoding="utf-8")
            for line in text.splitlines():
                if ("ray.init(" in line and "address=" not in line) or '"start", "--head"' in line:
                    offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert offenders == []
