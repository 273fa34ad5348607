"""The outbox: records (and their artifact files) kept on local disk until MLflow takes them.

Every record goes through the outbox: it is written here first, then delivered, then removed.
If MLflow cannot be reached, it simply stays, and the next delivery (at the start of every flow,
or after the next record) sends it, in the order it was written, so a parent run always reaches
MLflow before the runs nested under it. Nothing is lost while MLflow is away.

Each record keeps the tracking URI and experiment it was meant for, and goes there, whichever flow
delivers it: a record for a server that is down waits for that server, even while other flows of
the same state directory log to another store. (Entries written before destinations were kept
have none; they go wherever the next delivery goes.)

Layout: ``OUTBOX/<ns-timestamp>-<key>/record.json``, ``to.json`` (the destination) and the
artifact files next to them.
"""

from __future__ import annotations

import fcntl
import json
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
DESTINATION_FILE = "to.json"


@dataclass(frozen=True)
class Delivery:
    """What one delivery did: run ids of the records it sent, and what still waits where."""

    run_ids: dict[str, str] = field(default_factory=dict)  # record key -> MLflow run id
    waiting: dict[str, int] = field(default_factory=dict)  # tracking URI -> records left for it
    errors: dict[str, str] = field(default_factory=dict)  # tracking URI -> why delivery stopped

    @property
    def pending(self) -> int:
        return sum(self.waiting.values())

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors.values()) or None

    def pending_for(self, tracking: Tracking) -> int:
        return self.waiting.get(tracking.uri, 0)


class Outbox:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def put(self, record: RunRecord | EndRecord, files: Mapping[str, Path] | None = None,
            to: Tracking | None = None) -> Path:
        """Keep ``record``, meant for ``to``, and copies of ``files`` (artifact name -> path; a
        name may hold a directory, e.g. ``logs/rank-0.log``); atomic, so never half-written."""
        self.root.mkdir(parents=True, exist_ok=True)
        entry = self.root / f"{time.time_ns():020d}-{record.key}"
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        for name, path in (files or {}).items():
            if Path(path).is_file():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, tmp / name)
        (tmp / RECORD_FILE).write_text(dumps_record(record))
        if to is not None:
            (tmp / DESTINATION_FILE).write_text(json.dumps({"uri": to.uri, "experiment": to.experiment}))
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

    def destination(self, entry: Path, default: Tracking) -> Tracking:
        """Where ``entry`` is meant to go (``default`` for entries that do not say)."""
        path = entry / DESTINATION_FILE
        if not path.exists():
            return default
        d = json.loads(path.read_text())
        return Tracking(d["uri"], d["experiment"], default.outbox_dir)

    def deliver(self, tracking: Tracking) -> Delivery:
        """Send every waiting record to where it was meant to go, in order; for each destination,
        stop at the first record that MLflow does not take (``tracking``: entries without one)."""
        with self._lock():
            entries = self.entries()
            if not entries:
                return Delivery()
            by_destination: dict[Tracking, list[Path]] = {}
            for entry in entries:
                by_destination.setdefault(self.destination(entry, tracking), []).append(entry)
            run_ids: dict[str, str] = {}
            waiting: dict[str, int] = {}
            errors: dict[str, str] = {}
            for to, queue in by_destination.items():
                left, error = self._deliver_to(to, queue, run_ids)
                if left:
                    waiting[to.uri] = waiting.get(to.uri, 0) + left
                    errors[to.uri] = error or ""
            return Delivery(run_ids, waiting, errors)

    def _deliver_to(self, to: Tracking, queue: list[Path], run_ids: dict[str, str]) -> tuple[int, str | None]:
        """Deliver ``queue`` to ``to``; (records left, why)."""
        from mlflow.exceptions import MlflowException

        try:
            client, experiment_id = connect(to)
        except TrackingUnavailable as e:
            return len(queue), str(e)
        for i, entry in enumerate(queue):
            record = loads_record((entry / RECORD_FILE).read_text())
            try:
                run_ids[record.key] = deliver(client, experiment_id, record, entry)
            except (MlflowException, OSError, LookupError) as e:
                log.warning("MLflow did not take %s (%s); it stays in %s", entry.name, e, self.root)
                return len(queue) - i, f"{to.uri}: {e}"
            shutil.rmtree(entry)
        return 0, None

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
