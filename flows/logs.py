"""Prefect's run logs for CLI users: a user's mistake is reported once, on one screen.

Prefect logs a failed task or flow run with its traceback and the exception's full text, three
times over (task state, flow exception, flow state). For an InputError the CLI prints the
one-screen message itself, so those log lines are cut to their first line, without traceback.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from rec.errors import InputError

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
_LINE_BREAK = re.compile(r"\n|\\n")  # state messages carry the exception's repr: escaped newlines


class _ShortInputErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        raised = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        if isinstance(raised, InputError) or "InputError" in message:
            first = _LINE_BREAK.split(message, maxsplit=1)[0]
            record.msg, record.args = f"{first} ...", ()
            record.exc_info = record.exc_text = None
        return True


def quiet_prefect_defaults() -> None:
    """Environment defaults for flows started from the CLI (a user's own settings win)."""
    # The embedded Prefect server's telemetry cannot reach the internet from closed networks and
    # would print an ERROR line.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@contextmanager
def input_errors_without_traceback() -> Iterator[None]:
    """Short run-log lines for InputErrors while the block runs."""
    short = _ShortInputErrors()
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    for logger in loggers:
        logger.addFilter(short)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(short)
