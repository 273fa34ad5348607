"""A training that goes on writing checkpoints into a directory while a test reads it: each new step a
copy of the newest, LATEST moved to it, and the older steps pruned as a training prunes them."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rec.disk_full import write_whole
from rec.train.resume import LATEST, latest, step_dir, step_name


def write_next(checkpoints: Path, keep: int = 1) -> int:
    """One more checkpoint in ``checkpoints`` (the newest's copy), then pruning as training prunes."""
    from rec.train.checkpoint import prune

    newest = latest(checkpoints)
    assert newest is not None
    shutil.copytree(step_dir(checkpoints, newest), step_dir(checkpoints, newest + 1))
    write_whole(checkpoints / LATEST, step_name(newest + 1))  # renamed over, as training writes it
    prune(checkpoints, keep)
    return newest + 1


@contextmanager
def going_on(checkpoints: Path, every_s: float = 0.02) -> Iterator[list[int]]:
    """``write_next`` every ``every_s`` seconds for the block; yields the steps written so far."""
    written: list[int] = []
    failed: list[BaseException] = []
    stop = threading.Event()

    def train() -> None:
        try:
            while not stop.wait(every_s):
                written.append(write_next(checkpoints))
        except BaseException as e:  # raised in the test, not lost with the thread
            failed.append(e)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        yield written
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]
