"""A plan by its plan_id, for ``shardflow train --plan-id`` and ``train_flow``: from MLflow, or
from the outbox while MLflow is away."""

from __future__ import annotations

from pathlib import Path

from rec.errors import InputError, Problem
from tasks.outbox import Outbox
from tasks.tracking import Tracking, TrackingUnavailable, connect, download_plan

PLAN_FILES = ("plan.json", "shards.parquet")


def fetch_plan(tracking: Tracking, plan_id: str, dest: str | Path) -> str:
    """plan.json of ``plan_id``: from its MLflow plan run, or from the outbox while MLflow is away
    (the record not yet delivered). InputError if neither has it."""
    dest = Path(dest)
    reason = "MLflow has no finished plan run with this plan_id"
    try:
        client, experiment_id = connect(tracking)
        path = download_plan(client, experiment_id, plan_id, dest)
        if path is not None:
            return str(path)
    except TrackingUnavailable as e:
        reason = f"MLflow cannot be reached ({e})"
    waiting = Outbox(tracking.outbox_dir).find_plan(plan_id)
    if waiting is not None:
        dest.mkdir(parents=True, exist_ok=True)
        for name in PLAN_FILES:
            if (waiting.parent / name).exists():
                (dest / name).write_bytes((waiting.parent / name).read_bytes())
        return str(dest / "plan.json")
    raise InputError(f"Cannot find plan {plan_id}:", [
        Problem(tracking.uri, f"{reason}, experiment {tracking.experiment!r}"),
        Problem(tracking.outbox_dir, "no plan record with this plan_id waits in the outbox")])
