"""Sharded checkpoints with torch.distributed.checkpoint: every rank writes its own shards.

A checkpoint is read without running anything from it. DCP pickles its index (``.metadata``):
``parse_index`` unpickles it with ``rec.train.restricted_pickle`` and exactly DCP's own classes as
the globals it may name, then checks it against the step's files; the other non-tensor values are
read with ``torch.load(weights_only=True)`` (``SafeLoadPlanner``).
"""

from __future__ import annotations

import collections
import enum
import functools
import io
import os
import pathlib
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem

from rec.disk_full import CheckpointWriteFailed, DiskFull, is_disk_full, write_whole, writing
from rec.errors import InputError, Problem
from rec.input_files import read_at_most
from rec.plan.io import plan_file
from rec.spec.types import Spec
from rec.train import restricted_pickle
from rec.train.collectives import Group
from rec.train.held_step import delete_unless_held
from rec.train.ownership import Run, record_writer
from rec.train.restricted_pickle import RefusedPickle
from rec.train.resume import INDEX_FILE, LATEST, PLAN_COPY, step_dir, step_name, step_of


def record_plan(directory: str | Path, plan_path: str | Path) -> None:
    """Keep a copy of the plan the checkpoints are written under (rank 0), so that a training
    with another plan can resume from them (``rec.train.resume``)."""
    if dist.get_rank() == 0:
        write_whole(Path(directory) / PLAN_COPY, plan_file(plan_path).read_bytes())


def save(directory: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         keep: int, written_by: Run, before_latest: Callable[[], None] | None = None) -> None:
    """Write step ``step`` as ``written_by``'s (``rec.train.ownership``: rank 0 records it in the step);
    LATEST names it only once every rank has finished writing (and ``before_latest``, called on
    every rank, has returned); then all but the ``keep`` newest steps are deleted (rank 0; the
    filesystem is shared by the ranks of a host, and every node prunes its own). A full disk raises
    ``DiskFull`` naming the step, another error of the OS writing a file (an I/O error, a lost mount)
    ``CheckpointWriteFailed`` naming the file; LATEST keeps naming the previous one."""
    root = Path(directory)
    path = step_dir(root, step)
    writer = dcp.FileSystemWriter(str(path))
    writer.fs = recording = _RecordingFileSystem()
    try:
        with writing(path):
            dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, storage_writer=writer)
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        _FAILED_WRITES.append(e)
        full = next((error for error in recording.errors if is_disk_full(error)), None)
        if isinstance(e, DiskFull) or (full is None and not recording.errors):
            raise
        if full is None:
            raise CheckpointWriteFailed(recording.errors[0], path) from e
        raise DiskFull(full.filename or path, full) from e
    Group.current().barrier()
    if before_latest is not None:
        before_latest()
    if dist.get_rank() == 0:
        record_writer(path, written_by)
        write_whole(root / LATEST, step_name(step))
        prune(root, keep)
    Group.current().barrier()


# A failed save's error, with the frames it holds, is never freed: on Python 3.12 with torch 2.11 (the GPU image's)
# the garbage collector freeing what a write that raised left behind crashed the process (SIGSEGV),
# so a rank whose disk failed could die before it said why. A rank ends soon after a failed save.
_FAILED_WRITES: list[BaseException] = []


class _RecordingFileSystem(FileSystem):
    """DCP's file system, remembering the OS errors of the writes to its files: torch.save's zip
    writer turns them into RuntimeErrors ("unexpected pos") that no longer say the disk is full, or
    which file failed and why."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[OSError] = []

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        with super().create_stream(path, mode) as stream:
            yield stream if "r" in mode else cast(io.IOBase, _RecordingStream(stream, str(path), self.errors))


class _RecordingStream:
    def __init__(self, stream: io.IOBase, path: str, errors: list[OSError]):
        self._stream, self._path, self._errors = stream, path, errors

    def write(self, data: Any) -> int:
        try:
            return int(self._stream.write(data))
        except OSError as e:
            self._record(e)
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self._record(e)
            raise

    def _record(self, error: OSError) -> None:
        if error.filename is None:
            error.filename = self._path
        self._errors.append(error)

    def __getattr__(self, name: str) -> Any:  # tell, fileno, ...
        return getattr(self._stream, name)


def steps(directory: str | Path) -> list[Path]:
    """The checkpoint directories, oldest first."""
    root = Path(directory)
    found = [p for p in root.iterdir() if step_of(p.name) is not None and p.is_dir()] if root.is_dir() else []
    return sorted(found, key=lambda p: step_of(p.name) or 0)


def prune(directory: str | Path, keep: int) -> None:
    """Keep the ``keep`` newest complete checkpoints up to the one LATEST names (which is one) and
    delete the other steps before it, complete or not (an incomplete one is a write that failed),
    but those another process is reading (``rec.train.held_step``): a later pruning deletes them.
    A step after LATEST's is left as it is: none is being written when LATEST has just moved."""
    root = Path(directory)
    newest = step_of((root / LATEST).read_text().strip())
    if newest is None:
        return
    chain = [s for s in steps(root) if (step_of(s.name) or 0) <= newest]
    kept = {s.name for s in [s for s in chain if (s / INDEX_FILE).is_file()][-keep:]} | {step_name(newest)}
    for old in chain:
        if old.name not in kept:
            delete_unless_held(old)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's loader, but the non-tensor values of a checkpoint (optimizer step counts, learning
    rates) are read with ``weights_only=True``: a checkpoint someone else wrote cannot run code."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._nested_dict import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class CheckpointMetadataError(ValueError):
    """A checkpoint's ``.metadata`` (its index) is refused: it needs more than DCP's own classes,
    is malformed, or points at data the checkpoint does not have. Nothing in it was run."""


MAX_INDEX_BYTES = 1 << 30  # far above the index of any real checkpoint; a bound on what is read


@functools.cache
def index_globals() -> dict[tuple[str, str], Any]:
    """Exactly what torch.distributed.checkpoint pickles into an index, by the (module, qualname)
    pair pickle writes for each: DCP's metadata classes, the filesystem writer's per-item storage
    info, and the torch values they hold (sizes, dtypes, the layout)."""
    from torch.distributed.checkpoint import metadata

    classes: list[type] = [
        metadata.Metadata, metadata.StorageMeta, metadata.MetadataIndex, metadata.TensorStorageMetadata,
        metadata.BytesStorageMetadata, metadata.ChunkStorageMetadata, metadata.TensorProperties,
        metadata._MEM_FORMAT_ENCODING, _StorageInfo, torch.Size, collections.OrderedDict,
        pathlib.PurePosixPath, pathlib.PosixPath,
    ]
    allowed: dict[tuple[str, str], Any] = {(c.__module__, c.__qualname__): c for c in classes}
    allowed.update({("pathlib", c.__name__): c for c in (pathlib.PurePosixPath, pathlib.PosixPath)})
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    # how Python 3.11.0-3.11.2 pickle an enum member (protocols before 3 name the module __builtin__)
    allowed.update({(module, "getattr"): _enum_member for module in ("builtins", "__builtin__")})
    allowed.update({("torch", str(v).removeprefix("torch.")): v for v in vars(torch).values()
                    if isinstance(v, torch.dtype)})
    return allowed


def _enum_member(owner: object, name: object) -> enum.Enum:
    """``getattr(owner, name)`` only for a member of an allowed enum: Python 3.11.0-3.11.2 pickle a
    member so (``_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT`` in every index), later ones as
    ``owner(value)``."""
    if isinstance(owner, type) and issubclass(owner, enum.Enum) and isinstance(name, str) and name in owner.__members__:
        return owner[name]
    raise RefusedPickle(f"asks for the attribute {str(name)[:60]!r} of {str(owner)[:60]}, which is no enum member")


def parse_index(data: bytes, step_dir: Path) -> Metadata:
    """The index ``data`` of the checkpoint in ``step_dir``, unpickled with ``index_globals`` only
    and checked against the step's files; CheckpointMetadataError otherwise."""
    try:
        metadata = restricted_pickle.load(data, index_globals())
    except RefusedPickle as e:
        raise CheckpointMetadataError(f"not a checkpoint index shardflow reads: it {e}; nothing in it "
                                      "was run") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointMetadataError(f"not a checkpoint index: it holds a {type(metadata).__name__}")
    try:
        problem = _incomplete(step_dir, metadata)
    except (AttributeError, TypeError, ValueError) as e:  # fields missing or of other types
        problem = f"it is malformed ({type(e).__name__}: {str(e)[:100]})"
    if problem:
        raise CheckpointMetadataError(f"the checkpoint is incomplete or malformed: {problem}")
    return metadata


def _incomplete(step_dir: Path, metadata: Metadata) -> str | None:
    """What the index promises that the step directory lacks (None: nothing)."""
    storage = metadata.storage_data
    if not isinstance(storage, dict) or not isinstance(metadata.state_dict_metadata, dict):
        return "it has no storage entries"
    needed: dict[str, int] = {}
    for key, info in storage.items():
        if not (isinstance(key, MetadataIndex) and isinstance(info, _StorageInfo)
                and isinstance(info.relative_path, str) and type(info.offset) is int
                and type(info.length) is int and info.offset >= 0 and info.length >= 0):
            return "a storage entry is malformed"
        name = info.relative_path
        if name in ("", ".", "..") or Path(name).name != name:
            return f"it points outside its directory ({name[:100]!r})"
        needed[name] = max(needed.get(name, 0), info.offset + info.length)
    for fqn, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            keys = [MetadataIndex(fqn, chunk.offsets) for chunk in entry.chunks]
        elif isinstance(entry, BytesStorageMetadata):
            keys = [MetadataIndex(fqn)]
        else:
            return f"entry {str(fqn)[:100]!r} is malformed"
        if any(k not in storage for k in keys):
            return f"it has no data for {str(fqn)[:100]!r}"
    for name, size in sorted(needed.items()):
        path = step_dir / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size < size:
            return f"{name} has {path.stat().st_size} bytes, the index needs {size}"
    return None


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file reader, but the index is read with ``parse_index``: no code from it runs."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as file:
            data = read_at_most(cast(BinaryIO, file), MAX_INDEX_BYTES)
        if len(data) > MAX_INDEX_BYTES:
            raise CheckpointMetadataError(f"not a checkpoint index: it is larger than {MAX_INDEX_BYTES} bytes")
        metadata = parse_index(data, Path(str(self.path)))
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


def read_index(path: str | Path) -> Metadata:
    """The index of the checkpoint at ``path``, read safely (no torch.distributed needed)."""
    return SafeFileSystemReader(str(path)).read_metadata()


def check_index(step: str | Path, spec: Spec | None = None,
                title: str = "Cannot resume from this checkpoint:") -> Metadata:
    """The index of the checkpoint in ``step``, read safely; InputError naming it when it is
    refused or unreadable (bad input: exit 2, and no retry would help), or, given the ``spec`` of
    the model it should hold, where its tables' weights are of other sizes or other tables
    (``table_problems``). Called before DCP reads it: DCP would only log a refusal and fall back to
    per-rank indexes, and a table of another size fails every rank once launched."""
    where = str(Path(step) / INDEX_FILE)
    try:
        metadata = read_index(step)
    except (CheckpointMetadataError, OSError) as e:
        reason = f"cannot be read ({e.strerror or e})" if isinstance(e, OSError) else str(e)
        raise InputError(title, [Problem(where, reason)]) from None
    problems = [] if spec is None else table_problems(metadata, spec, where)
    if problems:
        raise InputError(title, problems)
    return metadata


# An embedding table's weight in a model's state_dict, as TorchRec's bag and embedding collections name it.
_TABLE_WEIGHT = re.compile(r"\.(?:embedding_bags|embeddings)\.([^.]+)\.weight$")


def table_problems(metadata: Metadata, spec: Spec, where: str) -> list[Problem]:
    """Where the index's table weights are not ``spec``'s tables (by name, rows x dim): a step of another
    model's training. None where it names no table weight as TorchRec's collections do (a model of the
    user's own may name them otherwise)."""
    shapes: dict[str, set[tuple[int, int]]] = {}
    for t in spec.tables:
        shapes.setdefault(t.name, set()).add((t.num_embeddings, t.embedding_dim))
    by_module: dict[str, dict[str, tuple[int, ...]]] = {}
    for fqn, entry in metadata.state_dict_metadata.items():
        match = _TABLE_WEIGHT.search(str(fqn))
        if match and isinstance(entry, TensorStorageMetadata):
            by_module.setdefault(str(fqn)[:match.start()], {}).setdefault(match.group(1), tuple(entry.size))
    # The collections are the modules holding a table of the spec: a dense block of the user's named
    # `embeddings` (HuggingFace's `bert.embeddings.word_embeddings`) holds none, and is no collection.
    collections = [tables for tables in by_module.values() if set(tables) & set(shapes)] or list(by_module.values())
    found: dict[str, tuple[int, ...]] = {}
    for tables in collections:
        for name, size in tables.items():
            found.setdefault(name, size)
    if not found:
        return []
    problems = []
    for name, size in sorted(found.items()):
        if name not in shapes:
            problems.append(Problem(where, f"holds table {name!r}, which the model has not: a step of another "
                                           "model's training"))
        elif size not in shapes[name]:
            rows, dim = sorted(shapes[name])[0]
            shown = " x ".join(f"{n:,}" for n in size)
            problems.append(Problem(where, f"table {name!r} is {shown} here, {rows:,} x {dim} in the model: a step "
                                           "of another model's training"))
    problems += [Problem(where, f"holds no weights of table {name!r}: a step of another model's training")
                 for name in sorted(set(shapes) - set(found))]
    return problems


_MISSING_OPTIMIZER_STATE = re.compile(r"Missing key in checkpoint state_dict: (optim\.\S+?)\.?(?:\s|$)")
# DCP's words for a parameter the checkpoint holds at another shape, or not at all
_OTHER_MODEL = re.compile(r"Size mismatch between saved .+? and current: .+? for \S+|"
                          r"Missing key in checkpoint state_dict: model\.\S+")


def load(directory: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load step ``step`` in place into the (already sharded) model and optimizer; InputError if
    its index is refused."""
    optim = optimizer.state_dict()
    # A stateless optimizer's parameters (a table's fused SGD) have an empty state, which DCP saves
    # nothing of but would look for on load ("Missing key"): there is nothing to load for them.
    stateless = {key for key, value in optim["state"].items() if isinstance(value, dict) and not value}
    state = {"model": model.state_dict(),
             "optim": {**optim, "state": {k: v for k, v in optim["state"].items() if k not in stateless}}}
    path = step_dir(directory, step)
    check_index(path)
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner())
    except CheckpointException as e:  # every rank's, with the first failure's text
        missing = _MISSING_OPTIMIZER_STATE.search(str(e))
        other = _OTHER_MODEL.search(str(e))
        if missing is None and other is not None:  # the same on every retry: bad input, not a crash
            raise InputError("Cannot resume from the checkpoint:", [Problem(str(path), (
                f"holds another model ({other.group(0).rstrip('.')}): resume with the model it was trained with, "
                "or start anew from what fits with --resume-from"))]) from None
        if missing is None:
            raise
        raise InputError("Cannot resume from the checkpoint:", [Problem(str(path), (
            f"holds no {missing.group(1)}, the state of an optimizer this training steps: the checkpoint of "
            "another model, or one an earlier shardflow wrote, which replaced the optimizer a model's code "
            "applies to a dense parameter by its own (CHANGELOG): train from scratch"))]) from None
    model.load_state_dict(state["model"])
    optimizer.load_state_dict({**state["optim"], "state": {**state["optim"]["state"], **{k: {} for k in stateless}}})
