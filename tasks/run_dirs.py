"""Where a run's outputs go, so that no run overwrites another's.

Without ``--out``, every run gets its own directories under ``out/``: the plan in
``out/<plan_id>/plan`` (identical bytes for every run of the same plan) and each training in
``out/<plan_id>/train-<UTC time>-<random>``; ``out/latest`` points at the newest run's directory.
With an explicit ``--out DIR`` the files go directly where they always went (``DIR/plan``,
``DIR/train`` for the pipeline; ``DIR`` for ``shardflow train``), and the directory is locked for
the run: a second run into it is refused at once with a message, instead of mixing the two.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from rec.errors import InputError, Problem
from tasks.paths import DEFAULT_OUT, PLAN_SUBDIR, TRAIN_SUBDIR

LOCK_FILE = ".shardflow-node{node}.lock"  # the nodes of one multi-node training share a directory
LATEST = "latest"


@dataclass(frozen=True)
class RunDirs:
    """The output layout of one run: ``base`` given by the user (explicit) or the default."""

    base: str
    explicit: bool

    @classmethod
    def of(cls, out_dir: str | None) -> RunDirs:
        return cls(out_dir, True) if out_dir else cls(DEFAULT_OUT, False)

    def plan_dir(self, plan_id: str) -> str:
        return str(Path(self.base, PLAN_SUBDIR) if self.explicit else Path(self.base, plan_id, PLAN_SUBDIR))

    def train_dir(self, plan_id: str, nested: bool = True) -> str:
        """A new training directory (explicit: ``base/train``, or ``base`` itself when not
        ``nested``, as ``shardflow train --out DIR`` writes)."""
        if self.explicit:
            return str(Path(self.base, TRAIN_SUBDIR) if nested else Path(self.base))
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return str(Path(self.base, plan_id, f"{TRAIN_SUBDIR}-{stamp}-{secrets.token_hex(2)}"))

    def mark_latest(self, target: str) -> None:
        """Point ``base/latest`` at ``target`` (default layout only), atomically."""
        if self.explicit:
            return
        link = Path(self.base, LATEST)
        tmp = Path(self.base, f".{LATEST}-{os.getpid()}-{secrets.token_hex(2)}")
        tmp.symlink_to(os.path.relpath(target, self.base))
        os.replace(tmp, link)

    @contextmanager
    def locked(self, node_rank: int = 0) -> Iterator[None]:
        """Hold ``base`` for this run (on this node) when the user named it; nothing to lock
        otherwise."""
        if not self.explicit:
            yield
            return
        with lock_dir(self.base, node_rank):
            yield


@contextmanager
def lock_dir(directory: str, node_rank: int = 0) -> Iterator[None]:
    """An exclusive lock on ``directory`` for the block (per node of a multi-node training);
    InputError at once if another process holds it."""
    path = Path(directory)
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    lock = path / LOCK_FILE.format(node=node_rank)
    try:
        with _held(lock, directory):
            yield
    finally:
        if created:  # a run that wrote nothing leaves nothing behind
            with suppress(OSError):
                if [p.name for p in path.iterdir()] == [lock.name]:
                    lock.unlink()
                    path.rmdir()


@contextmanager
def _held(lock: Path, directory: str) -> Iterator[None]:
    with open(lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise InputError(f"{directory} is in use by another shardflow run:", [Problem(
                directory, f"locked by {holder}; wait for it to finish, or use another --out "
                           "(without --out every run gets its own directory)")]) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
