"""``shardflow ARGS`` in the test's own process (``flows.cli.main``), as a subprocess's result.

Where a test needs no process of its own (no signal, no environment or limit of its own, nothing
run at once beside it), this skips a new interpreter's imports (torch, MLflow, Prefect: seconds of
CPU each) and asserts the same exit code and output. Only for what the CLI prints itself (and what
shardflow's own modules log, which reaches stderr here too): what libraries log depends on how this
process set up logging before (MLflow and Prefect read the CLI's quiet settings when first imported),
so a test of what a launch, a flow or MLflow logs, or that it logs nothing, runs the command in a
process of its own."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from flows.cli import main


def shardflow_here(capfd: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    capfd.readouterr()  # what the test printed before is not the command's
    # A new process prints a warning or an error logged without a handler to stderr, with its
    # traceback (logging's last resort); pytest's own handler would take it away from stderr here.
    last_resort = logging.StreamHandler(sys.stderr)
    last_resort.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(last_resort)
    try:
        code = main(list(args))
    finally:
        root.removeHandler(last_resort)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["shardflow", *args], code, out, err)
