"""What a rank trains on: the data source of ``--data`` (or synthetic batches, or the user's model's
own batches), read from where the training stands, through the input pipeline (``rec.train.input``).

The ranks' reading position follows from the iterations: every iteration each rank takes one batch,
so after iteration ``i`` the position is the start's advanced by ``(i - start) x batch_size`` rows
(``Feed.position_at``). Checkpoints save it (``data_position.json``), and a resume reads on from
there: the same rows in the same order as a training that never stopped.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rec.data.layout import DataLayout
from rec.data.order import POSITION_FILE, POSITION_FORMAT, POSITION_FORMATS, Position
from rec.data.source import DataSource, Reading, open_source
from rec.data.synthetic import SYNTHETIC
from rec.errors import InputError, Problem
from rec.spec.types import Spec
from rec.train.config import TrainConfig
from rec.train.input import input_pipeline
from rec.train.tables import one_default_ebc

if TYPE_CHECKING:
    from rec.train.user_model import UserModel



@dataclass
class Feed:
    """A rank's batches: ``source`` (shardflow's model) or ``user`` (``--model TARGET``)."""

    source: DataSource | None
    layout: DataLayout
    one_module: bool
    batch_size: int
    start: Position
    start_iteration: int = 0
    resumed: str | None = None  # how a resume read on where it did not go on from the checkpoint's position
    user: UserModel | None = None
    iterations: int = 0  # --iterations: the batches a rank reads in all, from the first (0: not checked)

    @classmethod
    def of(cls, spec: Spec, config: TrainConfig, world_size: int, batch_size: int,
           user: UserModel | None = None) -> Feed:
        layout = DataLayout.of_spec(spec, config.dense_in_features)
        source = None if user is not None else open_source(
            config.data, spec, layout, reading(config), distinct=config.synthetic_batches)
        return cls(source, layout, one_default_ebc(spec), batch_size, Position(world_size), user=user,
                   iterations=config.iterations)

    def position_at(self, iteration: int) -> Position:
        """Where the ranks are in the data after ``iteration`` iterations."""
        if self.source is None:
            return self.start
        return self.source.advance(self.start, (iteration - self.start_iteration) * self.batch_size)

    def batches(self, rank: int, world_size: int, device: torch.device, depth: int) -> Iterator[Any]:
        """This rank's batches from ``start`` on, made in a background thread (``Prefetched``)."""
        if self.user is not None:
            return self._user_batches(rank, world_size, device)
        assert self.source is not None
        columns = self.source.batches(self.start, rank, self.batch_size)
        return input_pipeline(columns, self.source.layout, self.one_module, depth, device.type == "cuda")

    def _user_batches(self, rank: int, world_size: int, device: torch.device) -> Iterator[Any]:
        """``--model TARGET``'s batches from ``start_iteration`` on: its ``batches`` given ``start`` where
        it takes that keyword, else its batches from the first with as many as the earlier iterations
        read passed over (as an unbroken run read them; a resume once fed them again)."""
        assert self.user is not None
        fn: Callable[..., Iterator[Any]] = self.user.batches
        start, target = self.start_iteration, self.user.target
        if start and takes_start(fn):
            return UserBatches(iter(fn(rank, world_size, self.batch_size, device, start=start)), target,
                               self.iterations, made=start)
        return UserBatches(iter(fn(rank, world_size, self.batch_size, device)), target, self.iterations, skip=start)

    def resume_at(self, iteration: int, saved: dict[str, Any] | None, world_size: int) -> str | None:
        """Start reading where a checkpoint of ``iteration`` left off (``saved``: its position file);
        what was not carried over, for a progress line (None: all of it)."""
        self.start_iteration = iteration
        if self.user is not None and iteration and not takes_start(self.user.batches):
            return (f"passing over the first {iteration:,} batches of {self.user.target}'s batches, as the "
                    "iterations before the checkpoint read them (a batches(..., start=N) starts there at once)")
        if self.source is None:
            return None
        fresh = Position(world_size)
        if saved is None:
            self.start = self.source.advance(fresh, iteration * self.batch_size)
            self.resumed = "the checkpoint has no data position: the data starts at the rows an unbroken run would read"
            return self.resumed
        if self.source.identity().get("dataset") == SYNTHETIC:
            forgotten = without_data(saved)
            if forgotten is not None:
                raise InputError(RESUME_WITHOUT_DATA, [forgotten])
        # A position written before the files' stamp was kept (v1) is compared without it.
        changed = [k for k, v in self.source.identity().items() if saved.get(k) != v and (k in saved or k != "stamp")]
        position = Position(int(saved["world_size"]), int(saved["epoch"]), int(saved["rows"]),
                            tuple((int(w), int(r)) for w, r in saved["splits"]))
        problem = None if changed else self.source.position_problem(position)
        if problem is not None:
            raise InputError("Cannot resume from this checkpoint's data position:", [Problem(POSITION_FILE, (
                f"{problem}: the file was edited; resume from another checkpoint, or train from scratch"))])
        if changed:
            self.start = Position(world_size, position.epoch + 1)
            self.resumed = (f"the data or its order changed since the checkpoint ({', '.join(changed)}): reading "
                            f"starts at epoch {position.epoch + 1}")
            return self.resumed
        self.start = position.on(world_size)
        return None

    def position_record(self, position: Position) -> dict[str, Any]:
        """``position`` as ``data_position.json`` holds it: with what it means in its source."""
        return {"format": POSITION_FORMAT, "epoch": position.epoch, "rows": position.rows,
                "world_size": position.world_size, "splits": [list(s) for s in position.splits],
                **(self.source.identity() if self.source is not None else {})}

    def keep_position(self, step: Path, iteration: int) -> None:
        """Write the position after ``iteration`` iterations into the checkpoint directory ``step``."""
        from rec.disk_full import write_whole

        record = self.position_record(self.position_at(iteration))
        write_whole(step / POSITION_FILE, (json.dumps(record, indent=1) + "\n").encode())


PIPELINEABLE = ("to", "record_stream", "pin_memory")  # what the pipelines call on a batch


@dataclass
class UserBatches:
    """``--model TARGET``'s batches as the training reads them: the first ``skip`` passed over, and an
    InputError naming the target where they end before the ``needed``-th (a bare StopIteration
    failed the rank with a traceback, or ended TorchRec's pipeline)."""

    batches: Iterator[Any]
    target: str
    needed: int  # --iterations: one batch per iteration, from the first
    made: int = 0  # batches made so far, counted from the first (a resume's start=N made none before N)
    skip: int = 0

    def __iter__(self) -> UserBatches:
        return self

    def __next__(self) -> Any:
        while True:
            try:
                batch = next(self.batches)
            except StopIteration:
                if self.made < self.needed:
                    raise InputError(f"The training with {self.target} stopped:", [Problem(self.target, (
                        f"its batches ended after {self.made:,} batches; the training needs {self.needed:,} "
                        f"(--iterations {self.needed})"))]) from None
                raise
            self.made += 1
            if self.made > self.skip:
                missing = [m for m in PIPELINEABLE if not callable(getattr(batch, m, None))]
                if missing:  # an AttributeError in the pipeline failed the rank (exit 1, retried), naming nothing
                    raise InputError(f"The training with {self.target} stopped:", [Problem(self.target, (
                        f"its batches gave a {type(batch).__name__}, which has no {', '.join(missing)}: a batch is "
                        "what TrainPipelineSparseDist takes (TorchRec's Batch, rec.train.batch.ModuleBatch, or a "
                        "Pipelineable of your own)"))])
                return batch

    def close(self) -> None:
        close = getattr(self.batches, "close", None)  # a generator's: its finally blocks run now
        if close is not None:
            close()


def reading(config: TrainConfig) -> Reading:
    import os

    from rec.data.source import reader_threads

    threads = reader_threads(config.read_threads, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return Reading(seed=config.seed, shuffle=config.shuffle, window=config.shuffle_window, ids=config.ids,
                   threads=threads)


def read_position(step_dir: Path) -> dict[str, Any] | None:
    """A checkpoint's data position (None: it has none); InputError for a file shardflow did not write."""
    from rec.documents import load_json
    from rec.validation import Problems, integer, known_keys, required

    path = step_dir / POSITION_FILE
    if not path.is_file():
        return None
    try:
        record = load_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError("Cannot resume from this checkpoint:", [Problem(str(path), f"unreadable: {e}")]) from None
    problems = Problems(str(path))
    if not isinstance(record, dict) or record.get("format") not in POSITION_FORMATS:
        problems.add("format", f"expected {' or '.join(POSITION_FORMATS)}")
    else:
        known_keys(record, ["format", "epoch", "rows", "world_size", "splits", "seed", "shuffle", "window",
                            "dataset", *(["stamp"] if record["format"] != POSITION_FORMATS[0] else [])], problems)
        required(record, ["epoch", "rows", "world_size", "splits"], problems)
        for key in ("epoch", "rows"):
            problems.take_from(record, key, lambda v: integer(v, minimum=0))
        problems.take_from(record, "world_size", lambda v: integer(v, minimum=1))
        splits = record.get("splits")
        if not (isinstance(splits, list) and all(isinstance(s, list) and len(s) == 2 and
                                                 all(isinstance(x, int) and not isinstance(x, bool) for x in s)
                                                 and s[0] >= 1 and s[1] >= 0 for s in splits)):
            problems.add("splits", "expected a list of [world size, rows] pairs (world sizes at least 1)")
    problems.raise_if_any(f"Cannot resume from this checkpoint's data position {path}:")
    assert isinstance(record, dict)
    return record


RESUME_WITHOUT_DATA = "Cannot resume this training without its data:"


def without_data(saved: dict[str, Any] | None) -> Problem | None:
    """Where a resume without ``--data`` (synthetic batches) continues a checkpoint whose training read a
    dataset (``saved``: its position file): a resume that forgot the flag, which would train on
    synthetic batches, saying only that the data changed."""
    if saved is None or saved.get("dataset") in (None, SYNTHETIC):
        return None
    return Problem("--data", "is not given, but the checkpoint's training read a dataset (its "
                             f"{POSITION_FILE}): pass --data again (other data starts at the next epoch); "
                             "without it the resume would train on synthetic batches")


def takes_start(fn: Callable[..., Any]) -> bool:
    """Whether a ``--model TARGET``'s ``batches`` names the keyword ``start`` (the first iteration to
    make a batch for: a resumed training's); a ``**kwargs`` might drop it, and is not counted."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: called as the protocol says
        return False
    return any(p.name == "start" and p.kind is not p.POSITIONAL_ONLY for p in parameters)
