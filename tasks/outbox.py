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

Nothing an entry holds is trusted (``tasks.outbox_entry``): a link, a FIFO, a file too big, an edited
record, count or destination sets the entry aside, with one line, and never holds up the others or
the work. A record goes only to the store it was written for, and creates none: a store other than
the delivering command's own must already exist (an MLflow SQLite file, or a server); until it does
the record waits for a command that logs there.

Layout: ``OUTBOX/<ns-timestamp>-<key>/record.json``, ``to.json`` (the destination),
``attempts.json`` (failed attempts so far and the last reason) and the artifact files next to
them; ``OUTBOX/set-aside/<entry>/`` the same, for records set aside.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rec.disk_full import writing
from rec.errors import InputError, Problem, printable
from rec.file_lock import file_lock
from rec.plan.io import PLAN_FILE, PLAN_FILES
from tasks.outbox_entry import (
    ATTEMPTS_FILE,
    DESTINATION_FILE,
    MAX_ATTEMPTS,
    RECORD_FILE,
    Attempts,
    BadEntry,
    check_artifacts,
    copy_artifacts,
    entry_key,
    foreign_store_problem,
    forget_attempts,
    opened,
    read_attempts,
    read_destination,
    read_record,
    write_attempts,
)
from tasks.paths import DEFAULT_STATE_DIR, OUTBOX
from tasks.records import KEY, PLAN_ID, EndRecord, RunRecord, RunStep, dumps_record
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
T = TypeVar("T")
SET_ASIDE = "set-aside"
LOCK_FILE = ".lock"
__all__ = ["ATTEMPTS_FILE", "DESTINATION_FILE", "MAX_ATTEMPTS", "RECORD_FILE", "Delivery", "Entry", "Outbox",
           "kept_message", "retry_command", "unavailable"]


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
    record: RunRecord | EndRecord | None  # None: the record cannot be trusted (``problem`` says why)
    destination: Tracking | None  # None: none kept (goes where the next delivery goes), or a bad one
    attempts: int
    last_error: str | None
    set_aside: bool
    problem: str | None = None  # why the entry cannot be trusted: it is (or will be) set aside

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
        with writing(self.root, named=True):  # a full disk names the outbox
            self.root.mkdir(parents=True, exist_ok=True)
            entry = self.root / f"{time.time_ns():020d}-{record.key}"
            tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
            try:
                for name, path in (files or {}).items():
                    if Path(path).is_file():
                        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(path, tmp / name)
                (tmp / RECORD_FILE).write_text(dumps_record(record))
                if to is not None:
                    (tmp / DESTINATION_FILE).write_text(json.dumps({"uri": to.uri, "experiment": to.experiment}))
                os.replace(tmp, entry)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return entry

    def entries(self) -> list[Path]:
        """Records waiting for delivery, oldest first (not those set aside): every name in the
        outbox but hidden ones and ``set-aside``, whatever it is (a link or a file is a bad entry)."""
        return _entries(self.root)

    def set_aside_entries(self) -> list[Path]:
        return _entries(self.set_aside_dir)

    def describe(self) -> list[Entry]:
        """Every entry, waiting then set aside, with what it holds, how often it failed, and why it
        cannot be trusted if it cannot."""
        described = [self._inspect(entry) for entry in self.entries() + self.set_aside_entries()]
        return [e for e in described if e.problem is None or os.path.lexists(e.path)]  # not those delivered meanwhile

    def _inspect(self, entry: Path) -> Entry:
        record: RunRecord | EndRecord | None = None
        to: Tracking | None = None
        attempts: Attempts | None = None
        problems: list[str] = []
        try:
            with opened(entry) as fd:
                attempts = _checked(lambda: read_attempts(fd), problems)
                to = _checked(lambda: read_destination(fd, self.root), problems)
                record = _checked(lambda: read_record(fd, entry), problems)
                if isinstance(record, RunRecord):
                    _checked(lambda: check_artifacts(fd, record.artifacts), problems)
        except BadEntry as e:
            problems.append(str(e))
        attempts = attempts or Attempts()
        return Entry(entry, record, to, attempts.count, attempts.last_error, entry.parent == self.set_aside_dir,
                     "; ".join(problems) or None)

    def copy_plan(self, plan_id: str, dest: Path) -> Path | None:
        """plan.json (and shards.parquet) of a plan record still waiting (or set aside) here, copied
        into ``dest`` as the outbox reads everything (no link followed); None if none is here."""
        for entry in self.entries() + self.set_aside_entries():
            try:
                with opened(entry) as fd:
                    record = read_record(fd, entry)
                    if not (isinstance(record, RunRecord) and record.step == RunStep.PLAN
                            and record.tags.get(PLAN_ID) == plan_id):
                        continue
                    with tempfile.TemporaryDirectory(prefix="shardflow-outbox-") as files:
                        copy_artifacts(fd, PLAN_FILES, Path(files))
                        if not (Path(files) / PLAN_FILE).is_file():
                            continue
                        dest.mkdir(parents=True, exist_ok=True)
                        for name in PLAN_FILES:
                            if (Path(files) / name).is_file():
                                shutil.copyfile(Path(files) / name, dest / name)
                        return dest / PLAN_FILE
            except BadEntry:
                continue
        return None

    def destination(self, entry: Path, default: Tracking) -> Tracking:
        """Where ``entry`` is meant to go (``default`` for entries that do not say); BadEntry if
        that cannot be trusted."""
        with opened(entry) as fd:
            return read_destination(fd, self.root) or default

    def deliver(self, tracking: Tracking) -> Delivery:
        """Send every waiting record to where it was meant to go, in order, each on its own
        (``tracking``: the delivering command's own store, which entries without a destination go
        to; a store for no other destination is created). An entry that cannot be trusted is set
        aside, never raised."""
        with self._lock():
            entries = self.entries()
            if not entries:
                return Delivery()
            by_destination: dict[Tracking, list[Path]] = {}
            set_aside: list[str] = []
            for entry in entries:
                try:
                    entry_key(entry)
                    with opened(entry) as fd:
                        read_attempts(fd)  # a count that cannot be believed: aside before anything goes
                        to = read_destination(fd, self.root) or tracking
                except BadEntry as e:
                    self._set_aside(entry, str(e), set_aside)
                    continue
                by_destination.setdefault(to, []).append(entry)
            run_ids: dict[str, str] = {}
            waiting: dict[str, int] = {}
            errors: dict[str, str] = {}
            for to, queue in by_destination.items():
                try:
                    left, error = self._deliver_to(to, queue, run_ids, set_aside, own=to.uri == tracking.uri)
                except Exception as e:  # the work is done: a failure nobody foresaw must not fail it now
                    left, error = self._stopped(to, queue, e)
                if left:
                    waiting[to.uri] = waiting.get(to.uri, 0) + left
                    errors[to.uri] = error or ""
            return Delivery(run_ids, waiting, errors, tuple(set_aside))

    def _deliver_to(self, to: Tracking, queue: list[Path], run_ids: dict[str, str],
                    set_aside: list[str], own: bool) -> tuple[int, str | None]:
        """Deliver ``queue`` to ``to`` (``own``: the delivering command's store, which may be
        created); (records left, why)."""
        missing = None if own else foreign_store_problem(to.uri)
        if missing is not None:
            _note(queue, missing)
            return len(queue), unavailable(to, missing)
        try:
            client, experiment_id = connect(to)
        except TrackingUnavailable as e:
            _note(queue, str(e))
            return len(queue), unavailable(to, str(e))
        left, error = 0, None
        unsent: set[str] = set()  # run records of this queue that did not go (their ends wait)
        for i, entry in enumerate(queue):
            with tempfile.TemporaryDirectory(prefix="shardflow-outbox-") as staged:
                files = Path(staged)  # a private copy: what MLflow uploads is what was checked
                try:
                    with opened(entry) as fd:
                        record = read_record(fd, entry)
                        if isinstance(record, EndRecord):
                            if _is_set_aside(self.set_aside_dir, record.key):
                                raise BadEntry("its run record is set aside; they go together")
                            if record.key in unsent:
                                left += 1
                                continue
                        else:
                            copy_artifacts(fd, record.artifacts, files)
                except BadEntry as e:
                    self._set_aside(entry, str(e), set_aside)
                    continue
                except OSError as e:  # the private copy cannot be written (a full disk): try again later
                    if self._failed(entry, to, f"its artifacts cannot be copied for upload: {one_line(e)}",
                                    set_aside):
                        left, error = left + 1, f"the {_what(record)} could not be prepared ({one_line(e)})"
                    continue
                try:
                    run_ids[record.key] = deliver(client, experiment_id, record, files)
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
            self._remove(entry)
        return left, error

    def _stopped(self, to: Tracking, queue: list[Path], e: Exception) -> tuple[int, str]:
        """A delivery to ``to`` that failed for a reason none of the checks foresaw (e.g. an MLflow
        setting in the environment that MLflow reads only then): what is left of ``queue`` waits,
        with the reason in one line, no attempt counted; (records left, why)."""
        why = f"the delivery failed: {type(e).__name__}: {one_line(e)}"
        log.debug("outbox: delivery to %s failed", printable(to.uri), exc_info=True)
        left = [entry for entry in queue if os.path.lexists(entry)]
        _note(left, why)
        return len(left), unavailable(to, why)

    def _remove(self, entry: Path) -> None:
        """A delivered entry goes. If it cannot (it was swapped for a link meanwhile: rmtree follows
        none), the record is delivered again next time, which MLflow takes once (its record key)."""
        try:
            shutil.rmtree(entry)
        except OSError as e:
            log.warning("outbox: record %s was delivered but cannot be removed (%s)", printable(entry.name),
                        one_line(e))

    def _failed(self, entry: Path, to: Tracking, why: str, set_aside: list[str]) -> bool:
        """Count a failed attempt; True if the record still waits, False if it was set aside."""
        try:
            with opened(entry) as fd:
                attempts = read_attempts(fd).count + 1
                write_attempts(fd, Attempts(attempts, why))
        except (BadEntry, OSError) as e:
            self._set_aside(entry, f"its failed attempt cannot be counted ({one_line(e)}): {why}", set_aside)
            return False
        if attempts < MAX_ATTEMPTS:
            return True
        self._set_aside(entry, f"MLflow at {to.uri} did not take it {attempts} times: {why}", set_aside)
        return False

    def _set_aside(self, entry: Path, why: str, set_aside: list[str]) -> None:
        """Move ``entry`` (a link: the link itself, never what it points at) into set-aside/ with
        ``why``, in one warning; a failure to move it is one warning too, and holds nothing up."""
        why = printable(why)
        try:
            self._set_aside_folder()
            with suppress(BadEntry, OSError), opened(entry) as fd:  # a folder: keep why, for `outbox list`
                try:
                    count = read_attempts(fd).count
                except BadEntry:
                    count = 0
                write_attempts(fd, Attempts(count, why))
            os.replace(entry, self.set_aside_dir / entry.name)
        except OSError as e:
            log.warning("outbox: record %s cannot be set aside (%s: %s); it stays where it is, undelivered",
                        printable(entry.name), why, one_line(e))
            return
        set_aside.append(entry.name)
        log.warning("outbox: record %s set aside in %s (%s); `%s` sends it again", printable(entry.name),
                    self.set_aside_dir, why, retry_command(self.root, entry.name))

    def _set_aside_folder(self) -> None:
        """set-aside/ as a folder of the outbox: anything else by that name (a link to elsewhere)
        is moved out of the way, into the queue, where it is a bad entry."""
        try:
            mode = os.lstat(self.set_aside_dir).st_mode
        except FileNotFoundError:
            self.set_aside_dir.mkdir(parents=True, exist_ok=True)
            return
        if not stat.S_ISDIR(mode):
            os.replace(self.set_aside_dir, self.root / f"{time.time_ns():020d}-{SET_ASIDE}")
            self.set_aside_dir.mkdir()

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
                forget_attempts(entry)
                try:
                    os.replace(entry, self.root / entry.name)
                except OSError as e:  # one entry that cannot move holds none of the others back
                    log.warning("outbox: record %s cannot return to the queue (%s)", printable(entry.name),
                                one_line(e))
                    continue
                moved.append(self.root / entry.name)
            return moved

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """One deliverer at a time (served deployments may run flows side by side)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.root / LOCK_FILE):
            yield


def _checked(read: Callable[[], T], problems: list[str]) -> T | None:
    """What ``read`` returns, or None with its problem added to ``problems``."""
    try:
        return read()
    except BadEntry as e:
        problems.append(str(e))
        return None


def _entries(folder: Path) -> list[Path]:
    """Every name in ``folder`` but hidden ones and set-aside/, sorted; none if ``folder`` is no
    folder (a link to one is not listed through)."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(folder / n for n in names if not n.startswith(".") and n != SET_ASIDE)


def _is_set_aside(folder: Path, key: str) -> bool:
    return any(p.name.endswith(f"-{key}") for p in _entries(folder))


def _note(entries: list[Path], why: str) -> None:
    """The reason their store was unavailable, for ``shardflow outbox list``; no attempt counted
    (a note only: a full disk, or an entry that cannot be trusted, does not stop the delivery)."""
    for entry in entries:
        with suppress(OSError, BadEntry), opened(entry) as fd:
            write_attempts(fd, Attempts(read_attempts(fd).count, why))


def _what(record: RunRecord | EndRecord) -> str:
    return f"{record.step} run" if isinstance(record, RunRecord) else "end of a run"


def retry_command(root: str | Path, entry: str | None = None, verb: str = "retry") -> str:
    """The command that retries ``entry`` (every record without one) of the outbox at ``root``,
    as typed from the working directory; ``verb`` ``list``: the one that lists them."""
    flag = ""
    if Path(root).resolve() != Path(DEFAULT_STATE_DIR, OUTBOX).resolve():
        flag = f" --state-dir {shlex.quote(str(Path(root).parent))}"
    return f"shardflow outbox {verb}{flag}" + (f" {shlex.quote(printable(entry))}" if entry else "")


def unavailable(to: Tracking, why: str) -> str:
    return f"MLflow unavailable at {printable(to.uri)} ({why})"


def kept_message(tracking: Tracking, pending: int, error: str | None, lost: str | None = None) -> str:
    """The one line that says a command's records wait in the outbox, why (``Delivery.errors``),
    and what sends them; or, ``lost``, why its record could not be kept."""
    if lost:
        return f"MLflow record not kept: {lost}; the command's own outputs are written"
    return (f"{error or unavailable(tracking, 'not reached')}; {pending} record(s) kept in "
            f"{tracking.outbox_dir} — delivered by the next run, or `{retry_command(tracking.outbox_dir)}` "
            "to retry")
