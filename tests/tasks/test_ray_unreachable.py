"""Ray that cannot be reached: an explicit --backend ray is a user error, auto falls back."""

from __future__ import annotations

import logging
import socketserver
import subprocess
import time

from rec.planning import plan_spec
from rec.spec.synthetic import power_law_spec
from rec.topology import topology_from_dict
from tasks.ray_search import AutoSearcher
from tests.paths import CPU_2PROC, DEMO, ROOT, SHARDFLOW

TOPO = topology_from_dict(dict(world_size=8, compute_device="cuda", hbm_cap="80GiB", ddr_cap="128GiB"))


def plan_on_ray(out, address: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(SHARDFLOW), "plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out",
                           str(out), "--backend", "ray"], capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RAY_ADDRESS": address})


def test_unreachable_cluster_with_explicit_ray_backend_exits_2(tmp_path):
    r = plan_on_ray(tmp_path / "p", "127.0.0.1:1")
    assert r.returncode == 2
    assert "Cannot reach the Ray cluster" in r.stderr and "127.0.0.1:1" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "p").exists()


def test_a_listener_that_is_no_ray_cluster_is_named_in_one_line_within_seconds(tmp_path):
    """It was taken as reachable, and ray.init failed only after about a minute."""
    # not served: the kernel accepts connections, nothing ever answers
    with socketserver.TCPServer(("127.0.0.1", 0), socketserver.BaseRequestHandler) as listener:
        address = f"127.0.0.1:{listener.server_address[1]}"
        started = time.monotonic()
        r = plan_on_ray(tmp_path / "p", address, timeout=30)
        took = time.monotonic() - started
    assert r.returncode == 2 and took < 10, (took, r.stderr)
    problems = [line for line in r.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and address in problems[0] and "not a Ray cluster" in problems[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "p").exists()


def test_auto_falls_back_to_local_with_a_warning_when_ray_is_unreachable(monkeypatch, caplog):
    spec = power_law_spec(200, seed=1)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="tasks.ray_search"):
        plan = plan_spec(spec, TOPO, searcher=AutoSearcher(min_tables=10))
    assert "searching locally" in caplog.text
    assert plan.plan_id == plan_spec(spec, TOPO).plan_id
