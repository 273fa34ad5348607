"""A local Ray that listens on loopback only: the one module that reaches into Ray's internals.

Ray starts a local cluster node listening on all interfaces. Its single-machine mode (what it uses
on macOS and Windows) binds every Ray server to loopback instead, and Ray has no public option for
it: the mode is an environment variable its processes read at start, and a constant in
``ray._private.ray_constants`` that the driver read when it imported ray. Checked with Ray
``CHECKED_VERSION``; tests/tasks/test_ray_loopback.py fails when another version is installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

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
