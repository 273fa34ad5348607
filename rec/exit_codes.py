"""The exit codes of ``shardflow`` and of the training job's ranks (docs/cli.md lists them)."""

from __future__ import annotations

import signal
from enum import IntEnum

SIGNALLED = 128  # a process stopped by signal N exits 128 + N, as a shell reports it


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # failed for good otherwise: a training, a full disk, a lost server
    BAD_INPUT = 2  # a user's mistake, or a failure that would repeat: one screen naming every problem
    INTERRUPTED = SIGNALLED + signal.SIGINT  # 130: Ctrl-C
    BROKEN_PIPE = SIGNALLED + signal.SIGPIPE  # 141: the reader of the output went away (`| head`)

    @classmethod
    def of_failure(cls, deterministic: bool) -> ExitCode:
        """A failure that would repeat on every retry is bad input; any other failed for good."""
        return cls.BAD_INPUT if deterministic else cls.FAILED


def stopped_by(signum: int) -> int:
    """The exit code of a command that a signal stopped (after stopping what it started)."""
    return SIGNALLED + signum
