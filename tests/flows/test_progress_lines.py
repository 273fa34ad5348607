"""Plain progress lines (a pipe, a CI log, a Prefect run log): what a person reading them sees."""

from __future__ import annotations

import time

import pytest

from flows import progress as shown
from rec import progress


def test_a_report_just_after_a_line_is_shown_once_the_interval_has_passed_not_at_the_heartbeat(monkeypatch):
    """A node that began to wait for its peers right after an iteration's line said so only at the
    next heartbeat (15 s later), or never where the wait ended sooner."""
    monkeypatch.setattr(shown, "PLAIN_EVERY_S", 0.2)
    monkeypatch.setattr(shown, "HEARTBEAT_S", 60.0)
    lines: list[str] = []
    reporter = shown.TerminalProgress(live=False, write=lines.append, show_after_s=0.0)
    with progress.reporting(reporter), progress.step("train", "starting 2 ranks"):
        progress.update("iteration 10/100")
        progress.update("waiting for the 2 nodes to meet")  # within the interval: not yet
        assert not any("waiting" in line for line in lines)
        deadline = time.monotonic() + 5
        while not any("waiting" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        quiet = len(lines)
        time.sleep(0.6)  # nothing new reported: no line until the heartbeat
        assert len(lines) == quiet
    reporter.close()
    assert [line.split(" [")[0] for line in lines[:2]] == ["train: iteration 10/100",
                                                          "train: waiting for the 2 nodes to meet"]
    assert len(lines) == 3 and lines[2].startswith("train: done in")


def test_a_count_the_message_gives_is_not_repeated_after_it():
    """`predict: 1,245,184/12,000,000 rows (1245184/12000000)`: the count twice, once with commas."""
    lines: list[str] = []
    reporter = shown.TerminalProgress(live=False, write=lines.append, show_after_s=0.0)
    with progress.reporting(reporter), progress.step("predict"):
        progress.update("1,245,184/12,000,000 rows", 1_245_184, 12_000_000)
    reporter.close()
    assert lines[0].split(" [")[0] == "predict: 1,245,184/12,000,000 rows"


def test_a_step_that_succeeded_on_a_retry_is_not_summed_up_as_failed():
    """`shardflow run`'s closing summary said `train 6.30 s (failed)` of a training Prefect retried once
    and that then succeeded."""
    reporter = shown.TerminalProgress(live=False, write=lambda line: None)
    with progress.reporting(reporter):
        with pytest.raises(RuntimeError), progress.step("train"):
            raise RuntimeError("a rank died")
        with progress.step("train"):
            pass
    reporter.close()
    assert "(failed)" not in reporter.summary() and reporter.summary().startswith("train ")


def test_a_step_that_ended_otherwise_than_done_says_how():
    lines: list[str] = []
    reporter = shown.TerminalProgress(live=False, write=lines.append, show_after_s=0.0)
    with progress.reporting(reporter), progress.step("mlflow", "recording the train run") as ending:
        progress.update("delivering")
        ending.said = "kept in the outbox"
    reporter.close()
    assert lines[-1].startswith("MLflow: kept in the outbox after ") and "done" not in lines[-1]
