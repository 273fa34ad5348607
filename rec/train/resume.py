"""Resuming across a plan change: where the old checkpoint is and how its tables map to the new plan.

Torch-free, so the launcher can check a ``--resume-from`` before starting any process. Every
checkpoint directory keeps a copy of the plan it was written under (``plan.json``), which says
which tables it holds and with how many rows. Tables are matched by key (``table_key``: the name in
the default module, ``module.name`` in another), as tables of two modules may share a name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rec.errors import InputError, Problem
from rec.plan import PLAN_FILE, Plan, read_plan
from rec.sharding import Pooling
from rec.spec.types import Spec, row_key
from rec.train.config import TrainConfig

CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
STEP_PREFIX = "step_"
PLAN_COPY = PLAN_FILE  # the checkpoint directory's copy of its plan
INDEX_FILE = ".metadata"  # torch.distributed.checkpoint's name for a checkpoint's index


def checkpoint_dir(config: TrainConfig, out_dir: str | Path) -> str | None:
    """Where a training's checkpoints are written and read; None when it neither writes nor resumes."""
    if config.checkpoint_dir:
        return config.checkpoint_dir
    if config.checkpoint_every or config.resume:
        return str(Path(out_dir) / CHECKPOINTS)
    return None


def step_name(step: int) -> str:
    """The name of step ``step``'s checkpoint directory (``step_00000009``), as LATEST holds it."""
    return f"{STEP_PREFIX}{step:08d}"


def step_of(name: str) -> int | None:
    """The step a checkpoint directory's name says; None for a name that is no step's."""
    number = name.removeprefix(STEP_PREFIX)
    return int(number) if name.startswith(STEP_PREFIX) and number.isdigit() else None


def step_dir(directory: str | Path, step: int) -> Path:
    return Path(directory) / step_name(step)


def latest(directory: str | Path) -> int | None:
    """The step that ``directory``'s LATEST names (None: no LATEST, no complete checkpoint);
    InputError if it names no checkpoint there."""
    name = _latest_name(Path(directory))
    if name is None:
        return None
    step = step_of(name)
    if step is None or not (Path(directory) / name).is_dir():
        raise NoLatestStep(f"Cannot resume from {directory}:", [
            Problem(str(Path(directory) / LATEST), f"names {name[:100]!r}, which is not a checkpoint here")])
    return step


def _latest_name(directory: Path) -> str | None:
    """What ``directory``'s LATEST says (None: there is none)."""
    marker = directory / LATEST
    if not marker.is_file():
        return None
    return marker.read_text(encoding="utf-8", errors="replace").strip()


def _named_step(directory: Path) -> int | None:
    """The step LATEST names in ``directory``, whether or not it is still there (None: no LATEST)."""
    name = _latest_name(directory)
    return None if name is None else step_of(name)


class NoLatestStep(InputError):
    """LATEST names no checkpoint in its directory: a hand edit, or a step its training pruned since
    (``rec.train.held_step`` looks again)."""


@dataclass(frozen=True)
class ResumeSource:
    checkpoint_dir: str  # the directory holding LATEST and the step directories
    step: int
    plan: Plan  # the plan the checkpoint was written under


def resume_source(path: str | Path) -> ResumeSource:
    """The checkpoint ``path`` names (``checkpoint_at``: a training's output directory, its checkpoint
    directory, or one step in it) and the plan it was written under; InputError naming what is missing."""
    directory, step = checkpoint_at(path, resume_title(path), RESUME_HINT)
    return source_at(path, directory, step)


RESUME_HINT = "; train with --checkpoint-every N first"  # where a resume finds no checkpoint


def resume_title(path: str | Path) -> str:
    return f"Cannot resume from {path}:"


def source_at(path: str | Path, directory: Path, step: int) -> ResumeSource:
    """``resume_source`` of step ``step`` of ``directory``, which ``path`` named."""
    if not (directory / PLAN_COPY).is_file():
        raise InputError(resume_title(path), [Problem(str(directory), (
            f"has no {PLAN_COPY}: the checkpoint was written before shardflow recorded its plan; resume with the "
            "same plan (--resume) instead"))])
    return ResumeSource(str(directory), step, read_plan(directory / PLAN_COPY))


def beyond_iterations(directory: str | Path, newest: int, iterations: int) -> InputError:
    """The refusal of a resume whose newest checkpoint (of iteration ``newest``) is beyond
    ``--iterations``: before launch (``tasks.train``) and in the ranks (a restart)."""
    return InputError("Nothing left to train:", [Problem(
        str(directory), f"the newest checkpoint is of iteration {newest}; --iterations {iterations} must be above "
                        "it to train on")])


def another_plans(directory: str | Path, plan: Plan) -> Problem | None:
    """For ``--resume``: where the checkpoints in ``directory`` were written under another plan than
    ``plan`` (its plan copy says so), the Problem naming it; None for the same plan or no copy. The
    ranks would reshard them, but the checkpoints and the training's iterations would then mix plans."""
    copy = Path(directory) / PLAN_COPY
    if not copy.is_file():
        return None
    written = read_plan(copy)
    if written.plan_id == plan.plan_id:
        return None
    return Problem(str(directory), (
        f"holds plan {written.plan_id}'s checkpoints, not plan {plan.plan_id}'s: --resume goes on with "
        f"their plan; --resume-from this directory, with another --out, starts plan {plan.plan_id} from them"))


def check_one_training(plan: Plan, model_spec: Spec, directory: Path, title: str) -> None:
    """InputError where a checkpoint directory's plan copy plans other tables than its ``model.json``
    records (``model_spec``): files of two trainings in one directory."""
    if plan.spec.spec_hash != model_spec.spec_hash:
        raise InputError(title, [Problem(str(directory / PLAN_COPY), (
            f"plans other tables than model.json records (spec {plan.spec.spec_hash} against "
            f"{model_spec.spec_hash}): it is another training's"))])


def checkpoint_at(path: str | Path, title: str = "", hint: str = "") -> tuple[Path, int]:
    """The checkpoint ``path`` names: one step directory (``.../step_00000100``), or a checkpoint
    directory or training output directory (its newest step); InputError naming what is missing."""
    from rec.train.owned_folders import folder_problems

    p = Path(path)
    title = title or f"Cannot use the checkpoint {path}:"
    step = step_of(p.name)
    if step is not None and p.is_dir() and (p / INDEX_FILE).is_file():
        problems = folder_problems(p.parent, made=False)
        named = _named_step(p.parent)
        if not problems and named is None:  # LATEST never named it: maybe not all written
            problems = [Problem(str(p), (
                "has no LATEST beside it, which names a checkpoint once every rank has written it: its "
                "training completed none there (it stopped, failed or diverged first), or the step was "
                "copied without LATEST; copy LATEST with it"))]
        elif not problems and named is not None and step > named:
            problems = [Problem(str(p), (
                f"is not complete: LATEST names {step_name(named)}, an earlier one (its training stopped, "
                f"failed or diverged before completing this one, or is writing it now); use {p.parent} "
                "(its LATEST) or an earlier step"))]
        if problems:
            raise InputError(title, problems)
        return p.parent, step
    made = os.path.lexists(p / CHECKPOINTS)  # a training's output directory: shardflow made its checkpoints
    root = p / CHECKPOINTS if made else p
    if not made and not root.is_dir():
        raise InputError(title, [Problem(str(path), "no such directory")])
    problems = folder_problems(root, made)
    if problems:
        raise InputError(title, problems)
    newest = latest(root)
    if newest is None:
        raise InputError(title, [Problem(str(root), f"holds no complete checkpoint (no LATEST file){hint}")])
    return root, newest


def check_resume(source: ResumeSource, new: Plan) -> None:
    """InputError if the checkpoint cannot seed a training with ``new``."""
    problems = []
    if new.previous_plan_id and new.previous_plan_id != source.plan.plan_id:
        problems.append(Problem(source.checkpoint_dir, (
            f"was written under plan {source.plan.plan_id}, but plan {new.plan_id} was replanned from "
            f"plan {new.previous_plan_id}: resume from a training of that plan")))
    if source.plan.topology.compute_device != new.topology.compute_device:
        problems.append(Problem(source.checkpoint_dir, "was written on another compute device"))
    if not {row_key(r) for r in source.plan.spec_tables} & {row_key(r) for r in new.spec_tables}:
        problems.append(Problem(source.checkpoint_dir, "shares no table with the new plan"))
    if problems:
        raise InputError(f"Cannot resume plan {new.plan_id} from this checkpoint:", problems)


@dataclass(frozen=True)
class TableChanges:
    """How the old plan's tables map onto the new one's, by table key."""

    restored: tuple[str, ...]  # same rows, dim and data type: every value carries over
    resized: dict[str, tuple[int, int]]  # key -> (old rows, new rows): overlapping rows carry over
    reinitialized: tuple[str, ...]  # another dim or data type
    added: tuple[str, ...]
    removed: tuple[str, ...]


def table_changes(old: Plan, new: Plan) -> TableChanges:
    before = {row_key(r): r for r in old.spec_tables}
    restored, resized, reinitialized, added = [], {}, [], []
    for row in new.spec_tables:
        key = row_key(row)
        was = before.get(key)
        if was is None or _unpooled(was) != _unpooled(row):  # another module kind: its weights are elsewhere
            added.append(key)
        elif was["embedding_dim"] != row["embedding_dim"] or was["data_type"] != row["data_type"]:
            reinitialized.append(key)
        elif was["num_embeddings"] != row["num_embeddings"]:
            resized[key] = (int(was["num_embeddings"]), int(row["num_embeddings"]))
        else:
            restored.append(key)
    removed = tuple(sorted(set(before) - {row_key(r) for r in new.spec_tables}))
    return TableChanges(tuple(restored), resized, tuple(reinitialized), tuple(added), removed)



def _unpooled(row: dict[str, object]) -> bool:
    """Whether a spec row's table is an EmbeddingCollection's (pooling NONE)."""
    return row.get("pooling") == Pooling.NONE.value
