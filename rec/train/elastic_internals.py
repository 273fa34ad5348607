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

The agent says at INFO level only (and torchrun logs at WARNING) that it waits for the other nodes or
restarts the ranks: a node whose peer never came, or never came back for a restart, showed the last
progress line unchanged for the join timeout (10 minutes by default). ``report_waits`` has the agent
say both as progress lines (``rec.progress``), which the launcher's caller shows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rec import progress

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


def report_waits(nodes: int, endpoint: str, join_timeout_s: float, say: Callable[[str], None]) -> None:
    """Have the agent ``say`` (a progress line) when it restarts the ranks after a failure and, with
    more than one node, when it waits for the nodes at ``endpoint``."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState

    rendezvous, restart = SimpleElasticAgent._rendezvous, SimpleElasticAgent._restart_workers
    restarting = ""
    if nodes > 1:  # said before the agent starts, which first waits for node 0's store to answer
        say(f"waiting for the {nodes} nodes to meet at {endpoint} (at most {join_timeout_s:g} s)")

    def _rendezvous(agent: SimpleElasticAgent, worker_group: Any) -> Any:
        if nodes > 1:
            say(f"{restarting}waiting for the {nodes} nodes to meet at {endpoint} (at most {join_timeout_s:g} s)")
        return rendezvous(agent, worker_group)

    def _restart_workers(agent: SimpleElasticAgent, worker_group: Any) -> Any:
        nonlocal restarting
        if worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            limit = worker_group.spec.max_restarts
            restarting = f"restart {limit - agent._remaining_restarts} of {limit}: "
            say(f"a rank failed: restarting the ranks ({restarting[:-2]})")
        else:  # the agent's only other reason: a node (a new one, or one that restarted) asked to join
            restarting = ""
            say("another node asked to join (it started, or restarted): restarting the ranks")
        return restart(agent, worker_group)

    SimpleElasticAgent._rendezvous = _rendezvous  # type: ignore[method-assign]
    SimpleElasticAgent._restart_workers = _restart_workers  # type: ignore[method-assign]


def progress_line(message: str) -> None:
    """``message`` as a progress line on stdout, where the launcher's caller reads them."""
    print(progress.to_line(message), flush=True)
