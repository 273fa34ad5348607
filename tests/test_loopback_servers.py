"""Every server the project, its tests and benches start listens on loopback only (docs/security.md):
the scale bench's two-node Ray cluster here; a local Ray as ``shardflow plan --backend ray`` and the
Ray tests start it in tests/tasks/test_ray_search.py, and Prefect's ephemeral API as ``shardflow
run`` starts it in tests/flows/test_ephemeral_api.py, where those tests start them already. Each
lists the listening sockets of the processes it started and their children. MLflow's UI
(``shardflow ui``) is checked by its command line here, served in tests/flows/test_ui.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.listening import listening, not_loopback
from tests.paths import ROOT

pytestmark = pytest.mark.slow  # Ray clusters, a Prefect server


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


def test_the_mlflow_ui_the_project_starts_binds_loopback():
    """``shardflow ui`` (the command ``shardflow run`` prints to browse the runs) starts MLflow's UI
    with ``--host 127.0.0.1`` (served and probed from another address in tests/flows/test_ui.py);
    ``mlflow ui`` without a host, as the docs show it, keeps MLflow's default, 127.0.0.1. (Started
    here each would take 20 s more.)"""
    from mlflow.cli import cli

    from flows.commands.ui import ui_command

    command = ui_command("sqlite:///mlflow.db", 5000)
    assert command[command.index("--host") + 1] == "127.0.0.1"
    host = next(p for p in cli.commands["server"].params if p.name == "host")  # `mlflow ui` is `mlflow server`
    assert host.default == "127.0.0.1"


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
