"""Sharded checkpoints with torch.distributed.checkpoint: every rank writes its own shards."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
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


def load(directory: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load step ``step`` in place into the (already sharded) model and optimizer."""
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.load(state, checkpoint_id=str(Path(directory) / f"{STEP_PREFIX}{step:08d}"), planner=SafeLoadPlanner())
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
