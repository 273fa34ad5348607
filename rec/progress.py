"""Progress of long work: the code doing it reports, the program running it decides what to show.

``step(name)`` brackets a piece of work and ``update(...)`` reports inside the innermost step.
Both only call the reporters installed with ``reporting(...)``: none by default, so the library
stays silent (the CLI installs one that draws on the terminal, a served flow one that writes its
run log). A training rank is another process: it writes ``to_line(...)`` to its stdout and the
launcher passes what ``from_line`` reads back to ``update``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

LINE_PREFIX = "@shardflow-progress "  # marks a rank's progress lines among its other output

Kind = Literal["start", "update", "end"]


@dataclass(frozen=True)
class Event:
    kind: Kind
    step: str  # ingest | search | write | train | mlflow ...
    message: str = ""  # what is happening, e.g. "iteration 12/20, 21.3 ms, loss 0.693"
    done: int | None = None  # units done of ``total``, when the step counts something
    total: int | None = None
    elapsed_s: float = 0.0  # since the step started
    ok: bool = True  # end events: False when the step raised
    stopped: bool = False  # end events: the step was interrupted (Ctrl-C, a stop signal), as asked
    ended: str | None = None  # end events: how a step that did not raise ended, where not simply done


@dataclass
class Ending:
    """What ``step`` yields: the work sets ``said`` where it ended without raising but not as asked
    ("kept in the outbox": MLflow was away), shown instead of "done"."""

    said: str | None = None


Reporter = Callable[[Event], None]

_lock = threading.Lock()
_reporters: list[Reporter] = []
_steps: list[tuple[str, float]] = []  # (name, perf_counter at start), innermost last


def _emit(event: Event) -> None:
    for reporter in list(_reporters):
        reporter(event)


@contextmanager
def step(name: str, message: str = "") -> Iterator[Ending]:
    """Report the block as step ``name``: a start event, then an end event with its wall time (and
    how it ended, where the block said: ``Ending``)."""
    started = time.perf_counter()
    entry = (name, started)
    with _lock:
        _steps.append(entry)
    _emit(Event("start", name, message))
    ok = stopped = False
    ending = Ending()
    try:
        yield ending
        ok = True
    except KeyboardInterrupt:
        stopped = True
        raise
    finally:
        with _lock:
            _steps.remove(entry)
        _emit(Event("end", name, elapsed_s=time.perf_counter() - started, ok=ok, stopped=stopped,
                    ended=ending.said))


def update(message: str = "", done: int | None = None, total: int | None = None) -> None:
    """Report how the innermost step is going (nothing happens without a step or a reporter)."""
    if not _reporters:
        return
    with _lock:
        if not _steps:
            return
        name, started = _steps[-1]
    _emit(Event("update", name, message, done, total, time.perf_counter() - started))


def active() -> bool:
    """Whether some reporter shows progress."""
    return bool(_reporters)


@contextmanager
def reporting(reporter: Reporter) -> Iterator[Reporter]:
    """Send every event to ``reporter`` while the block runs."""
    with _lock:
        _reporters.append(reporter)
    try:
        yield reporter
    finally:
        with _lock:
            _reporters.remove(reporter)


def to_line(message: str, done: int | None = None, total: int | None = None) -> str:
    """An ``update`` as one line of text, for a process that reports through its stdout."""
    return LINE_PREFIX + json.dumps({"message": message, "done": done, "total": total})


def from_line(line: str) -> dict[str, Any] | None:
    """The ``update`` arguments of a ``to_line`` line; None for any other line."""
    if not line.startswith(LINE_PREFIX):
        return None
    try:
        fields = json.loads(line[len(LINE_PREFIX):])
    except ValueError:
        return None
    if not isinstance(fields, dict):
        return None
    return {k: fields.get(k) for k in ("message", "done", "total")}
