"""A training rank's own output: its log file, progress lines for the launcher, the cause of a failure.

Every rank's output, Python's and the C++ libraries' alike (the file descriptors are redirected),
goes to ``OUT/logs/rank-<RANK>.log``, appended to across attempts with a header line each, so
nothing of a failed attempt is lost and the terminal stays clear of eight ranks' warnings. The
first rank of each node (LOCAL_RANK 0) keeps its original stdout for ``rec.progress`` lines, which
the launcher shows. A rank that raises leaves ``OUT/logs/rank-<RANK>.error.json``: the exception on
one line and whether it fails the same way every time (then retrying is pointless).

No torch here: the launcher reads these files too.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rec.errors import InputError
from rec.progress import to_line

LOG_DIR = "logs"
RANK_LOG = "rank-{rank}.log"
ERROR_FILE = "rank-{rank}.error.json"
PROGRESS_EVERY_S = 0.5
MAX_CAUSE = 300  # characters of a one-line cause
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
    """``Type: first line of the message``, cut to ``MAX_CAUSE`` characters."""
    text = str(error.title if isinstance(error, InputError) else error).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if isinstance(error, InputError) and error.problems:
        first = f"{first} {error.problems[0]}"
    first = _SOURCE_PREFIX.sub("", first)
    cause = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return cause if len(cause) <= MAX_CAUSE else cause[: MAX_CAUSE - 3] + "..."


def is_deterministic(error: BaseException) -> bool:
    """Whether ``error`` would happen again on a retry (bad input, a machine without CUDA/NCCL)."""
    return isinstance(error, InputError) or any(m in str(error) for m in DETERMINISTIC_MARKERS)


@dataclass(frozen=True)
class RankError:
    rank: int
    cause: str  # one line
    deterministic: bool
    time: float  # when the rank failed (time.time()): the first failure is the cause, the rest follow


def read_errors(out_dir: str | Path) -> list[RankError]:
    """The error files the ranks left in ``out_dir``, the earliest failure first."""
    found = []
    for path in sorted(log_dir(out_dir).glob(ERROR_FILE.format(rank="*"))):
        try:
            d = json.loads(path.read_text())
            found.append(RankError(int(d["rank"]), str(d["cause"]), bool(d["deterministic"]), float(d["time"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda e: (e.time, e.rank))


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
        self._progress: TextIO | None = None
        directory = log_dir(out_dir)
        directory.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        if local_rank == 0:
            self._progress = os.fdopen(os.dup(1), "w", buffering=1)
        fd = os.open(directory / RANK_LOG.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        print(f"== rank {rank}, torchrun restart {attempt}, pid {os.getpid()}, "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')} ==", flush=True)

    def progress(self, message: str, done: int | None = None, total: int | None = None,
                 force: bool = True) -> None:
        """A progress line for the launcher (first rank of the node only); unless ``force``, at
        most one every ``PROGRESS_EVERY_S``."""
        if self._progress is None:
            return
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        try:
            self._progress.write(to_line(message, done, total) + "\n")
        except OSError:  # the launcher is gone; the rank's own work goes on
            self._progress = None

    def due(self, done: int, total: int) -> bool:
        """Whether an iteration's progress line would be written now (so its values are worth
        computing: the loss costs a device sync)."""
        return self._progress is not None and (
            done in (1, total) or time.monotonic() - self._last >= PROGRESS_EVERY_S)

    def failed(self, error: BaseException) -> None:
        """Leave the cause for the launcher (and print it to the log)."""
        record = {"rank": self.rank, "cause": one_line(error), "deterministic": is_deterministic(error),
                  "time": time.time()}
        path = log_dir(self.out_dir) / ERROR_FILE.format(rank=self.rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record) + "\n")
        tmp.replace(path)
