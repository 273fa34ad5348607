"""A training rank's own output: its log file, progress lines for the launcher, the cause of a failure.

Every rank's output, Python's and the C++ libraries' alike (the file descriptors are redirected),
goes to ``OUT/logs/rank-<RANK>.log``, appended to across attempts with a header line each, so
nothing of a failed attempt is lost and the terminal stays clear of eight ranks' warnings. The
first rank of each node (LOCAL_RANK 0) keeps its original stdout for ``rec.progress`` lines, which
the launcher shows. A rank that raises leaves ``OUT/logs/rank-<RANK>.error.json``: the exception on
one line and whether it fails the same way every time (then retrying is pointless); it also sends
that record to the launcher on its original stdout (``@shardflow-error {json}``), which reaches the
launcher when the disk is too full for the file. A full disk cuts the log short instead of failing
the rank: the output whose write fails reports it, naming its path (``rec.disk_full``).

No torch here: the launcher reads these files too.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

from rec.disk_full import DiskFull, is_disk_full
from rec.documents import load_json
from rec.errors import InputError, printable
from rec.progress import to_line
from rec.units import counted

LOG_DIR = "logs"
RANK_LOG = "rank-{rank}.log"
ERROR_FILE = "rank-{rank}.error.json"
PROGRESS_EVERY_S = 0.5
MAX_CAUSE = 300  # characters of a one-line cause
MAX_PROBLEMS = 25  # lines of a bad input's problems kept with the cause (InputError.render's screen)
MAX_NOTE = 200  # characters of where a user's code raised the error, kept whole in the cause
USER_CODE_NOTE = "raised at "  # an exception's note (rec.train.user_model) the cause line ends with
ERROR_LINE_PREFIX = "@shardflow-error "  # marks a rank's failure record among its output
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")  # "[.../pair.cc:537] " of C++ errors
# Failures that no retry can fix: the machine lacks what the plan needs.
DETERMINISTIC_MARKERS = (
    "doesn't have NCCL built in",
    "No CUDA GPUs are available",
    "Found no NVIDIA driver",
    "Torch not compiled with CUDA enabled",
    "CUDA driver version is insufficient",
)


def log_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / LOG_DIR


def one_line(error: BaseException) -> str:
    """``Type: first line of the message`` (a full disk: ``cannot write PATH: reason``; bad input: its
    first problem and how many more; raised in a user's code: where), cut to ``MAX_CAUSE`` characters."""
    more = len(error.problems) - 1 if isinstance(error, InputError) else 0
    told = f" (and {counted(more, 'more problem')})" if more > 0 else ""
    told += "".join(f" ({printable(note, MAX_NOTE)})" for note in getattr(error, "__notes__", ())
                    if isinstance(note, str) and note.startswith(USER_CODE_NOTE))
    cause = _first_line(error)
    return cause + told if len(cause) + len(told) <= MAX_CAUSE else cause[: MAX_CAUSE - len(told) - 3] + "..." + told


def problem_lines(error: BaseException) -> tuple[str, ...]:
    """Bad input of more than one problem, or of one the cause had to cut: each, one line (as the CLI
    shows an InputError: problems of one reason share a line, at most a screen); () for any other
    error, whose cause says it all."""
    if not isinstance(error, InputError) or not error.problems:
        return ()
    if len(error.problems) == 1 and len(_first_line(error)) <= MAX_CAUSE:
        return ()
    return tuple(line.strip().removeprefix("- ") for line in error.render(MAX_PROBLEMS - 1).splitlines()[1:])


def _first_line(error: BaseException) -> str:
    failures = getattr(error, "failures", None)  # DCP's CheckpointException: the ranks' own errors
    if isinstance(error, DiskFull):
        cause = str(error)
    elif isinstance(failures, dict) and failures:
        ranks, first = sorted(failures), failures[min(failures)]
        inner = first[0] if isinstance(first, tuple) and first else first
        detail = one_line(inner) if isinstance(inner, BaseException) else str(inner)
        cause = f"{type(error).__name__} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {detail}"
    else:
        text = str(error.title if isinstance(error, InputError) else error).strip()
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        if isinstance(error, InputError) and error.problems:
            first = f"{first} {error.problems[0]}"
        first = _SOURCE_PREFIX.sub("", first)
        cause = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return cause


def is_deterministic(error: BaseException) -> bool:
    """Whether ``error`` would happen again on a retry (bad input, a machine without CUDA/NCCL)."""
    return isinstance(error, InputError) or any(m in str(error) for m in DETERMINISTIC_MARKERS)


@dataclass(frozen=True)
class RankError:
    rank: int
    cause: str  # one line
    deterministic: bool
    time: float  # when the rank failed (time.time()): the first failure is the cause, the rest follow
    disk_full: bool = False  # an output could not be written: the cause, whatever failed first
    problems: tuple[str, ...] = ()  # bad input of several problems, or of one too long for ``cause``: each, one line


def _record(error: RankError) -> str:
    return json.dumps({"rank": error.rank, "cause": error.cause, "deterministic": error.deterministic,
                       "time": error.time, "disk_full": error.disk_full, "problems": list(error.problems)})


def _parse(text: str) -> RankError | None:
    try:
        d: Any = load_json(text)
        listed = d.get("problems", [])  # none before shardflow kept them
        problems = tuple(printable(str(p), MAX_CAUSE) for p in listed[:MAX_PROBLEMS]) if isinstance(listed, list) \
            else ()
        return RankError(int(d["rank"]), str(d["cause"])[:MAX_CAUSE], bool(d["deterministic"]), float(d["time"]),
                         bool(d.get("disk_full", False)), problems)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def error_from_line(line: str) -> RankError | None:
    """The failure record of an ``@shardflow-error`` line; None for any other line."""
    return _parse(line[len(ERROR_LINE_PREFIX):]) if line.startswith(ERROR_LINE_PREFIX) else None


def read_errors(out_dir: str | Path, sent: tuple[RankError, ...] = ()) -> list[RankError]:
    """The error files the ranks left in ``out_dir``, and the records they ``sent`` to the
    launcher for ranks without a file, the earliest failure first."""
    found: dict[int, RankError] = {}
    for path in sorted(log_dir(out_dir).glob(ERROR_FILE.format(rank="*"))):
        try:
            error = _parse(path.read_text())
        except OSError:
            continue
        if error is not None:
            found[error.rank] = error
    for error in sent:
        found.setdefault(error.rank, error)
    return sorted(found.values(), key=lambda e: (e.time, e.rank))


def clear_errors(out_dir: str | Path) -> None:
    """Remove the error files of an earlier attempt (before launching a new one)."""
    for path in log_dir(out_dir).glob(ERROR_FILE.format(rank="*")):
        path.unlink(missing_ok=True)


class RankOutput:
    """This rank's log file (stdout and stderr redirected into it) and its progress lines."""

    def __init__(self, out_dir: str | Path, rank: int, local_rank: int, attempt: str = "0"):
        self.out_dir = Path(out_dir)
        self.rank = rank
        self._last = 0.0
        directory = log_dir(out_dir)
        directory.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._launcher: TextIO | None = os.fdopen(os.dup(1), "w", buffering=1)
        self._shows_progress = local_rank == 0
        fd = os.open(directory / RANK_LOG.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                     0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        sys.stdout = cast(TextIO, _LogStream(sys.stdout))
        sys.stderr = cast(TextIO, _LogStream(sys.stderr))
        print(f"== rank {rank}, torchrun restart {attempt}, pid {os.getpid()}, "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')} ==", flush=True)

    def progress(self, message: str, done: int | None = None, total: int | None = None,
                 force: bool = True) -> None:
        """A progress line for the launcher (first rank of the node only); unless ``force``, at
        most one every ``PROGRESS_EVERY_S``."""
        if not self._shows_progress:
            return
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        self._send(to_line(message, done, total))

    def _send(self, line: str) -> None:
        if self._launcher is None:
            return
        try:
            self._launcher.write(line + "\n")
        except OSError:  # the launcher is gone; the rank's own work goes on
            self._launcher = None

    def due(self, done: int, total: int) -> bool:
        """Whether an iteration's progress line would be written now (so its values are worth
        computing: the loss costs a device sync)."""
        return self._shows_progress and self._launcher is not None and (
            done in (1, total) or time.monotonic() - self._last >= PROGRESS_EVERY_S)

    def failed(self, error: BaseException) -> None:
        """Leave the cause for the launcher: in the error file, and on the launcher's pipe (which
        works when the disk is full)."""
        record = RankError(self.rank, one_line(error), is_deterministic(error), time.time(),
                           isinstance(error, DiskFull), problem_lines(error))
        path = log_dir(self.out_dir) / ERROR_FILE.format(rank=self.rank)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(_record(record) + "\n")
            tmp.replace(path)
        except OSError:  # the launcher reads the line below
            with suppress(OSError):
                tmp.unlink(missing_ok=True)
        self._send(ERROR_LINE_PREFIX + _record(record))


class _LogStream:
    """``sys.stdout``/``sys.stderr`` of a rank, on its log file: once the disk is full, what is
    printed is dropped instead of raising in whatever code printed it."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.cut = False

    def write(self, text: str) -> int:
        if not self.cut:
            try:
                return self._stream.write(text)
            except OSError as e:
                if not is_disk_full(e):
                    raise
                self.cut = True
        return len(text)

    def flush(self) -> None:
        if not self.cut:
            try:
                self._stream.flush()
            except OSError as e:
                if not is_disk_full(e):
                    raise
                self.cut = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
