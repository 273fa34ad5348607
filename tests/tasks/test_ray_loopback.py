"""A local Ray started by shardflow listens on loopback only."""

from __future__ import annotations

import ipaddress

import psutil
import pytest

pytestmark = pytest.mark.slow  # a local Ray cluster


def test_a_local_ray_listens_on_loopback_only():
    import ray

    from tasks.ray_search import connect

    assert connect(None)
    try:
        ray.get(ray.remote(lambda: 1).remote())  # a worker process is up too
        processes = [psutil.Process(), *psutil.Process().children(recursive=True)]
        pids = {p.pid for p in processes}
        listening = {c.laddr.ip for c in psutil.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.pid in pids}
    finally:
        ray.shutdown()
    assert listening, "found no listening socket of the local Ray"

    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip)
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address).is_loopback

    assert [ip for ip in listening if not loopback(ip)] == []


def test_the_loopback_module_was_checked_with_the_installed_ray():
    import ray

    from tasks.ray_loopback import CHECKED_VERSION

    assert ray.__version__ == CHECKED_VERSION, (
        f"Ray {ray.__version__} is installed; tasks/ray_loopback.py was checked with {CHECKED_VERSION}. Check "
        "that ray._private.ray_constants still has ENABLE_RAY_CLUSTER (read by services.get_node_ip_address) "
        "and ENABLE_RAY_CLUSTERS_ENV_VAR, that the test above still finds loopback only, or whether Ray now "
        "has a public option for a loopback-only local Ray; then update CHECKED_VERSION")
