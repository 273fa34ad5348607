"""Imported by ``rec.train.launcher``'s forkserver only: the forkserver leaves without finalizing.

The forkserver exits when the launcher does. Finalizing an interpreter that has imported torch
and torchrec takes a second or more of CPU, and the launcher's caller waits for it: the
forkserver holds the launcher's output pipe until it is gone. Nothing of its own needs finalizing:
its ranks have exited, and the launcher removes the forkserver's socket."""

from __future__ import annotations

import atexit
import os
import sys


def _leave() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


atexit.register(_leave)
