"""A local Ray that listens on loopback only: the one module that reaches into Ray's internals.

Ray starts a local cluster node listening on all interfaces, and turns a ``--node-ip-address`` or
``_node_ip_address`` of 127.0.0.1 into the machine's own address (``resolve_ip_for_localhost``):
neither keeps it on loopback. Its single-machine mode (what it uses on macOS and Windows) binds every
Ray server to loopback instead, and Ray has no public option for it: the mode is an environment
variable its processes read at start, and a constant in ``ray._private.ray_constants`` that the
driver read when it imported ray. Every Ray the project, its tests and benches start goes through
``start_local`` or ``local_cluster`` here. Checked with Ray ``CHECKED_VERSION``;
tests/tasks/test_ray_loopback.py fails when another version is installed, and
tests/test_loopback_servers.py when a server listens on any other address.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHECKED_VERSION = "2.60.0"


@contextmanager
def single_machine() -> Iterator[None]:
    """Start the local Ray (its processes inherit the environment) inside this block; the driver's
    own setting is restored after, so that a later ``RAY_ADDRESS`` cluster works."""
    from ray._private import ray_constants

    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR  # "0": single-machine mode
    previous_env, previous = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = previous
        if previous_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous_env


def single_machine_env() -> dict[str, str]:
    """The environment of a process that joins a ``local_cluster`` as a driver (``RAY_ADDRESS=127.0.0.1:PORT``):
    in Ray's cluster mode it would look for the cluster at the machine's network address instead."""
    from ray._private import ray_constants

    return {ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR: "0"}


def start_local(**init: Any) -> None:
    """``ray.init`` of a new local Ray on loopback only, without the dashboard's UI; ``init``: more of
    ``ray.init``'s keywords (``num_cpus``). ``address="local"``: without it ray.init joins the cluster
    that ``ray start`` last started on this machine (another user's, or a test's beside)."""
    import ray

    with single_machine():
        ray.init(**{"address": "local", "include_dashboard": False, "log_to_driver": False,
                    "configure_logging": False, **init})


@contextmanager
def local_cluster(nodes: int, cpus_per_node: int = 1) -> Iterator[str]:
    """A Ray cluster of ``nodes`` nodes on this machine, every server on loopback (Ray's own
    ``cluster_utils.Cluster``, which starts each node as ``ray start`` would); yields its address,
    shut down on leaving."""
    from ray.cluster_utils import Cluster

    with single_machine():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node,
                                                                 "include_dashboard": False})
        try:
            for _ in range(nodes - 1):
                cluster.add_node(num_cpus=cpus_per_node)
        except BaseException:
            cluster.shutdown()
            raise
    try:
        yield cluster.address
    finally:
        cluster.shutdown()
