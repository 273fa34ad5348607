"""``rec.train.elastic_internals`` on the installed torch: a failed rank's log record reads as torch's
own formatter writes it, without importing torch._dynamo."""

from __future__ import annotations

import logging
import sys

import pytest

from rec.train.elastic_internals import ExceptionTextFirst, format_exceptions_first

AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"  # where the agent logs a failed rank


def torchs_handler() -> logging.Handler:
    import torch.distributed.elastic.multiprocessing.api  # noqa: F401  the agent's logger, torch's handlers

    (handler,) = [h for h in logging.getLogger("torch.distributed").handlers if type(h) is logging.StreamHandler]
    return handler


def failed_rank() -> logging.LogRecord:
    """A record as the agent logs a failed rank: with the exception."""
    try:
        raise RuntimeError("process 1 terminated with exit code 2")
    except RuntimeError:
        return logging.getLogger(AGENT_LOGGER).makeRecord(
            AGENT_LOGGER, logging.ERROR, __file__, 1, "failed (exitcode: %d) local_rank: %d", (2, 1), sys.exc_info())


def copy(record: logging.LogRecord) -> logging.LogRecord:
    return logging.makeLogRecord(dict(record.__dict__))


def test_a_failed_ranks_record_reads_as_torchs_formatter_writes_it_without_importing_dynamo(monkeypatch):
    torchs = torchs_handler().formatter
    assert torchs is not None and type(torchs).__name__ == "TorchLogsFormatter"
    record = failed_rank()
    expected = torchs.format(copy(record))
    assert "RuntimeError: process 1 terminated with exit code 2" in expected

    monkeypatch.setitem(sys.modules, "torch._dynamo", None)  # importing it fails from here on
    with pytest.raises(ImportError):
        torchs.format(copy(record))  # what the agent's process paid 3 s of CPU for
    assert ExceptionTextFirst(torchs).format(copy(record)) == expected


def test_the_launcher_wraps_torchs_handlers_once(monkeypatch):
    handler = torchs_handler()
    monkeypatch.setattr(handler, "formatter", handler.formatter)  # restored after the test
    torchs = handler.formatter
    format_exceptions_first()
    format_exceptions_first()
    assert isinstance(handler.formatter, ExceptionTextFirst) and handler.formatter.inner is torchs


def test_the_agent_says_when_it_restarts_the_ranks_and_waits_for_the_nodes(monkeypatch):
    """A node whose peer never came, or never came back for a restart (--max-restarts), showed its last
    progress line unchanged for the join timeout (10 minutes by default)."""
    from types import SimpleNamespace

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState

    from rec.train.elastic_internals import report_waits

    called: list[str] = []
    monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", lambda agent, group: called.append("rendezvous"))
    monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", lambda agent, group: called.append("restart"))
    said: list[str] = []
    report_waits(2, "10.0.0.1:29400", 600.0, said.append)
    agent = SimpleNamespace(_remaining_restarts=2)  # the agent counts a restart down before it restarts
    group = SimpleNamespace(state=WorkerState.INIT, spec=SimpleNamespace(max_restarts=3))
    SimpleElasticAgent._rendezvous(agent, group)
    group.state = WorkerState.FAILED
    SimpleElasticAgent._restart_workers(agent, group)
    SimpleElasticAgent._rendezvous(agent, group)
    assert called == ["rendezvous", "restart", "rendezvous"]
    assert said == ["waiting for the 2 nodes to meet at 10.0.0.1:29400 (at most 600 s)",  # before node 0 answers
                    "waiting for the 2 nodes to meet at 10.0.0.1:29400 (at most 600 s)",
                    "a rank failed: restarting the ranks (restart 1 of 3)",
                    "restart 1 of 3: waiting for the 2 nodes to meet at 10.0.0.1:29400 (at most 600 s)"]
    said.clear()
    monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", lambda agent, group: called.append("rendezvous"))
    report_waits(1, "localhost:0", 600.0, said.append)  # one node (--standalone): no one to wait for
    SimpleElasticAgent._rendezvous(agent, group)
    assert said == []
