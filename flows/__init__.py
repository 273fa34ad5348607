"""Prefect flows and the ``shardflow`` CLI: they compose ``rec`` and ``tasks``, nothing else."""
