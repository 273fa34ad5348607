"""What shardflow changes of torchrun's agent (``torch.distributed.elastic``) beyond its API, in one
place: a cost that buys nothing, removed in ``rec.train.launcher``'s process.

torch's log formatter imports ``torch._dynamo`` (seconds of CPU, in a process that has no other use
for it) to format a record that carries an exception, and the agent logs one for every failed rank:
the first failure of a launch would wait for that import before its summary or its restart
(bench/RESULTS.md §11 measures it). ``ExceptionTextFirst`` formats
the exception's text beforehand, as that formatter would (its dynamo setting only concerns dynamo's
own graph-break records), so the formatter finds the text and no exception to format.

``tests/rec/test_elastic_internals.py`` checks it against torch's own formatter on the installed
torch: the same lines, and no dynamo imported.
"""

from __future__ import annotations

import logging

TORCH_LOGGERS = ("torch", "torch.distributed")  # the loggers torch gives handlers of its own


def format_exceptions_first() -> None:
    """Wrap the formatter of every handler torch gave its loggers (torch is imported)."""
    for name in TORCH_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if handler.formatter is not None and not isinstance(handler.formatter, ExceptionTextFirst):
                handler.setFormatter(ExceptionTextFirst(handler.formatter))


class ExceptionTextFirst(logging.Formatter):
    """``inner``, given a record whose exception is already formatted text."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.inner.formatException(record.exc_info)
            record.exc_info = None  # handlers after this one read exc_text, as logging's own do
        return self.inner.format(record)
