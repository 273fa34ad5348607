"""Sharded checkpoints with torch.distributed.checkpoint: every rank writes its own shards."""

from __future__ import annotations

import io
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from rec.train.resume import LATEST, PLAN_COPY, STEP_PREFIX


def record_plan(directory: str | Path, plan_path: str | Path) -> None:
    """Keep a copy of the plan the checkpoints are written under (rank 0), so that a training
    with another plan can resume from them (``rec.train.resume``)."""
    root = Path(directory)
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{PLAN_COPY}.tmp"
        source = Path(plan_path)
        tmp.write_bytes((source / PLAN_COPY if source.is_dir() else source).read_bytes())
        tmp.replace(root / PLAN_COPY)


def save(directory: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         keep: int) -> None:
    """Write step ``step``; LATEST names it only once every rank has finished writing; then all
    but the ``keep`` newest steps are deleted (rank 0; the filesystem is shared by the ranks of
    a host, and every node prunes its own)."""
    root = Path(directory)
    path = root / f"{STEP_PREFIX}{step:08d}"
    dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = root / f".{LATEST}.tmp"
        tmp.write_text(path.name)
        tmp.replace(root / LATEST)
        prune(root, keep)
    dist.barrier()


def steps(directory: str | Path) -> list[Path]:
    """The checkpoint directories, oldest first."""
    root = Path(directory)
    return sorted(p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir()) if root.is_dir() else []


def prune(directory: str | Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints (never the one LATEST names)."""
    latest = (Path(directory) / LATEST).read_text().strip()
    for old in steps(directory)[:-keep]:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)


def latest_step(directory: str | Path) -> int | None:
    marker = Path(directory) / LATEST
    if not marker.exists():
        return None
    return int(marker.read_text().strip().removeprefix(STEP_PREFIX))


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
    """A checkpoint's ``.metadata`` names something a DCP index never contains."""


# What torch.distributed.checkpoint pickles into a checkpoint's ``.metadata`` (its index).
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _IndexUnpickler(pickle.Unpickler):
    """Resolves only the classes of a DCP index and torch dtypes: a crafted ``.metadata``
    cannot name a function to call (Python's "restricting globals")."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _METADATA_MODULES or (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointMetadataError(f"checkpoint index names {module}.{name}, which a "
                                      "torch.distributed.checkpoint index never contains")


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file reader, but the index is unpickled with ``_IndexUnpickler``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as file:
            metadata = _IndexUnpickler(file).load()
        if not isinstance(metadata, Metadata):
            raise CheckpointMetadataError("checkpoint index is not a torch.distributed.checkpoint Metadata")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


def read_index(path: str | Path) -> Metadata:
    """The index of the checkpoint at ``path``, read safely (no torch.distributed needed)."""
    return SafeFileSystemReader(str(path)).read_metadata()


def load(directory: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load step ``step`` in place into the (already sharded) model and optimizer."""
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    path = Path(directory) / f"{STEP_PREFIX}{step:08d}"
    dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner())
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
