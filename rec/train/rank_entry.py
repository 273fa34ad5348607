"""What a rank started by ``rec.train.launcher`` runs: the job module's ``main``.

The launcher waits for every rank's return value, so a rank that succeeds returns (its process
then leaves without interpreter finalization, as a forked multiprocessing child does); a rank that
fails exits with the job's code, as it does under torchrun. Nothing here imports torch: the
launcher imports this module before its ranks exist."""

from __future__ import annotations

import importlib

from rec import startup_gc
from rec.exit_codes import ExitCode
from rec.train.lifetime import exit_skipping_finalization


def run_job(module: str, *argv: str) -> None:
    """Run ``module.main(argv)`` as this rank's whole life."""
    job = importlib.import_module(module)  # imported already where the rank was forked
    startup_gc.imports_done()  # forked from a forkserver that held the collector while it imported
    try:
        code = job.main(list(argv))
    except KeyboardInterrupt:  # SIGINT; multiprocessing would exit 0 and the launcher wait forever
        code = ExitCode.INTERRUPTED
    if code != ExitCode.OK:
        exit_skipping_finalization(code)
