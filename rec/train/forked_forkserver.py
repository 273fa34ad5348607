"""multiprocessing's forkserver, forked from the launcher once it has imported torch.

multiprocessing starts its forkserver as a new interpreter, which imports torch again before it
imports the job: seconds of CPU on every launch (bench/RESULTS.md §11), paid twice over (the launcher imports torch for
torchrun's agent). Forked from the launcher once torch is imported, the forkserver imports only
what the job adds (torchrec, the job module). It runs multiprocessing's own forkserver loop, as the
new interpreter would: the command multiprocessing built for that interpreter, run in the fork.

The fork happens before torchrun's agent starts a thread. The forkserver keeps no file descriptor of
the launcher's but those multiprocessing passes it (as its new interpreter would), leaves with
``os._exit`` (nothing the launcher registered, atexit or finalizers, runs in it), and hands its
ranks multiprocessing as a new interpreter has it: a rank that starts a forkserver of its own gets
a new interpreter, not a fork of itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import forkserver, util
from typing import Any

FORKSERVER_MAIN = "from multiprocessing.forkserver import main"  # the command multiprocessing runs it with
PROCESS_NAME = b"sf-forkserver"  # what ps and top show for it (the command line stays the launcher's)
_PR_SET_NAME = 15  # <linux/prctl.h>


def start(preload: Sequence[str], fork: bool = True) -> None:
    """Start the forkserver, which imports ``preload``, as a fork of this process (``fork``; else as
    multiprocessing starts it, a new interpreter)."""
    forkserver.set_forkserver_preload(list(preload))
    if not fork:
        forkserver.ensure_running()
        return
    spawn = util.spawnv_passfds

    def fork_instead(path: bytes, args: Sequence[Any], passfds: Sequence[int]) -> int:
        command = args[-1] if args else None
        if not isinstance(command, str) or not command.startswith(FORKSERVER_MAIN):  # the resource tracker
            return spawn(path, args, passfds)
        return _fork(command, passfds, spawn)

    util.spawnv_passfds = fork_instead
    try:
        forkserver.ensure_running()
    finally:
        util.spawnv_passfds = spawn


def _fork(command: str, passfds: Sequence[int], spawn: Callable[..., int]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _keep_only((0, 1, 2, *passfds))
        _as_new_interpreter(spawn)
        _name_process()
        exec(command, {"__name__": "__forkserver__"})  # multiprocessing's forkserver loop
        code = 0
    except SystemExit as e:  # the loop ends so when the launcher is gone
        code = e.code if isinstance(e.code, int) else 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _as_new_interpreter(spawn: Callable[..., int]) -> None:
    """multiprocessing's state as a new interpreter has it, for a rank that starts processes of its
    own: its forkserver a new interpreter (not a fork of a rank that may hold CUDA and threads),
    preloading only ``__main__``; and the lock the parent held while it forked, free."""
    util.spawnv_passfds = spawn
    server: Any = forkserver._forkserver
    server._lock = threading.Lock()
    server._preload_modules = ["__main__"]


def _keep_only(fds: Sequence[int]) -> None:
    """Close every file descriptor but ``fds``, as a new interpreter started with them would have."""
    low = 0
    for fd in sorted(set(fds)):
        if low < fd:  # os.closerange(n, n) closes every descriptor from n up (close_range(2) of n, -1)
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _name_process() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(_PR_SET_NAME, PROCESS_NAME, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def release_in_child() -> None:
    """In a process forked by multiprocessing's forkserver (a rank): close its copy of the pipe whose
    closing tells the forkserver that its starter is gone. multiprocessing hands every child one (so
    that the child may ask the same forkserver for processes; a rank that starts processes gets a
    forkserver of its own, ``_as_new_interpreter``). Held by the ranks, it kept the forkserver alive
    after a SIGKILLed launcher, and the forkserver the ranks (whose parent-death signal is the
    forkserver's, ``rec.train.lifetime``): the ranks trained on, then waited for the launcher forever."""
    server: Any = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None or getattr(server, "_forkserver_pid", None) is not None:  # none, or this process's own forkserver
        return
    with contextlib.suppress(OSError):
        os.close(fd)
    server._forkserver_alive_fd = None
    server._forkserver_address = None
