"""A sharded checkpoint read back whole, for tests that compare tensors across plans."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def full_state(step_dir: Path, tmp: Path) -> dict[str, Any]:
    """Every tensor of a sharded checkpoint, whole, flattened (one process, no process group)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{step_dir.parent.parent.name}-{step_dir.name}.pt"
    dcp_to_torch_save(str(step_dir), str(out))
    state = torch.load(out, weights_only=False)  # our own file, just written

    def flat(d: dict, prefix: str = "") -> dict:
        items: dict = {}
        for k, v in d.items():
            items.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return items

    return flat(state)
