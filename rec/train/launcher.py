"""torchrun, with every rank forked from a process that has imported the job already.

torchrun starts each rank as a new interpreter, which imports torch and torchrec again: seconds of
CPU per rank before it does anything, on every launch and every restart (bench/RESULTS.md §11). This is torchrun
(``torch.distributed.run``'s flags, rendezvous, restarts, signals and failure summary), with one
change: with ``--start-method forkserver`` a rank is the job module's ``main``
(``rec.train.rank_entry``) in a process forked from a multiprocessing forkserver that imported the
module once, for all ranks and restarts. torchrun's default start method, spawn, starts every rank
as a fresh interpreter instead. The forkserver is itself a fork of this process, made once torch is
imported (``rec.train.forked_forkserver``): it imports only what the job adds to torch.

    python -m rec.train.launcher --standalone --nproc-per-node=2 --start-method=forkserver \\
        -m rec.train.job --plan P --out O

A rank's parent is the forkserver, which exits when this process does; the ranks then get their
parent-death signal (``rec.train.lifetime``). A failed rank's log line imports no torch._dynamo here
(``rec.train.elastic_internals``), which would delay a launch's first failure summary or restart.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from multiprocessing import util

from rec import startup_gc
from rec.library_noise import quiet_unlisted_fbgemm
from rec.train import elastic_internals, forked_forkserver
from rec.train.rank_entry import run_job

FORKSERVER_FLAG = "--start-method=forkserver"  # what tasks.launch passes: the ranks forked, the job preloaded
RANK_WRAPPER = "torch.distributed.elastic.multiprocessing.api"  # what every rank runs its function in
SOCKET_PATH_MAX = 107  # a Unix socket's path, in bytes (Linux's sun_path, less its NUL)
SOCKET_IN_TEMP = len("/pymp-XXXXXXXX/listener-XXXXXXXX")  # multiprocessing's socket, under the temp dir
SHORT_TEMP = "/tmp"
JOIN_TIMEOUT_S = 600  # torchrun's, where --rdzv-conf gives none


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The forkserver imports fbgemm-gpu, which asks torch.cuda.is_available() on import: NVML's answer
    # leaves CUDA uninitialized there, so that the ranks forked from it can use CUDA (also when this
    # launcher is run by hand, without tasks.launch's environment).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    startup_gc.hold_collection()  # until the forkserver, forked from here, has imported the job
    quiet_unlisted_fbgemm()  # here, in the forkserver and the ranks forked from it
    _launch(argv)


def _start_forkserver(argv: list[str]) -> None:
    """Start the forkserver (with the job imported), forked from this process once it has imported
    torch (``rec.train.forked_forkserver``). The job is the module after ``-m``."""
    import torch

    if FORKSERVER_FLAG not in argv or "-m" not in argv[:-1]:
        return
    _socket_dir()
    # A fork of a process that has started CUDA cannot use it (torch refuses in the fork): then the
    # forkserver is a new interpreter, as multiprocessing starts it. torch alone leaves CUDA unstarted.
    started = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    forked_forkserver.start([RANK_WRAPPER, argv[argv.index("-m") + 1]], fork=not started)


def _socket_dir() -> None:
    """multiprocessing's directory for the forkserver's socket: in the temporary directory, or in
    /tmp where that path would be too long for a socket (a long TMPDIR), as Python 3.14 does."""
    if len(tempfile.gettempdir()) + SOCKET_IN_TEMP <= SOCKET_PATH_MAX:
        return
    chosen, tempfile.tempdir = tempfile.tempdir, SHORT_TEMP
    try:
        util.get_temp_dir()  # made now, kept for this process, removed when it exits
    finally:
        tempfile.tempdir = chosen


def _launch(argv: list[str]) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    elastic_internals.format_exceptions_first()
    _start_forkserver(argv)
    startup_gc.imports_done()

    @record  # as torchrun's main: a failed rank's error file, and the failure summary on stderr
    def launch() -> None:
        args = parse_args(argv)  # type: ignore[no-untyped-call]
        if not args.module:
            sys.exit("rec.train.launcher: give the job as a module (-m MODULE)")
        if args.standalone:  # as torchrun: a rendezvous of its own on a free port
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
        if args.master_port is None:  # as torchrun (used by the static rendezvous only)
            args.master_port = 29500
        config, _, _ = config_from_args(args)
        elastic_internals.report_waits(config.max_nodes, config.rdzv_endpoint,
                                       float(config.rdzv_configs.get("join_timeout", JOIN_TIMEOUT_S)),
                                       elastic_internals.progress_line)
        elastic_launch(config, run_job)(args.training_script, *args.training_script_args)

    launch()


if __name__ == "__main__":
    main()
