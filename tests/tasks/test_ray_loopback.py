"""The loopback-only Ray module was checked with the installed Ray (that the local Ray it starts
listens on loopback only: tests/tasks/test_ray_search.py)."""

from __future__ import annotations


def test_the_loopback_module_was_checked_with_the_installed_ray():
    import ray

    from tasks.ray_loopback import CHECKED_VERSION

    assert ray.__version__ == CHECKED_VERSION, (
        f"Ray {ray.__version__} is installed; tasks/ray_loopback.py was checked with {CHECKED_VERSION}. Check "
        "that ray._private.ray_constants still has ENABLE_RAY_CLUSTER (read by services.get_node_ip_address) "
        "and ENABLE_RAY_CLUSTERS_ENV_VAR, that tests/tasks/test_ray_search.py still finds loopback only, or "
        "whether Ray now has a public option for a loopback-only local Ray; then update CHECKED_VERSION")
