"""No process of a training outlives its run, and a finished one leaves at once.

The launcher (``shardflow train``, a flow) starts torchrun (``rec.train.launcher``: torchrun whose
ranks are forked from its forkserver), torchrun starts the ranks. Each child asks the kernel for a
signal when its parent dies (Linux's parent-death signal): torchrun gets SIGTERM when the launcher
dies, however it died (then stops its ranks), and a rank gets SIGTERM when its parent, torchrun or
the forkserver that exits with torchrun, dies. And the output directory's lock
(``tasks.run_dirs``) is held, shared, by the launcher and by every rank (the file named by
``OUT_LOCK_ENV``), so that no second run starts in the directory while any process of this one
still lives; the checkpoint directory's lock likewise (``rec.train.ownership``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from rec.exit_codes import ExitCode
from rec.file_lock import open_lock_file, take
from rec.train import forked_forkserver

OUT_LOCK_ENV = "SHARDFLOW_OUT_LOCK"  # the --out lock file the ranks hold shared; unset: no lock
LAUNCHER_MODULE = "rec.train.launcher"  # torchrun with forked ranks, as the launcher starts it (``python -m``)
# A rank's parent: torchrun (torchrun, ``python -m torch.distributed.run``, or the older launch), or the
# forkserver of ``rec.train.launcher``, which exits with it: a fork of the launcher (its command line), or
# multiprocessing's own.
_RANK_PARENTS = (b"torchrun", b"torch.distributed.", LAUNCHER_MODULE.encode(), b"multiprocessing.forkserver")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A function for ``subprocess.Popen(preexec_fn=...)``: the child gets ``sig`` when this
    process dies, and exits at once if it already has. None where the kernel cannot do that."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def set_in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the launcher died between fork and prctl
            os._exit(ExitCode.FAILED)

    return set_in_child


def die_with_torchrun(sig: int = signal.SIGTERM) -> bool:
    """In a rank: get ``sig`` when its parent (torchrun, or the forkserver that exits with it) dies.
    False if the parent is neither any more (it died while this rank started, and the rank was
    handed to init or a subreaper): the rank is an orphan and must not run."""
    prctl = _prctl()
    if prctl is None or "TORCHELASTIC_RUN_ID" not in os.environ:  # not Linux, or not under torchrun
        return True
    prctl(_PR_SET_PDEATHSIG, sig)
    forked_forkserver.release_in_child()
    try:
        command = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return False
    return any(name in command for name in _RANK_PARENTS)


def join_run_lock(env: str = OUT_LOCK_ENV) -> int | None:
    """In a rank: hold the run's lock that ``env`` names (``--out``'s; the checkpoint directory's,
    ``rec.train.ownership``) shared for the rest of the process (its file descriptor stays open);
    None when the run has no such lock. ``RunLockTaken`` if another run holds it: the launcher that
    started this rank is gone, and another run owns the directory now."""
    path = os.environ.get(env)
    if not path:
        return None
    fd = open_lock_file(path)
    try:
        take(fd, shared=True, blocking=False)
    except BlockingIOError:
        os.close(fd)
        raise RunLockTaken(f"{Path(path).parent} is used by another run: this rank's launcher is gone") from None
    return fd


class RunLockTaken(RuntimeError):
    """Another run holds the output directory this rank was started for."""


def exit_skipping_finalization(code: int) -> NoReturn:
    """Leave without interpreter finalization once every output is written.

    Gloo's worker threads release a finished collective's tensors a moment after the caller
    wakes up; if that release lands during finalization it needs the GIL, the thread is torn
    down inside C++ and the process aborts ("terminate called without an active exception"),
    failing a job that finished. Skipping finalization removes that race."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl
