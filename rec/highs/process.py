"""HiGHS runs in a worker process (``rec.highs.worker``), one per planning process, started at its
first run and kept for the next.

A run not answered in time is a run that loops: its worker is killed, so its core comes back, and
the next run starts another. A worker that ends while it runs (HiGHS crashed, or Linux ended it
with the thread that started it) is started again and the run tried once more; a second end is
raised (``HighsFailed``). Where no worker can start at all (no interpreter to run, a sandbox), runs
are made in this process, as a thread that can only be left behind, after one warning.
"""

from __future__ import annotations

import atexit
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np

from rec.highs.instance import MODEL_ARRAYS, Run, RunStatus, run_model
from rec.highs.wire import WireError, frame, read_frame, write_frame

log = logging.getLogger(__name__)

START_WAIT_S = 60.0  # a worker's interpreter and imports: ~0.1 s alone, seconds on a loaded host
ROOT = Path(__file__).resolve().parents[2]  # where ``rec`` is imported from


class HighsFailed(RuntimeError):
    """HiGHS's worker ended during a run, twice."""


class _Worker:
    def __init__(self, proc: subprocess.Popen[bytes], stderr: IO[bytes] | None) -> None:
        self.proc, self.stderr = proc, stderr
        assert proc.stdin is not None and proc.stdout is not None
        self.request_fd, self.reply_fd = proc.stdin.fileno(), proc.stdout.fileno()

    def answer(self, wait_s: float) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """The worker's next frame, waited for ``wait_s``; None if none came by then."""
        with selectors.DefaultSelector() as waiting:  # not select(): a busy process's fds pass 1024
            waiting.register(self.reply_fd, selectors.EVENT_READ)
            if not waiting.select(max(0.0, wait_s)):
                return None
        got = read_frame(self.reply_fd)
        if got is None:
            raise WireError("the worker ended")
        return got

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            if stream is not None:
                stream.close()

    def ended(self) -> str:
        """How the worker ended (killed if it has not within a few seconds: a stream out of step), and
        the last lines it wrote to stderr."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        tail: list[str] = []
        if self.stderr is not None:
            with suppress(OSError, ValueError):
                self.stderr.seek(0)
                tail = self.stderr.read()[-2000:].decode(errors="replace").strip().splitlines()[-5:]
        self.close()
        return how + "".join(f"\n  {line}" for line in tail)


class HighsProcess:
    """A worker process for HiGHS runs, started when first needed; thread-safe (runs one at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._in_process = False  # no worker could start: runs are made here
        os.register_at_fork(after_in_child=partial(_forked, weakref.ref(self)))

    def _forked(self) -> None:
        """In a forked child the worker is the parent's (only its pipes' copies are closed here), and
        the lock may have been held by a thread the fork left behind."""
        self._lock = threading.Lock()
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def run(self, arrays: Mapping[str, np.ndarray], options: tuple[tuple[str, Any], ...],
            start: np.ndarray | None, wait_s: float) -> Run | None:
        """HiGHS's run of the model (``MODEL_ARRAYS``) with ``options`` from ``start``; None if it
        gave no answer within ``wait_s`` (its worker is killed)."""
        with self._lock:
            if self._in_process:
                return run_model(arrays, options, start, wait_s)
            request = frame({"options": [list(o) for o in options]},
                            {**{name: arrays[name] for name in MODEL_ARRAYS},
                             **({} if start is None else {"initial": start})})
            ended = ""
            for _ in range(2):
                worker = self._started()
                if worker is None:
                    return run_model(arrays, options, start, wait_s)
                try:
                    write_frame(worker.request_fd, request)
                    answer = worker.answer(wait_s)
                except (OSError, WireError):  # it ended: try once more with a new one
                    self._worker = None
                    ended = worker.ended()
                    continue
                except BaseException:  # Ctrl-C or a stop signal mid-run: its answer would be out of step
                    self._stop()
                    raise
                if answer is None:
                    self._stop()
                    return None
                return _run(*answer)
            raise HighsFailed(f"HiGHS's worker process ended during a run, twice (last: {ended})")

    @property
    def worker_pid(self) -> int | None:
        """The worker's process id; None while none runs."""
        worker = self._worker
        return None if worker is None else worker.proc.pid

    def close(self) -> None:
        """Stop the worker, if one runs."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def _started(self) -> _Worker | None:
        if self._worker is not None:
            return self._worker
        began = time.perf_counter()
        stderr: IO[bytes] | None = None
        with suppress(OSError):  # no temporary folder to write in: its errors go unread
            stderr = tempfile.TemporaryFile()
        # Run from ROOT, so that a ``rec`` (or ``numpy``) in the caller's directory is not imported;
        # the caller's PYTHONPATH as it meant it there.
        path = [str(ROOT), *(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        try:
            proc = subprocess.Popen([sys.executable, "-m", "rec.highs.worker", str(os.getpid())],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL if stderr is None else stderr, cwd=ROOT,
                                    env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}, close_fds=True)
        except OSError as e:
            if stderr is not None:
                stderr.close()
            self._without_worker(f"{sys.executable!r} cannot run: {e}")
            return None
        worker = _Worker(proc, stderr)
        try:
            ready = worker.answer(START_WAIT_S)
        except (OSError, WireError):
            self._without_worker(f"it ended as it started ({worker.ended()})")
            return None
        if ready is None or not ready[0].get("ready"):
            worker.stop()
            self._without_worker(f"it was not ready in {time.perf_counter() - began:.0f} s")
            return None
        self._worker = worker
        return worker

    def _without_worker(self, why: str) -> None:
        log.warning("HiGHS runs in this process: its worker process could not start (%s); a run that loops "
                    "will keep a core until this process ends", why)
        self._in_process = True


def _forked(ref: weakref.ref[HighsProcess]) -> None:
    highs = ref()
    if highs is not None:
        highs._forked()


def _run(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Run:
    if "error" in header:
        raise HighsFailed(f"HiGHS could not run the model: {header['error']}")
    text, optimal, timed_out, has_solution = header["status"]
    values = arrays.get("values")
    return Run(RunStatus(str(text), bool(optimal), bool(timed_out), bool(has_solution)),
               None if values is None else values.copy(),
               float(header["objective"]), float(header["dual_bound"]), int(header["nodes"]),
               int(header["iterations"]), float(header["seconds"]))


HIGHS = HighsProcess()  # this process's worker
atexit.register(HIGHS.close)  # stopped and reaped, not left to the parent-death signal
