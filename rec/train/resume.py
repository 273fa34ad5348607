"""Resuming across a plan change: where the old checkpoint is and how its tables map to the new plan.

Torch-free, so the launcher can check a ``--resume-from`` before starting any process. Every
checkpoint directory keeps a copy of the plan it was written under (``plan.json``), which says
which tables it holds and with how many rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rec.errors import InputError, Problem
from rec.plan import Plan, read_plan

CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
STEP_PREFIX = "step_"
PLAN_COPY = "plan.json"


@dataclass(frozen=True)
class ResumeSource:
    checkpoint_dir: str  # the directory holding LATEST and the step directories
    step: int
    plan: Plan  # the plan the checkpoint was written under


def resume_source(path: str | Path) -> ResumeSource:
    """The newest checkpoint under ``path`` (a training's output directory, or its checkpoint
    directory); InputError naming what is missing."""
    root = Path(path)
    directory = root / CHECKPOINTS if (root / CHECKPOINTS).is_dir() else root
    title = f"Cannot resume from {path}:"
    if not directory.is_dir():
        raise InputError(title, [Problem(str(path), "no such directory")])
    marker = directory / LATEST
    if not marker.is_file():
        raise InputError(title, [Problem(str(directory), "holds no complete checkpoint (no LATEST file); "
                                                         "train with --checkpoint-every N first")])
    name = marker.read_text(encoding="utf-8", errors="replace").strip()
    if not name.startswith(STEP_PREFIX) or not name[len(STEP_PREFIX):].isdigit() or not (directory / name).is_dir():
        raise InputError(title, [Problem(str(marker), f"names {name!r}, which is not a checkpoint here")])
    if not (directory / PLAN_COPY).is_file():
        raise InputError(title, [Problem(str(directory), f"has no {PLAN_COPY}: the checkpoint was written "
                                                         "before shardflow recorded its plan; resume with "
                                                         "the same plan (--resume) instead")])
    return ResumeSource(str(directory), int(name[len(STEP_PREFIX):]), read_plan(directory / PLAN_COPY))


def check_resume(source: ResumeSource, new: Plan) -> None:
    """InputError if the checkpoint cannot seed a training with ``new``."""
    problems = []
    if new.previous_plan_id and new.previous_plan_id != source.plan.plan_id:
        problems.append(Problem(source.checkpoint_dir, (
            f"was written under plan {source.plan.plan_id}, but plan {new.plan_id} was replanned from "
            f"plan {new.previous_plan_id}: resume from a training of that plan")))
    if source.plan.topology.get("compute_device") != new.topology.get("compute_device"):
        problems.append(Problem(source.checkpoint_dir, "was written on another compute device"))
    if not {r["name"] for r in source.plan.spec_tables} & {r["name"] for r in new.spec_tables}:
        problems.append(Problem(source.checkpoint_dir, "shares no table with the new plan"))
    if problems:
        raise InputError(f"Cannot resume plan {new.plan_id} from this checkpoint:", problems)


@dataclass(frozen=True)
class TableChanges:
    """How the old plan's tables map onto the new one's, by name."""

    restored: tuple[str, ...]  # same rows, dim and data type: every value carries over
    resized: dict[str, tuple[int, int]]  # name -> (old rows, new rows): overlapping rows carry over
    reinitialized: tuple[str, ...]  # another dim or data type
    added: tuple[str, ...]
    removed: tuple[str, ...]


def table_changes(old: Plan, new: Plan) -> TableChanges:
    before = {r["name"]: r for r in old.spec_tables}
    restored, resized, reinitialized, added = [], {}, [], []
    for row in new.spec_tables:
        was = before.get(row["name"])
        if was is None:
            added.append(row["name"])
        elif was["embedding_dim"] != row["embedding_dim"] or was["data_type"] != row["data_type"]:
            reinitialized.append(row["name"])
        elif was["num_embeddings"] != row["num_embeddings"]:
            resized[row["name"]] = (int(was["num_embeddings"]), int(row["num_embeddings"]))
        else:
            restored.append(row["name"])
    removed = tuple(sorted(set(before) - {r["name"] for r in new.spec_tables}))
    return TableChanges(tuple(restored), resized, tuple(reinitialized), tuple(added), removed)

