"""Ray that cannot be reached: an explicit --backend ray is a user error, auto falls back."""

from __future__ import annotations

import logging
import subprocess

from rec.planning import plan_spec
from rec.spec.synthetic import power_law_spec
from rec.topology import topology_from_dict
from tasks.ray_search import AutoSearcher
from tests.paths import CPU_2PROC, DEMO, SHARDFLOW

TOPO = topology_from_dict(dict(world_size=8, compute_device="cuda", hbm_cap="80GiB", ddr_cap="128GiB"))


def test_unreachable_cluster_with_explicit_ray_backend_exits_2(tmp_path):
    r = subprocess.run([str(SHARDFLOW), "plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out",
                        str(tmp_path / "p"),
                        "--backend", "ray"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "RAY_ADDRESS": "127.0.0.1:1"}, timeout=120)
    assert r.returncode == 2
    assert "Cannot reach the Ray cluster" in r.stderr and "127.0.0.1:1" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "p").exists()


def test_auto_falls_back_to_local_with_a_warning_when_ray_is_unreachable(monkeypatch, caplog):
    spec = power_law_spec(200, seed=1)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="tasks.ray_search"):
        plan = plan_spec(spec, TOPO, searcher=AutoSearcher(min_tables=10))
    assert "searching locally" in caplog.text
    assert plan.plan_id == plan_spec(spec, TOPO).plan_id
