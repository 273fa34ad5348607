"""``rec.progress`` for people: a live status line (rich) on a terminal, plain lines elsewhere
(a pipe, a CI log, a Prefect run log), and each step's wall time for the closing summary.

Short work stays quiet: a step is shown only once it has run ``SHOW_AFTER_S``, so planning a few
hundred tables prints just its result, and rich is imported only when something is drawn live.
Plain lines come at most every ``PLAIN_EVERY_S`` per step (a report that came sooner is shown once
that much has passed, so a step's last word before a long wait is seen), with a heartbeat when a step
reports nothing for ``HEARTBEAT_S``; a shown step ends with one line saying how long it took.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from rec import progress
from rec.progress import Event

SHOW_AFTER_S = 2.0
PLAIN_EVERY_S = 3.0
HEARTBEAT_S = 15.0
TICK_S = 0.25
STEP_NAMES = {"mlflow": "MLflow", "prefect": "Prefect"}  # how a step is called in lines and the summary


def step_label(name: str) -> str:
    return STEP_NAMES.get(name, name)


@dataclass
class _Step:
    name: str
    message: str
    started: float
    done: int | None = None
    total: int | None = None
    shown: bool = False
    last_line: float = 0.0
    unshown: bool = False  # a report came since the last plain line
    task: Any = None  # the rich task, when drawn live


@dataclass
class Timing:
    name: str
    seconds: float
    ok: bool = True
    count: int = 1


@dataclass
class TerminalProgress:
    """A ``rec.progress`` reporter. ``live``: draw with rich (default: when ``stream`` is a
    terminal); otherwise plain lines go to ``write`` (default: ``stream``)."""

    stream: TextIO = field(default_factory=lambda: sys.stderr)
    live: bool | None = None
    write: Callable[[str], None] | None = None
    show_after_s: float = SHOW_AFTER_S
    timings: dict[str, Timing] = field(default_factory=dict)  # per step name, in first-start order
    _steps: list[_Step] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _ticker: threading.Thread | None = None
    _closed: bool = False
    _rich: Any = None

    def __post_init__(self) -> None:
        if self.live is None:
            self.live = self.write is None and _is_terminal(self.stream)

    def __call__(self, event: Event) -> None:
        with self._lock:
            now = time.perf_counter()
            if event.kind == "start":
                self._steps.append(_Step(event.step, event.message, now))
                self._start_ticker()
                return
            state = next((s for s in reversed(self._steps) if s.name == event.step), None)
            if state is None:
                return
            if event.kind == "update":
                state.message = event.message or state.message
                state.done, state.total = event.done, event.total
                state.unshown = True
                self._refresh(state, now, forced=False)
                return
            self._steps.remove(state)
            timing = self.timings.get(state.name)
            if timing is None:
                self.timings[state.name] = Timing(state.name, event.elapsed_s, event.ok)
            else:
                timing.seconds += event.elapsed_s
                timing.ok = event.ok  # a retried step (Prefect) is as its last attempt went
                timing.count += 1
            if state.shown:
                self._remove_live(state)
                if not event.stopped:  # a stop the user asked for: the command says so, in one line
                    verb = "failed after" if not event.ok else f"{event.ended} after" if event.ended else "done in"
                    self._line(f"{step_label(state.name)}: {verb} {_seconds(event.elapsed_s)}")
            if not self._steps:
                self._stop_live()

    def summary(self, total_s: float | None = None, other: str = "other") -> str:
        """``ingest 0.06 s, search 0.03 s, ...; total 22.1 s`` (``other``: time in no step, e.g.
        starting Prefect)."""
        parts = [f"{step_label(t.name)} {_seconds(t.seconds)}" + ("" if t.ok else " (failed)")
                 for t in self.timings.values()]
        if total_s is not None:
            rest = total_s - sum(t.seconds for t in self.timings.values())
            if rest >= 0.05:
                parts.append(f"{other} {_seconds(rest)}")
            return ", ".join(parts) + f"; total {_seconds(total_s)}"
        return ", ".join(parts)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop_live()

    # -- drawing ---------------------------------------------------------------------------------

    def _refresh(self, state: _Step, now: float, forced: bool) -> None:
        elapsed = now - state.started
        if elapsed < self.show_after_s:
            return
        if self.live:
            self._draw_live(state, elapsed)
            return
        first = not state.shown
        due = now - state.last_line >= (PLAIN_EVERY_S if state.unshown or not forced else HEARTBEAT_S)
        if first or due:
            state.shown, state.last_line, state.unshown = True, now, False
            self._line(f"{step_label(state.name)}: {_describe(state)} [{_seconds(elapsed, whole=True)}]")

    def _line(self, text: str) -> None:
        if self.write is not None:
            self.write(text)
        elif self._rich is not None:
            self._rich.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def _draw_live(self, state: _Step, elapsed: float) -> None:
        if self._rich is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

            # Our own elapsed column: the step started before it was first drawn.
            self._rich = Progress(SpinnerColumn(), TextColumn("{task.fields[step]}", style="bold"),
                                  BarColumn(bar_width=24), TextColumn("{task.description}"),
                                  TextColumn("{task.fields[elapsed]}", style="yellow"),
                                  console=Console(file=self.stream), transient=True,
                                  redirect_stdout=False, redirect_stderr=False)
            self._rich.start()
        fields = {"description": _describe(state, counts=False), "total": state.total,
                  "completed": state.done or 0, "elapsed": _seconds(elapsed, whole=True)}
        if state.task is None:
            state.task = self._rich.add_task(step=step_label(state.name), **fields)
            state.shown = True
        else:
            self._rich.update(state.task, **fields)

    def _remove_live(self, state: _Step) -> None:
        if self._rich is not None and state.task is not None:
            self._rich.remove_task(state.task)

    def _stop_live(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    # -- the ticker: shows steps that report nothing, and heartbeats -----------------------------

    def _start_ticker(self) -> None:
        if self._ticker is None or not self._ticker.is_alive():
            self._ticker = threading.Thread(target=self._tick, name="shardflow-progress", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while True:
            time.sleep(TICK_S)
            with self._lock:
                if self._closed or not self._steps:
                    return
                now = time.perf_counter()
                for state in self._steps:
                    self._refresh(state, now, forced=True)


def _describe(state: _Step, counts: bool = True) -> str:
    text = state.message or "working"
    if counts and state.done is not None and state.total and not any(
            str(total) in text for total in (state.total, f"{state.total:,}")):  # the message counts already
        text = f"{text} ({state.done}/{state.total})"
    return text


def _seconds(s: float, whole: bool = False) -> str:
    if whole:
        return f"{s:.0f} s"
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s" if s < 100 else f"{s:.0f} s"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress_in_run_log() -> Iterator[None]:
    """Progress lines in the Prefect run log for the block, unless something (the CLI) already
    shows progress: a served flow's training reports how it goes in the Prefect UI."""
    if progress.active():
        yield
        return
    from prefect import get_run_logger

    with progress.reporting(TerminalProgress(live=False, write=get_run_logger().info)):
        yield


@contextmanager
def on_terminal() -> Iterator[TerminalProgress]:
    """Show progress on stderr for the block (the CLI's commands)."""
    shown = TerminalProgress()
    try:
        with progress.reporting(shown):
            yield shown
    finally:
        shown.close()
