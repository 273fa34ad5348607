"""One outbox entry, read without trusting it: whoever can write the outbox may have put anything
there (a link, a FIFO, a device, a huge file, an edited record, count or destination).

An entry must be a folder, not a link to one, named ``<ns-timestamp>-<record key>``. Its files are
read through ``rec.safe_read``: no link followed (nor a linked folder on an artifact's way), regular
files only, opened without blocking, never more than a limit. ``record.json`` must be a record of the
entry's key with every value of the type shardflow writes; ``to.json`` a destination that the user's
own ``--tracking-uri`` and ``--experiment`` checks accept (``TrackingSettings``); ``attempts.json`` a
count from 0 to ``MAX_ATTEMPTS``. Artifacts are copied, the same way, into a private folder, and
MLflow uploads that copy. Anything else is a ``BadEntry`` whose message names the problem in one
line: the outbox sets such an entry aside. A destination other than the delivering command's own is
used only if nothing has to be created for it (``foreign_store_problem``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from rec.documents import DocumentError, load_json
from rec.errors import InputError, show
from rec.safe_read import UnsafeFile, copy_file, open_file, open_folder, read_file
from tasks.records import EndRecord, RunRecord, loads_record
from tasks.tracking import Tracking, TrackingSettings, one_line, sqlite_path
from tasks.tracking.store import read_only, table_names

RECORD_FILE = "record.json"
DESTINATION_FILE = "to.json"
ATTEMPTS_FILE = "attempts.json"
ENTRY_NAME = re.compile(r"[0-9]{20}-([0-9a-f]{32})")  # Outbox.put's names: <time.time_ns()>-<record key>
MAX_ATTEMPTS = 3  # deliveries a record may fail, with its store working, before it is set aside
# A train record holds its per-iteration series (~120 bytes an iteration): 64 MiB is about 550,000
# iterations, and parsing it takes ~6 times its size in memory; anything larger is no record
# shardflow wrote for a training it could log.
MAX_RECORD_BYTES = 64 << 20
MAX_NOTE_BYTES = 64 << 10  # to.json, attempts.json
MAX_ARTIFACT_BYTES = 4 << 30  # plans, metrics and logs: far below; a disk image is refused
MAX_URI_CHARS = 4096
MAX_REASON_CHARS = 8192
MAX_MS = 2**63 - 1  # MLflow's timestamps and steps are 64-bit integers
MLFLOW_TABLES = ("experiments", "runs", "alembic_version")  # what tells an MLflow SQLite store


class BadEntry(ValueError):
    """An entry the outbox cannot trust; its message: the problem, in one line."""


@dataclass(frozen=True)
class Attempts:
    """attempts.json: deliveries that failed while the store worked, and the last reason."""

    count: int = 0
    last_error: str | None = None


def entry_key(entry: Path) -> str:
    """The record key in an entry's name; BadEntry for a name ``Outbox.put`` never gives."""
    match = ENTRY_NAME.fullmatch(entry.name)
    if match is None:
        raise BadEntry("the entry is not named <time>-<record key>, as shardflow names them")
    return match.group(1)


@contextmanager
def opened(entry: Path) -> Iterator[int]:
    """A descriptor of the entry's folder for the block; BadEntry if the entry is a link or no folder."""
    try:
        fd = open_folder(entry)
    except UnsafeFile as e:
        raise BadEntry(f"the entry {e.reason}") from None
    except OSError as e:
        raise BadEntry(f"the entry cannot be opened ({one_line(e)})") from None
    try:
        yield fd
    finally:
        os.close(fd)


def read_record(fd: int, entry: Path) -> RunRecord | EndRecord:
    """record.json of the entry (``fd``), a record of the key its name holds."""
    key = entry_key(entry)
    record = _loads_record(_text(fd, RECORD_FILE, MAX_RECORD_BYTES, required=True) or "")
    if record.key != key:
        raise BadEntry(f"{RECORD_FILE}: its key {record.key} is not the entry's, {key}")
    problem = _value_problem(record)
    if problem:
        raise BadEntry(f"{RECORD_FILE}: {problem}")
    return record


def read_destination(fd: int, outbox_dir: str | Path) -> Tracking | None:
    """to.json of the entry (``fd``): the tracking URI and experiment it is meant for, checked as the
    user's own flags are; None if it has none (entries written before destinations were kept)."""
    text = _text(fd, DESTINATION_FILE, MAX_NOTE_BYTES, required=False)
    if text is None:
        return None
    d = _json(text, DESTINATION_FILE)
    if not isinstance(d, dict) or set(d) != {"uri", "experiment"}:
        raise BadEntry(f"{DESTINATION_FILE}: not an object of a tracking \"uri\" and an \"experiment\"")
    uri, experiment = d["uri"], d["experiment"]
    if isinstance(uri, str) and not uri.strip():
        raise BadEntry(f"{DESTINATION_FILE}: the tracking URI is empty")
    if isinstance(uri, str) and len(uri) > MAX_URI_CHARS:
        raise BadEntry(f"{DESTINATION_FILE}: the tracking URI is longer than {MAX_URI_CHARS} characters")
    try:
        # the entry's own destination, not what this process's environment would give MLflow
        TrackingSettings(tracking_uri=uri, experiment=experiment, track=False)
    except InputError as e:
        raise BadEntry(f"{DESTINATION_FILE}: " + "; ".join(map(str, e.problems))) from None
    return Tracking(uri, experiment, str(outbox_dir))


def read_attempts(fd: int) -> Attempts:
    """attempts.json of the entry (``fd``); no attempts if there is none."""
    text = _text(fd, ATTEMPTS_FILE, MAX_NOTE_BYTES, required=False)
    if text is None:
        return Attempts()
    d = _json(text, ATTEMPTS_FILE)
    if not isinstance(d, dict) or "attempts" not in d or not set(d) <= {"attempts", "last_error", "last_attempt"}:
        raise BadEntry(f"{ATTEMPTS_FILE}: not an object of \"attempts\", \"last_error\" and \"last_attempt\"")
    count, why = d["attempts"], d.get("last_error")
    if type(count) is not int or not 0 <= count <= MAX_ATTEMPTS:
        raise BadEntry(f"{ATTEMPTS_FILE}: attempts {show(count)} is not a whole number from 0 to {MAX_ATTEMPTS}")
    if why is not None and (not isinstance(why, str) or len(why) > MAX_REASON_CHARS):
        raise BadEntry(f"{ATTEMPTS_FILE}: last_error is not text of at most {MAX_REASON_CHARS} characters")
    return Attempts(count, why or None)


def write_attempts(fd: int, attempts: Attempts) -> None:
    """attempts.json of the entry (``fd``), atomically, without following a link in the way."""
    text = json.dumps({"attempts": attempts.count, "last_error": (attempts.last_error or "")[:MAX_REASON_CHARS],
                       "last_attempt": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1)
    tmp = f".{ATTEMPTS_FILE}.tmp"
    with suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=fd)
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
    with os.fdopen(out, "w") as f:
        f.write(text)
    os.replace(tmp, ATTEMPTS_FILE, src_dir_fd=fd, dst_dir_fd=fd)


def foreign_store_problem(uri: str) -> str | None:
    """Why a record may not go to ``uri`` now, a store that is not the delivering command's own:
    none is created for it. A server goes as it is (it has its store); a SQLite file must already be
    an MLflow store; anything else waits for a command that logs there. None: it may go."""
    if uri.startswith(("http://", "https://")):
        return None
    hint = ("a delivery creates no store but its own command's: "
            f"`shardflow outbox retry --tracking-uri {shlex.quote(uri)}` sends it")
    db = sqlite_path(uri)
    if db is None:
        return f"not a server, nor the store this command logs to; {hint}"
    path = Path(str(db).partition("?")[0])
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would hang SQLite's open
            return f"{path} is not an MLflow store file; {hint}"
        with read_only(path) as con:
            tables = table_names(con)
    except FileNotFoundError:
        return f"no MLflow store at {path}; {hint}"
    except (OSError, sqlite3.Error) as e:
        return one_line(e)
    if not set(MLFLOW_TABLES) <= tables:
        return f"{path} is not an MLflow store; {hint}"
    return None


def forget_attempts(entry: Path) -> None:
    """Remove attempts.json of a folder entry (a link: nothing, and nothing it points at)."""
    with suppress(BadEntry, FileNotFoundError), opened(entry) as fd:
        os.unlink(ATTEMPTS_FILE, dir_fd=fd)


def check_artifacts(fd: int, names: Iterable[str]) -> None:
    """BadEntry if an artifact ``names`` of the entry (``fd``) could not be copied
    (``copy_artifacts``); the files are opened, not read."""
    for name in names:
        try:
            os.close(open_file(name, fd, MAX_ARTIFACT_BYTES))
        except FileNotFoundError:
            continue
        except UnsafeFile as e:
            raise BadEntry(f"artifact {show(name)}: {e.reason}") from None


def copy_artifacts(fd: int, names: Iterable[str], into: Path) -> None:
    """Copy the artifacts ``names`` of the entry (``fd``) that exist into ``into``, a folder the
    caller owns; BadEntry for one that is a link, lies on a linked folder's way, is no regular
    file or is too big. Writing the copy may raise OSError (a full disk): no fault of the entry."""
    for name in names:
        dest = into / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            copy_file(name, fd, MAX_ARTIFACT_BYTES, dest)
        except FileNotFoundError:
            dest.unlink(missing_ok=True)  # an artifact the run did not make (movement.parquet of a first plan)
        except UnsafeFile as e:
            raise BadEntry(f"artifact {show(name)}: {e.reason}") from None


def _text(fd: int, name: str, limit: int, required: bool) -> str | None:
    try:
        data = read_file(name, fd, limit)
    except FileNotFoundError:
        if required:
            raise BadEntry(f"{name} is missing") from None
        return None
    except UnsafeFile as e:
        raise BadEntry(str(e)) from None
    except OSError as e:
        raise BadEntry(f"{name} cannot be read ({one_line(e)})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadEntry(f"{name} is not UTF-8 text") from None


def _json(text: str, name: str) -> object:
    try:
        return load_json(text)
    except DocumentError as e:
        raise BadEntry(f"{name}: {e}") from None


def _loads_record(text: str) -> RunRecord | EndRecord:
    try:
        return loads_record(text)
    except ValueError as e:
        raise BadEntry(f"{RECORD_FILE}: {one_line(e)}") from None
    except RecursionError:  # nesting deeper than the parser goes
        raise BadEntry(f"{RECORD_FILE}: not a shardflow record (nested too deeply)") from None


def _value_problem(record: RunRecord | EndRecord) -> str | None:
    """What in ``record`` is not of the type shardflow writes (MLflow would choke on it mid-run)."""
    if not isinstance(record.status, str):
        return "status is not text"
    for field_name in ("tags", "params"):
        values = getattr(record, field_name)
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            return f"{field_name} is not an object of text values"
    if not isinstance(record.metrics, dict) or not all(_number(v) for v in record.metrics.values()):
        return "metrics is not an object of numbers"
    if isinstance(record, EndRecord):
        return None if _ms(record.end_ms) else "end_ms is not a time in milliseconds"
    if not isinstance(record.name, str):
        return "name is not text"
    if not _ms(record.start_ms) or not (record.end_ms is None or _ms(record.end_ms)):
        return "start_ms or end_ms is not a time in milliseconds"
    if not isinstance(record.unique_plan, bool):
        return "unique_plan is not true or false"
    if not isinstance(record.series, dict) or not all(
            isinstance(points, list) and all(isinstance(p, list) and len(p) == 2 and _ms(p[0]) and _number(p[1])
                                             for p in points) for points in record.series.values()):
        return "series is not an object of [step, value] lists"
    return None


def _ms(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_MS


def _number(value: object) -> bool:
    if type(value) is float:
        return True  # NaN and infinities included: MLflow keeps them
    return type(value) is int and abs(value) < 2**1023  # float() of it is finite
