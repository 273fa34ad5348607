"""A plan by its plan_id, for ``shardflow train --plan-id`` and ``train_flow``: from MLflow, or
from the outbox while MLflow is away."""

from __future__ import annotations

import re
from pathlib import Path

from rec.errors import InputError, Problem, show
from rec.hashing import HASH_CHARS
from rec.plan.io import PLAN_FILES
from tasks.outbox import Outbox
from tasks.tracking import Tracking, TrackingUnavailable, download_plan, open_read_only, tracking_failure

PLAN_ID = re.compile(f"[0-9a-f]{{{HASH_CHARS}}}")  # rec.hashing.content_hash's form


def plan_id_problems(plan_id: object, where: str = "plan_id") -> list[Problem]:
    """A plan_id names directories (out/<plan_id>/...) and MLflow searches: only its own form."""
    if isinstance(plan_id, str) and PLAN_ID.fullmatch(plan_id):
        return []
    return [Problem(f"{where} {show(plan_id)}", f"is not a plan_id ({HASH_CHARS} hex digits, as "
                                            "`shardflow show` and `shardflow compare` print them)")]


def check_plan_id(plan_id: object, where: str = "plan_id") -> None:
    problems = plan_id_problems(plan_id, where)
    if problems:
        raise InputError("Cannot look this plan up:", problems)


def fetch_plan(tracking: Tracking, plan_id: str, dest: str | Path) -> str:
    """plan.json of ``plan_id``: from its MLflow plan run, or from the outbox while MLflow is away
    (the record not yet delivered). InputError if neither has it, or if ``plan_id`` is none."""
    check_plan_id(plan_id)
    dest = Path(dest)
    reason = "MLflow has no finished plan run with this plan_id"
    try:  # read only: a lookup makes no store, experiment or lock file (a train --plan-id once made mlflow.db)
        client, experiment_id = open_read_only(tracking)
        path = None if experiment_id is None else download_plan(client, experiment_id, plan_id, dest)
        if path is not None:
            return str(path)
    except TrackingUnavailable as e:
        reason = f"MLflow cannot be used ({e})"
    except Exception as e:
        why = tracking_failure(e)
        if why is None:
            raise
        reason = f"MLflow cannot be used ({why})"
        for name in PLAN_FILES:  # nothing half-downloaded stays
            (dest / name).unlink(missing_ok=True)
    waiting = Outbox(tracking.outbox_dir).copy_plan(plan_id, dest)
    if waiting is not None:
        return str(waiting)
    raise InputError(f"Cannot find plan {plan_id}:", [
        Problem(tracking.uri, f"{reason}, experiment {tracking.experiment!r}"),
        Problem(tracking.outbox_dir, "no plan record with this plan_id waits in the outbox")])
