"""Fail instead of hanging: a test that opens or reads something that may block (a FIFO opened for
reading waits for a writer) runs it under ``deadline``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """A blocking call inside is interrupted after ``seconds`` (SIGALRM) with TimeoutError."""
    def fail(*_: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
