"""Recording runs without Prefect: each record goes to the outbox first, then everything waiting
is delivered. The Prefect tasks in ``tasks.mlflow_log`` and ``shardflow train`` both use this."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rec import progress
from rec.disk_full import DiskFull
from rec.train.rank_log import log_dir
from tasks import records
from tasks.outbox import Outbox
from tasks.records import EndRecord, RunRecord
from tasks.tracking import Tracking
from tasks.train import Trained, TrainSettings

if TYPE_CHECKING:
    from rec.plan import Plan
    from tasks.ingest import Inputs


@dataclass(frozen=True)
class Logged:
    """A record and, once MLflow has it, its run id (None while it waits in the outbox)."""

    key: str
    run_id: str | None
    pending: int  # records still waiting in the outbox for this record's destination
    error: str | None = None  # why they wait
    lost: str | None = None  # why this record could not even be kept in the outbox (``kept``)

    @property
    def unrecorded(self) -> bool:
        """MLflow has not got it: it waits in the outbox, or was lost."""
        return self.run_id is None


def record(tracking: Tracking, record: RunRecord | EndRecord, files: dict[str, Path] | None = None) -> Logged:
    """Put ``record`` (with its artifact ``files``) in the outbox for ``tracking``, then deliver. An
    outbox on a full disk loses the record (``Logged.lost``) and fails nothing: MLflow trouble never
    fails a command's work."""
    outbox = Outbox(tracking.outbox_dir)
    with progress.step("mlflow", f"recording the {getattr(record, 'step', 'finished')} run") as ending:
        lost = kept(outbox, tracking, record, files)
        if lost:
            ending.said = "not kept"
            return Logged(record.key, None, 0, None, lost)
        delivery = outbox.deliver(tracking)
        if record.key not in delivery.run_ids:  # the line after the work says why
            ending.said = "kept in the outbox"
    return Logged(record.key, delivery.run_ids.get(record.key), delivery.pending_for(tracking),
                  delivery.errors.get(tracking.uri))


def kept(outbox: Outbox, tracking: Tracking, record: RunRecord | EndRecord,
         files: Mapping[str, Path] | None = None) -> str | None:
    """Put ``record`` in ``outbox`` for ``tracking``; why it could not be kept (None: kept). A full
    disk, a read-only filesystem, a folder in the way: none of them fails the work."""
    try:
        outbox.put(record, files, to=tracking)
    except DiskFull as e:
        return str(e)
    except OSError as e:
        return f"cannot write {tracking.outbox_dir}: {e.strerror or e}"
    return None


def queue_plan(tracking: Tracking, plan: Plan, plan_path: str, inputs: Inputs,
               planning_s: float | None = None) -> str | None:
    """A plan run with params, metrics and the plan's files (none if MLflow already has a finished
    run of this plan_id), put in the outbox for ``tracking`` and not delivered: the next command
    that records delivers it (``replan`` before it looks for the last planning). What ``shardflow
    plan`` records without importing MLflow, which would take it seconds. Returns why it could not
    be kept (``kept``; None: queued)."""
    rec = records.plan_record(plan, inputs, planning_s=planning_s)
    plan_dir = Path(plan_path).parent
    return kept(Outbox(tracking.outbox_dir), tracking, rec, {name: plan_dir / name for name in rec.artifacts})


def record_training(tracking: Tracking, trained: Trained, parent_key: str | None = None,
                    tags: dict[str, str] | None = None, inputs: Inputs | None = None) -> Logged:
    """A train run: latency percentiles beside the plan's predicted critical path, samples/s,
    loss, the per-iteration series, and the plan's params (``inputs``: the spec's and topology's names)."""
    rec = records.train_record(trained, parent_key, tags, inputs)
    out = Path(trained.out_dir)
    return record(tracking, rec, {name: out / name for name in rec.artifacts})


def record_failed_training(tracking: Tracking, plan_id: str, settings: TrainSettings, out_dir: str,
                           error: str | BaseException, attempts: int, started_ms: int,
                           parent_key: str | None = None, tags: dict[str, str] | None = None,
                           plan_path: str = "") -> Logged:
    """A FAILED train run with the cause (``shardflow.error``), the logs under ``logs/`` and the
    params and tags of the plan at ``plan_path`` it trained with."""
    logs = {f"logs/{p.name}": p for p in sorted(log_dir(out_dir).glob("*.log"))}
    rec = records.failed_train_record(plan_id, settings, records.error_tag(error), attempts, started_ms,
                                      tuple(logs), parent_key, tags, plan_path)
    return record(tracking, rec, logs)
