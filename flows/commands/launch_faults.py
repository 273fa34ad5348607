"""What `train`, `measure` and `calibrate` say when their launched job is stopped or the disk fills:
one line and the exit code, the same for all three."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Fault:
    """Set when the job ended by a fault the ``launch_faults`` block reported; ``code`` to exit with."""

    code: int | None = None


@contextmanager
def launch_faults(command: str, path: Callable[[], str],
                  stopped_note: Callable[[], str] = lambda: "") -> Iterator[Fault]:
    """Turns a stop signal (``tasks.launch.Stopped``) and a full disk into one line on stderr and
    ``fault.code``; any other error goes on. Called when it happens: ``path()``, the output a full
    disk is reported for when the error names no file, and ``stopped_note()``, the stop line's end."""
    from rec.disk_full import DiskFull, is_disk_full
    from rec.exit_codes import ExitCode, stopped_by
    from tasks.launch import Stopped

    fault = Fault()
    try:
        yield fault
    except Stopped as e:
        print(f"{command}: stopped by {e.name}: torchrun and every rank have exited{stopped_note()}", file=sys.stderr)
        fault.code = stopped_by(e.signum)
    except (DiskFull, OSError) as e:
        if isinstance(e, OSError) and not is_disk_full(e):
            raise
        full = e if isinstance(e, DiskFull) else DiskFull(e.filename or path(), e)
        print(f"{command}: {full}", file=sys.stderr)
        fault.code = ExitCode.FAILED
