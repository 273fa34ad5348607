"""Sharded checkpoints with torch.distributed.checkpoint: every rank writes its own shards."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

LATEST = "LATEST"


def save(directory: str | Path, step: int, model, optimizer) -> None:
    """Write step ``step``; LATEST names it only once every rank has finished writing."""
    root = Path(directory)
    path = root / f"step_{step:08d}"
    dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = root / f".{LATEST}.tmp"
        tmp.write_text(path.name)
        tmp.replace(root / LATEST)
    dist.barrier()


def latest_step(directory: str | Path) -> int | None:
    marker = Path(directory) / LATEST
    if not marker.exists():
        return None
    return int(marker.read_text().strip().removeprefix("step_"))


def load(directory: str | Path, step: int, model, optimizer) -> None:
    """Load step ``step`` in place into the (already sharded) model and optimizer."""
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.load(state, checkpoint_id=str(Path(directory) / f"step_{step:08d}"))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
