"""A checkpoint directory belongs to one run at a time, and every checkpoint names the run that wrote it.

A run is one launch of a training (``Run``: an id, its output directory, its launcher's pid and
host). The launcher holds the run's checkpoint directory as it holds ``--out`` (``tasks.run_dirs``):
the lock file ``.shardflow-checkpoints-node<K>.lock`` in it is taken exclusively (no process of
another run holds it), then shared, and every rank takes it shared too (``CHECKPOINT_LOCK_ENV``,
``rec.train.lifetime.join_run_lock``), so a second run is refused while any process of this one
lives; the lock of a run whose processes all died is free again (``flock``). The lock file names
its holder. Rank 0 writes the run into every checkpoint it writes (``step_<N>/run.json``) before
``LATEST`` names it: a resume says whose checkpoint it continues.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from rec.disk_full import write_whole
from rec.documents import DocumentError, load_json
from rec.errors import InputError, Problem, printable
from rec.file_lock import holding_directory, process_alive

if TYPE_CHECKING:
    from rec.train.config import TrainConfig

RUN_FILE = "run.json"  # in each checkpoint's step directory: the run that wrote it
RUN_FORMAT = 1
RUN_ENV = "SHARDFLOW_RUN"  # the launcher's run, as JSON, for its ranks
CHECKPOINT_LOCK = ".shardflow-checkpoints-node{node}.lock"  # the nodes of one training may share the directory
CHECKPOINT_LOCK_ENV = "SHARDFLOW_CHECKPOINT_LOCK"  # the lock file the ranks hold shared; unset: no lock
MAX_RUN_BYTES = 64 << 10  # of a run.json or a lock file's holder: far above what shardflow writes
MAX_TEXT = 4096  # characters of one value of a run (a path, a host name)
MAX_PID = (1 << 31) - 1


@dataclass(frozen=True)
class Run:
    """One launch of a training: who holds a checkpoint directory, who wrote a checkpoint."""

    run_id: str  # <UTC time>-<random>, new for every launch
    out_dir: str  # its output directory, absolute, links resolved (as the kernel resolves lnk/../T)
    pid: int  # its launcher (the rank itself when the job runs without shardflow's launcher)
    host: str
    started: str  # UTC, ISO 8601

    @classmethod
    def new(cls, out_dir: str | Path, pid: int | None = None, run_id: str | None = None) -> Run:
        """A new run writing into ``out_dir``, launched by ``pid`` (this process)."""
        now = time.gmtime()
        return cls(run_id or f"{time.strftime('%Y%m%d-%H%M%S', now)}-{secrets.token_hex(3)}",
                   os.path.realpath(out_dir), os.getpid() if pid is None else pid, socket.gethostname(),
                   time.strftime("%Y-%m-%dT%H:%M:%SZ", now))

    def to_json(self) -> str:
        return json.dumps({"format": RUN_FORMAT, **asdict(self)})

    def same_output(self, other: Run) -> bool:
        """Whether ``other`` wrote into this run's output directory: a run that resumes its own
        training (``--resume`` with the same ``--out``, a restart) continues its own checkpoints."""
        return os.path.realpath(self.out_dir) == os.path.realpath(other.out_dir)

    def describe(self) -> str:
        return (f"run {self.run_id} (--out {printable(self.out_dir)}, pid {self.pid} on {self.host}, started "
                f"{self.started})")


def this_run(out_dir: str | Path) -> Run:
    """In a rank: the run its launcher passed (``RUN_ENV``), or one made of what the rank knows
    when the job runs under a plain torchrun (its rendezvous id, this process)."""
    passed = os.environ.get(RUN_ENV)
    if passed:
        return parse_run(passed, RUN_ENV)
    return Run.new(out_dir, run_id=os.environ.get("TORCHELASTIC_RUN_ID") or None)


def parse_run(text: str, source: str) -> Run:
    """The run ``text`` (a run.json) describes; InputError naming every problem of one shardflow did not write."""
    from rec.validation import Problems, integer, known_keys, required

    problems = Problems(source)
    try:
        record = load_json(text)
    except DocumentError as e:
        raise InputError(f"Cannot read {source}:", [Problem(source, str(e))]) from None
    names = [f.name for f in fields(Run)]
    title = f"Cannot read the run {source} names:"
    if not isinstance(record, dict) or record.get("format") != RUN_FORMAT:
        raise InputError(title, [Problem("format", f"expected {RUN_FORMAT}")])
    known_keys(record, ["format", *names], problems)
    required(record, names, problems)
    values = {key: problems.take_from(record, key, _path if key == "out_dir" else _text)
              for key in ("run_id", "out_dir", "host", "started")}
    pid = problems.take_from(record, "pid", lambda v: integer(v, minimum=1, maximum=MAX_PID))
    problems.raise_if_any(title)
    return Run(pid=int(pid or 0), **{key: str(value) for key, value in values.items()})


def _text(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT or not value.isprintable():
        raise ValueError(f"expected printable text of 1 to {MAX_TEXT} characters")
    return value


def _path(value: object) -> str:
    """A path: any characters but control characters (a Japanese file name's ideographic space, a
    no-break space, a zero-width space are a path's own), shown escaped (``describe``)."""
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT or control_character(value):
        raise ValueError(f"expected a path of 1 to {MAX_TEXT} characters without control characters")
    return value


def control_character(text: str) -> str | None:
    """The first control character in ``text`` (a tab, a newline, a terminal escape), if any."""
    return next((c for c in text if unicodedata.category(c) == "Cc"), None)


def record_writer(step: str | Path, run: Run) -> None:
    """Write ``run`` into the checkpoint directory ``step`` as the run that wrote it (rank 0)."""
    write_whole(Path(step) / RUN_FILE, run.to_json() + "\n")


def writer_of(step: str | Path) -> Run | None:
    """The run that wrote the checkpoint in ``step``; None for a checkpoint written before shardflow
    recorded it; InputError for a file it did not write."""
    from rec.input_files import read_text

    path = Path(step) / RUN_FILE
    if not path.is_file():
        return None
    return parse_run(read_text(path, "the run that wrote a checkpoint", MAX_RUN_BYTES), str(path))


def another_runs(step: str | Path, run: Run) -> Run | None:
    """The run that wrote the checkpoint in ``step`` when it is not ``run``'s own training (another
    output directory); None when it is, or the checkpoint does not say."""
    writer = writer_of(step)
    return None if writer is None or run.same_output(writer) else writer


def newest_own(directory: str | Path, out_dir: str | Path) -> int | None:
    """The step ``directory``'s LATEST names when the training writing into ``out_dir`` wrote it
    (or the checkpoint does not say); None otherwise: what a stopped run may point its user at."""
    from rec.train.resume import latest, step_dir

    step = latest(directory)
    if step is None or another_runs(step_dir(directory, step), Run.new(out_dir)) is not None:
        return None
    return step


def own_checkpoint(config: TrainConfig, out_dir: str | Path) -> str | None:
    """The newest complete checkpoint the training writing into ``out_dir`` wrote (its step
    directory), None when there is none or another run wrote the newest one: where a stopped
    training goes on from."""
    from rec.train.resume import checkpoint_dir, step_dir

    directory = checkpoint_dir(config, out_dir)
    try:
        step = newest_own(directory, out_dir) if directory else None
    except InputError:  # an unreadable LATEST: nothing to point at
        return None
    return str(step_dir(directory, step)) if directory and step is not None else None


@contextmanager
def holding(directory: str | Path, run: Run, node_rank: int = 0) -> Iterator[dict[str, str]]:
    """Hold the checkpoint directory ``directory`` for ``run`` (on this node) for the block; InputError
    at once, naming the holder, if any process of another run holds it. Yields the environment that
    passes the run and the lock to the ranks, who hold it too (``rec.train.lifetime.join_run_lock``)."""
    def refused(text: str) -> InputError:
        return InputError(f"{directory} is in use by another shardflow run:", [Problem(
            str(directory), f"its checkpoints are held by {_holder(text)}; wait for it to finish, or give this "
                            "run another --checkpoint-dir")])

    with holding_directory(directory, CHECKPOINT_LOCK.format(node=node_rank), run.to_json() + "\n", refused,
                           MAX_RUN_BYTES) as lock:
        yield {RUN_ENV: run.to_json(), CHECKPOINT_LOCK_ENV: str(lock.resolve())}


def _holder(text: str) -> str:
    """Who holds the lock, from the run its launcher wrote, saying so when that launcher is gone and
    only processes it started hold it."""
    try:
        holder = parse_run(text, "the lock file")
    except InputError:
        return "".join(c if c.isprintable() else "?" for c in text.strip()[:200]) or "another process"
    if holder.host == socket.gethostname() and not process_alive(holder.pid):
        return f"the training processes of {holder.describe()} (that launcher is gone; they stop within seconds)"
    return holder.describe()
