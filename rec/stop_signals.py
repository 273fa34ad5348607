"""SIGTERM, SIGINT and SIGHUP as an exception (``Stopped``) in a block, so that what the block
started is stopped and what it was writing is removed before the command exits 128 + the signal."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The command was asked to stop (SIGTERM, SIGINT, SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.out_dir: str | None = None  # a stopped training's output directory, once known

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def raise_stopped(signum: int, _frame: object) -> None:
    """A signal handler: raise ``Stopped`` where the main thread is."""
    raise Stopped(signum)


@contextmanager
def signals_stop() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP raise ``Stopped`` in the block (main thread only: elsewhere
    they keep their handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, raise_stopped) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
