"""Where a run's outputs go, so that no run overwrites another's.

Without ``--out``, every run gets its own directories under ``out/``: the plan in
``out/<plan_id>/plan`` (identical bytes for every run of the same plan) and each training in
``out/<plan_id>/train-<UTC time>-<random>``; ``out/latest`` points at the newest run's directory.
With an explicit ``--out DIR`` the files go directly where they always went (``DIR/plan``,
``DIR/train`` for the pipeline; ``DIR`` for ``shardflow train``), and the directory is locked for
the run, ranks included (``rec.train.lifetime``): a second run into it is refused at once with a
message, instead of mixing the two.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rec.errors import InputError, Problem
from rec.file_lock import holding_directory, process_alive, take
from rec.train.lifetime import OUT_LOCK_ENV
from tasks.paths import DEFAULT_OUT, PLAN_SUBDIR, TRAIN_SUBDIR, in_work_dir

LOCK_FILE = ".shardflow-node{node}.lock"  # the nodes of one multi-node training share a directory
LATEST = "latest"
MAX_HOLDER_BYTES = 4096  # of "pid N since ...", read to say who holds a directory


@dataclass(frozen=True)
class RunDirs:
    """The output layout of one run: ``base`` given by the user (explicit) or the default."""

    base: str
    explicit: bool

    @classmethod
    def of(cls, out_dir: str | None, work_dir: str | None = None) -> RunDirs:
        """``out_dir`` as the user named it, or the default layout in ``work_dir`` (none: here)."""
        return cls(out_dir, True) if out_dir else cls(in_work_dir(work_dir, DEFAULT_OUT), False)

    def plan_dir(self, plan_id: str) -> str:
        return str(Path(self.base, PLAN_SUBDIR) if self.explicit else Path(self.base, plan_id, PLAN_SUBDIR))

    def train_dir(self, plan_id: str, nested: bool = True, kind: str = TRAIN_SUBDIR) -> str:
        """A new training directory (explicit: ``base/train``, or ``base`` itself when not
        ``nested``, as ``shardflow train --out DIR`` writes). ``kind`` names another run of the
        plan the same way (``measure``: ``out/<plan_id>/measure-<UTC time>-<random>``)."""
        if self.explicit:
            return str(Path(self.base, kind) if nested else Path(self.base))
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return str(Path(self.base, plan_id, f"{kind}-{stamp}-{secrets.token_hex(2)}"))

    def mark_latest(self, target: str) -> None:
        """Point ``base/latest`` at ``target`` (default layout only), atomically."""
        if self.explicit:
            return
        link = Path(self.base, LATEST)
        tmp = Path(self.base, f".{LATEST}-{os.getpid()}-{secrets.token_hex(2)}")
        tmp.symlink_to(os.path.relpath(target, self.base))
        os.replace(tmp, link)

    @contextmanager
    def locked(self, node_rank: int = 0, nodes: int = 1) -> Iterator[None]:
        """Hold ``base`` for this run (on node ``node_rank`` of ``nodes``) when the user named it; nothing
        to lock otherwise."""
        if not self.explicit:
            yield
            return
        with lock_dir(self.base, node_rank, nodes):
            yield


@contextmanager
def lock_dir(directory: str, node_rank: int = 0, nodes: int = 1) -> Iterator[None]:
    """Hold ``directory`` for the block (per node of a multi-node training of ``nodes``); InputError at
    once if any process of another run holds it. The lock is taken exclusively (no one else holds it),
    then shared with the training ranks (``OUT_LOCK_ENV`` names the file for them: they hold it too, so
    the directory stays taken while any rank lives, even after this process died)."""
    def refused(text: str) -> InputError:
        # Of a training of several nodes sharing --out, the holder is most likely a node given the same
        # --node-rank: "use another --out" would split the nodes' outputs instead.
        advice = (f"if it is a node of this training, give each of the {nodes} nodes its own --node-rank (0 to "
                  f"{nodes - 1}); else wait for it to finish" if nodes > 1 else
                  "wait for it to finish, or use another --out (without --out every run gets its own directory)")
        return InputError(f"{directory} is in use by another shardflow run:", [Problem(
            directory, f"locked by {_holder(text)}; {advice}")])

    holder = f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    with holding_directory(directory, LOCK_FILE.format(node=node_rank), holder, refused, MAX_HOLDER_BYTES) as lock:
        previous = os.environ.get(OUT_LOCK_ENV)
        os.environ[OUT_LOCK_ENV] = str(lock.resolve())
        try:
            yield
        finally:
            _restore(OUT_LOCK_ENV, previous)


def run_in(directory: str | Path) -> str | None:
    """Who holds ``directory`` for a run (``lock_dir``), as the refusal of a second run names it; None
    where no process does. Only looks: a run starting meanwhile is not kept out."""
    for lock in sorted(Path(directory).glob(LOCK_FILE.format(node="*"))):
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # gone, a link or something else in its place: no run's lock
            continue
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
            text = os.pread(fd, MAX_HOLDER_BYTES, 0).decode("utf-8", "replace") if regular else ""
            if not text.strip():  # cleared by its last holder: no run there
                continue
            try:
                take(fd, blocking=False)
            except BlockingIOError:
                return _holder(text)
        finally:
            os.close(fd)
    return None


def _holder(text: str) -> str:
    """Who holds the lock, from what its launcher wrote ("pid N since ..."), saying so when that
    launcher is gone and only processes it started hold it."""
    text = text.strip()
    words = text.split()
    if len(words) >= 2 and words[0] == "pid" and words[1].isdigit() and not process_alive(int(words[1])):
        return f"the training processes of {text} (that launcher is gone; they stop within seconds)"
    return text or "another process"


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
