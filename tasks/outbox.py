"""The outbox: records (and their artifact files) kept on local disk until MLflow takes them.

Every record goes through the outbox: it is written here first, then delivered, then removed.
If MLflow cannot be reached, it simply stays, and the next delivery (at the start of every flow,
or after the next record) sends it, in the order it was written, so a parent run always reaches
MLflow before the runs nested under it. Nothing is lost while MLflow is away.

Layout: ``OUTBOX/<ns-timestamp>-<key>/record.json`` plus the artifact files next to it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tasks.records import PLAN_ID, EndRecord, RunRecord, dumps_record, loads_record
from tasks.tracking import Tracking, TrackingUnavailable, connect, deliver

log = logging.getLogger(__name__)
RECORD_FILE = "record.json"


@dataclass(frozen=True)
class Delivery:
    """What one delivery did: run ids of the records it sent, and how many still wait."""

    run_ids: dict[str, str] = field(default_factory=dict)  # record key -> MLflow run id
    pending: int = 0
    error: str | None = None  # why delivery stopped, when it did


class Outbox:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def put(self, record: RunRecord | EndRecord, files: Mapping[str, Path] | None = None) -> Path:
        """Keep ``record`` and copies of ``files`` (name -> path); atomic, so never half-written."""
        self.root.mkdir(parents=True, exist_ok=True)
        entry = self.root / f"{time.time_ns():020d}-{record.key}"
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        for name, path in (files or {}).items():
            if Path(path).exists():
                shutil.copyfile(path, tmp / name)
        (tmp / RECORD_FILE).write_text(dumps_record(record))
        os.replace(tmp, entry)
        return entry

    def entries(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def records(self) -> list[tuple[Path, RunRecord | EndRecord]]:
        return [(e, loads_record((e / RECORD_FILE).read_text())) for e in self.entries()]

    def find_plan(self, plan_id: str) -> Path | None:
        """plan.json of a plan record still waiting here."""
        for entry, record in self.records():
            if isinstance(record, RunRecord) and record.step == "plan" \
                    and record.tags.get(PLAN_ID) == plan_id and (entry / "plan.json").exists():
                return entry / "plan.json"
        return None

    def deliver(self, tracking: Tracking) -> Delivery:
        """Send every waiting record in order; stop at the first that MLflow does not take."""
        with self._lock():
            entries = self.entries()
            if not entries:
                return Delivery()
            from mlflow.exceptions import MlflowException

            try:
                client, experiment_id = connect(tracking)
            except TrackingUnavailable as e:
                return Delivery(pending=len(entries), error=str(e))
            run_ids: dict[str, str] = {}
            for i, entry in enumerate(entries):
                record = loads_record((entry / RECORD_FILE).read_text())
                try:
                    run_ids[record.key] = deliver(client, experiment_id, record, entry)
                except (MlflowException, OSError, LookupError) as e:
                    log.warning("MLflow did not take %s (%s); it stays in %s", entry.name, e, self.root)
                    return Delivery(run_ids, len(entries) - i, f"{tracking.uri}: {e}")
                shutil.rmtree(entry)
            return Delivery(run_ids)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """One deliverer at a time (served deployments may run flows side by side)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
