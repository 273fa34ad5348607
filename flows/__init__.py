"""Prefect flows and the ``shardflow`` CLI: they compose ``rec`` and ``tasks``, nothing else."""

from shardflow import own_packages_first as _own_packages_first

# A module of the same name earlier on the path (a ``tasks.py`` on PYTHONPATH: invoke's file) would
# take the place of shardflow's own package: the project comes first, as it does in the ranks
# (tasks.launch.job_environment).
_own_packages_first()
