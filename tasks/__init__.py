"""Thin adapters from ``rec`` to Ray, MLflow, Prefect tasks and subprocess launches."""
