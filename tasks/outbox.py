"""The outbox: records (and their artifact files) kept on local disk until MLflow takes them.

Every record goes through the outbox: it is written here first, then delivered, then removed.
If MLflow cannot be reached, it simply stays, and the next delivery (at the start of every flow,
or after the next record) sends it, in the order it was written, so a parent run normally reaches
MLflow before the runs nested under it. Nothing is lost while MLflow is away.

Each record keeps the tracking URI and experiment it was meant for, and goes there, whichever flow
delivers it: a record for a server that is down waits for that server, even while other flows of
the same state directory log to another store. (Entries written before destinations were kept
have none; they go wherever the next delivery goes.)

Records are delivered one by one: a record MLflow does not take, while the store itself works, is
tried again by the next delivery and, after ``MAX_ATTEMPTS``, set aside into ``set-aside/`` with
one warning naming it and the command that retries it (``shardflow outbox retry``). It never holds
up the others: a nested run whose parent waits goes in unlinked and is linked when the parent
arrives. A store that fails as a whole (``tasks.tracking.TrackingUnavailable``) costs no attempt:
its records wait for it.

Layout: ``OUTBOX/<ns-timestamp>-<key>/record.json``, ``to.json`` (the destination),
``attempts.json`` (failed attempts so far and the last reason) and the artifact files next to
them; ``OUTBOX/set-aside/<entry>/`` the same, for records set aside.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from rec.errors import InputError, Problem
from rec.plan.io import PLAN_FILE
from tasks.paths import DEFAULT_STATE_DIR, OUTBOX
from tasks.records import KEY, PLAN_ID, EndRecord, RunRecord, RunStep, dumps_record, loads_record
from tasks.tracking import (
    Tracking,
    TrackingUnavailable,
    connect,
    deliver,
    one_line,
    store_problem,
    tracking_failure,
)

log = logging.getLogger(__name__)
RECORD_FILE = "record.json"
DESTINATION_FILE = "to.json"
ATTEMPTS_FILE = "attempts.json"
SET_ASIDE = "set-aside"
MAX_ATTEMPTS = 3  # deliveries a record may fail, with its store working, before it is set aside


@dataclass(frozen=True)
class Delivery:
    """What one delivery did: run ids of the records it sent, and what still waits where."""

    run_ids: dict[str, str] = field(default_factory=dict)  # record key -> MLflow run id
    waiting: dict[str, int] = field(default_factory=dict)  # tracking URI -> records left for it
    errors: dict[str, str] = field(default_factory=dict)  # tracking URI -> why they wait, one line
    set_aside: tuple[str, ...] = ()  # entries set aside by this delivery

    @property
    def pending(self) -> int:
        return sum(self.waiting.values())

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors.values()) or None

    def pending_for(self, tracking: Tracking) -> int:
        return self.waiting.get(tracking.uri, 0)


@dataclass(frozen=True)
class Entry:
    """One record in the outbox, as ``shardflow outbox list`` shows it."""

    path: Path
    record: RunRecord | EndRecord | None  # None: the record file is damaged
    destination: Tracking | None  # None: none kept (goes where the next delivery goes)
    attempts: int
    last_error: str | None
    set_aside: bool

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def what(self) -> str:
        """``plan run plan-...``, ``end of run <key>``, or ``damaged record``."""
        if isinstance(self.record, RunRecord):
            return f"{self.record.step} run {self.record.name}"
        if isinstance(self.record, EndRecord):
            return f"end ({self.record.status}) of run record {self.record.key}"
        return "damaged record"


class Outbox:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def set_aside_dir(self) -> Path:
        return self.root / SET_ASIDE

    def put(self, record: RunRecord | EndRecord, files: Mapping[str, Path] | None = None,
            to: Tracking | None = None) -> Path:
        """Keep ``record``, meant for ``to``, and copies of ``files`` (artifact name -> path; a
        name may hold a directory, e.g. ``logs/rank-0.log``); atomic, so never half-written."""
        if not KEY.fullmatch(record.key):
            raise ValueError(f"record key {record.key!r} is not {KEY.pattern}")
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
        """Records waiting for delivery, oldest first (not those set aside)."""
        return _entries(self.root)

    def set_aside_entries(self) -> list[Path]:
        return _entries(self.set_aside_dir)

    def records(self) -> list[tuple[Path, RunRecord | EndRecord]]:
        """Waiting and set-aside records that can be read."""
        out = []
        for entry in self.entries() + self.set_aside_entries():
            try:
                out.append((entry, loads_record((entry / RECORD_FILE).read_text())))
            except (OSError, ValueError):
                continue
        return out

    def describe(self) -> list[Entry]:
        """Every entry, waiting then set aside, with what it holds and how often it failed."""
        out = []
        for entry in self.entries() + self.set_aside_entries():
            try:
                record: RunRecord | EndRecord | None = loads_record((entry / RECORD_FILE).read_text())
            except (OSError, ValueError):
                record = None
            try:
                to: Tracking | None = self._destination(entry)
            except (OSError, ValueError):
                to = None
            attempts, error = _attempts(entry)
            out.append(Entry(entry, record, to, attempts, error, entry.parent == self.set_aside_dir))
        return out

    def find_plan(self, plan_id: str) -> Path | None:
        """plan.json of a plan record still waiting (or set aside) here."""
        for entry, record in self.records():
            if isinstance(record, RunRecord) and record.step == RunStep.PLAN \
                    and record.tags.get(PLAN_ID) == plan_id and (entry / PLAN_FILE).exists():
                return entry / PLAN_FILE
        return None

    def destination(self, entry: Path, default: Tracking) -> Tracking:
        """Where ``entry`` is meant to go (``default`` for entries that do not say)."""
        return self._destination(entry) or default

    def _destination(self, entry: Path) -> Tracking | None:
        path = entry / DESTINATION_FILE
        if not path.exists():
            return None
        d = json.loads(path.read_text())
        if not isinstance(d, dict) or not isinstance(d.get("uri"), str) or not isinstance(d.get("experiment"), str):
            raise ValueError(f"{path} names no tracking URI and experiment")
        return Tracking(d["uri"], d["experiment"], str(self.root))

    def deliver(self, tracking: Tracking) -> Delivery:
        """Send every waiting record to where it was meant to go, in order, each on its own
        (``tracking``: entries without a destination)."""
        with self._lock():
            entries = self.entries()
            if not entries:
                return Delivery()
            by_destination: dict[Tracking, list[Path]] = {}
            set_aside: list[str] = []
            for entry in entries:
                try:
                    to = self.destination(entry, tracking)
                except (OSError, ValueError) as e:
                    self._set_aside(entry, f"damaged destination file: {one_line(e)}", set_aside)
                    continue
                by_destination.setdefault(to, []).append(entry)
            run_ids: dict[str, str] = {}
            waiting: dict[str, int] = {}
            errors: dict[str, str] = {}
            for to, queue in by_destination.items():
                left, error = self._deliver_to(to, queue, run_ids, set_aside)
                if left:
                    waiting[to.uri] = waiting.get(to.uri, 0) + left
                    errors[to.uri] = error or ""
            return Delivery(run_ids, waiting, errors, tuple(set_aside))

    def _deliver_to(self, to: Tracking, queue: list[Path], run_ids: dict[str, str],
                    set_aside: list[str]) -> tuple[int, str | None]:
        """Deliver ``queue`` to ``to``; (records left, why)."""
        try:
            client, experiment_id = connect(to)
        except TrackingUnavailable as e:
            _note(queue, str(e))
            return len(queue), unavailable(to, str(e))
        left, error = 0, None
        unsent: set[str] = set()  # run records of this queue that did not go (their ends wait)
        for i, entry in enumerate(queue):
            try:
                record = loads_record((entry / RECORD_FILE).read_text())
            except (OSError, ValueError) as e:
                self._set_aside(entry, f"damaged record: {one_line(e)}", set_aside)
                continue
            if isinstance(record, EndRecord):
                if _is_set_aside(self.set_aside_dir, record.key):
                    self._set_aside(entry, "its run record is set aside; they go together", set_aside)
                    continue
                if record.key in unsent:
                    left += 1
                    continue
            try:
                run_ids[record.key] = deliver(client, experiment_id, record, entry)
            except Exception as e:
                # An InputError: a value MLflow cannot be searched for (a record edited by hand).
                why = one_line(e) if isinstance(e, InputError) else tracking_failure(e)
                if why is None:
                    raise
                broken = store_problem(client, experiment_id, to.uri)
                if broken is not None:  # the store went away: everything left waits, no attempt counted
                    _note(queue[i:], broken)
                    return left + len(queue) - i, unavailable(to, broken)
                if isinstance(record, RunRecord):
                    unsent.add(record.key)
                if self._failed(entry, to, why, set_aside):
                    left, error = left + 1, f"MLflow at {to.uri} did not take the {_what(record)} ({why})"
                continue
            shutil.rmtree(entry)
        return left, error

    def _failed(self, entry: Path, to: Tracking, why: str, set_aside: list[str]) -> bool:
        """Count a failed attempt; True if the record still waits, False if it was set aside."""
        attempts = _attempts(entry)[0] + 1
        _write_attempts(entry, attempts, why)
        if attempts < MAX_ATTEMPTS:
            return True
        self._set_aside(entry, f"MLflow at {to.uri} did not take it {attempts} times: {why}", set_aside)
        return False

    def _set_aside(self, entry: Path, why: str, set_aside: list[str]) -> None:
        self.set_aside_dir.mkdir(parents=True, exist_ok=True)
        _write_attempts(entry, _attempts(entry)[0], why)
        os.replace(entry, self.set_aside_dir / entry.name)
        set_aside.append(entry.name)
        log.warning("outbox: record %s set aside in %s (%s); `%s` sends it again", entry.name,
                    self.set_aside_dir, why, retry_command(self.root, entry.name))

    def retry(self, names: Sequence[str] = ()) -> list[Path]:
        """Return set-aside entries (those named, by entry name or record key; all without names)
        to the queue with no attempts counted; InputError naming every name that is none."""
        with self._lock():
            aside = {p.name: p for p in self.set_aside_entries()}
            chosen: list[Path] = []
            problems = []
            for name in names:
                matches = [p for n, p in aside.items() if name in (n, n.partition("-")[2])]
                if not matches:
                    problems.append(Problem(repr(name), f"no record of this name or key is set aside in "
                                                        f"{self.set_aside_dir}"))
                chosen += [p for p in matches if p not in chosen]
            if problems:
                raise InputError("Cannot retry:", problems)
            if names:  # a run record and the end of its run go together
                keys = {p.name.partition("-")[2] for p in chosen}
                chosen = [p for n, p in aside.items() if n.partition("-")[2] in keys]
            moved = []
            for entry in (chosen if names else list(aside.values())):
                (entry / ATTEMPTS_FILE).unlink(missing_ok=True)
                os.replace(entry, self.root / entry.name)
                moved.append(self.root / entry.name)
            return moved

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


def _entries(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name != SET_ASIDE)


def _is_set_aside(folder: Path, key: str) -> bool:
    return any(p.name.endswith(f"-{key}") for p in _entries(folder))


def _attempts(entry: Path) -> tuple[int, str | None]:
    """(failed attempts, the last reason) of ``entry``; (0, None) if none was counted."""
    try:
        d = json.loads((entry / ATTEMPTS_FILE).read_text())
        return int(d["attempts"]), str(d.get("last_error") or "") or None
    except (OSError, ValueError, TypeError, KeyError):
        return 0, None


def _write_attempts(entry: Path, attempts: int, why: str) -> None:
    """attempts.json, atomically: the failed attempts counted and the last reason."""
    tmp = entry / f".{ATTEMPTS_FILE}.tmp"
    tmp.write_text(json.dumps({"attempts": attempts, "last_error": why,
                               "last_attempt": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1))
    os.replace(tmp, entry / ATTEMPTS_FILE)


def _note(entries: list[Path], why: str) -> None:
    """The reason their store was unavailable, for ``shardflow outbox list``; no attempt counted
    (a note only: a full disk does not stop the delivery for it)."""
    for entry in entries:
        with suppress(OSError):
            _write_attempts(entry, _attempts(entry)[0], why)


def _what(record: RunRecord | EndRecord) -> str:
    return f"{record.step} run" if isinstance(record, RunRecord) else "end of a run"


def retry_command(root: str | Path, entry: str | None = None) -> str:
    """The command that retries ``entry`` (every record without one) of the outbox at ``root``,
    as typed from the working directory."""
    flag = ""
    if Path(root).resolve() != Path(DEFAULT_STATE_DIR, OUTBOX).resolve():
        flag = f" --state-dir {Path(root).parent}"
    return f"shardflow outbox retry{flag}" + (f" {entry}" if entry else "")


def unavailable(to: Tracking, why: str) -> str:
    return f"MLflow unavailable at {to.uri} ({why})"


def kept_message(tracking: Tracking, pending: int, error: str | None) -> str:
    """The one line that says a command's records wait in the outbox, why (``Delivery.errors``),
    and what sends them."""
    return (f"{error or unavailable(tracking, 'not reached')}; {pending} record(s) kept in "
            f"{tracking.outbox_dir} — delivered by the next run, or `{retry_command(tracking.outbox_dir)}` "
            "to retry")
