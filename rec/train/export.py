"""``shardflow export``: a checkpoint's model, unsharded, as ``model.safetensors`` and ``model.json``.

The checkpoint (``torch.distributed.checkpoint``, one shard per rank) is read in this one process
into the model built on the CPU from the checkpoint's ``model.json`` (``rec.train.model_file``): every
table whole, whatever the plan that sharded it. The weights are written with safetensors (no
pickle: loading them runs no code), beside ``model.json`` naming the plan and step they come from
and every tensor. ``rec.train.predict`` and plain Python load them back (docs/training.md).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from rec.disk_full import whole, write_whole
from rec.errors import InputError, Problem
from rec.sharding import Pooling
from rec.spec.types import Spec, TableSpec
from rec.train.checkpoint import SafeFileSystemReader, SafeLoadPlanner, check_index
from rec.train.held_step import held_checkpoint
from rec.train.model import build_model
from rec.train.model_file import MODEL_FILE, ModelSettings, read_model, settings_to_dict, unrecorded
from rec.train.rank_log import one_line
from rec.train.resume import PLAN_COPY, check_one_training, step_dir

WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class Exported:
    out_dir: Path
    plan_id: str
    step: int
    tensors: int
    parameters: int


def load_checkpoint(path: str | Path) -> tuple[nn.Module, ModelSettings, str, int]:
    """The model of the checkpoint at ``path`` (a checkpoint directory: its newest step; one step;
    or a training's output directory), unsharded on the CPU, in eval mode; its settings, plan and step.
    The step is held while it is read: its training, going on, does not prune it meanwhile."""
    with held_checkpoint(path) as (directory, step):
        return _load(path, directory, step)


def _load(path: str | Path, directory: Path, step: int) -> tuple[nn.Module, ModelSettings, str, int]:
    if not (directory / MODEL_FILE).is_file():
        raise InputError(f"Cannot use the checkpoint {path}:", [Problem(str(directory), unrecorded([MODEL_FILE]))])
    settings, _ = read_model(directory)
    from rec.plan import read_plan

    plan_id = ""
    if (directory / PLAN_COPY).is_file():
        plan = read_plan(directory / PLAN_COPY)
        check_one_training(plan, settings.spec, directory, f"Cannot use the checkpoint {path}:")
        plan_id = plan.plan_id
    at = step_dir(directory, step)
    check_index(at, settings.spec, f"Cannot use the checkpoint {path}:")
    model = build_model(settings.spec, settings.config(), torch.device("cpu"), "cpu")
    state = model.state_dict()
    try:
        dcp.load({"model": state}, storage_reader=SafeFileSystemReader(str(at)), planner=SafeLoadPlanner(),
                 no_dist=True)
    except (RuntimeError, ValueError, KeyError, CheckpointException) as e:  # CheckpointException: a BaseException
        raise InputError(f"Cannot use the checkpoint {at}:", [Problem(
            str(at), f"does not hold this model's weights ({one_line(e)})")]) from None  # its rank's own error
    model.load_state_dict(state)
    return model.eval(), settings, plan_id, step


def export(checkpoint: str | Path, out_dir: str | Path) -> Exported:
    """Write the checkpoint's model, unsharded, into ``out_dir`` (created; refused if it holds a model)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():  # found before the checkpoint is read, not at the write
        raise InputError("Cannot export here:", [Problem(str(out), "is a file, not a folder: --out names the folder "
                                                                   "the model goes into; give a new --out")])
    if (out / WEIGHTS_FILE).exists() or (out / MODEL_FILE).exists():
        raise InputError("Cannot export here:", [Problem(str(out), "already holds an exported model; "
                                                                   "give a new --out")])
    model, settings, plan_id, step = load_checkpoint(checkpoint)
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    out.mkdir(parents=True, exist_ok=True)
    record = settings_to_dict(settings, plan_id=plan_id, step=step,
                              tensors={name: list(t.shape) for name, t in tensors.items()})
    with whole(out / WEIGHTS_FILE) as path:
        _save_weights(tensors, path, out / WEIGHTS_FILE)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(path, 0o666 & ~mask)  # as model.json is made, not safetensors' owner-only mode
    try:
        write_whole(out / MODEL_FILE, json.dumps(record, indent=1) + "\n")
    except BaseException:  # weights without their model.json: a new export there would be refused
        (out / WEIGHTS_FILE).unlink(missing_ok=True)
        raise
    return Exported(out, plan_id, step, len(tensors), sum(t.numel() for t in tensors.values()))


_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors (Rust) names the OS error behind a failed write


def _save_weights(tensors: dict[str, torch.Tensor], path: Path, final: Path) -> None:
    """safetensors' ``save_file`` into ``path``, which becomes ``final``; an OS error behind its failure
    raised as the OSError it is, naming ``final`` (a full disk: ``DiskFull`` through ``whole``)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        found = _OS_ERROR.search(str(e))
        if found is None:
            raise
        number = int(found.group(1))
        raise OSError(number, os.strerror(number), str(final)) from e


def weighted_mean(t: TableSpec) -> bool:
    """A weighted table pooled MEAN: FBGEMM's weighted sum over the bag's length (``inference_spec``)."""
    return t.is_weighted and t.pooling is Pooling.MEAN


def inference_spec(spec: Spec) -> Spec:
    """``spec`` as the unsharded model computes it: a weighted MEAN table pooled as SUM. TorchRec's
    unsharded bags (``nn.EmbeddingBag``) take weights only when summing; FBGEMM, which trained the
    table, divides the weighted sum by the bag's length, so ``rec.train.predict`` gives such a bag's
    weights divided by its length (``weighted_means``)."""
    tables = tuple(replace(t, pooling=Pooling.SUM) if weighted_mean(t) else t for t in spec.tables)
    return replace(spec, tables=tables) if tables != spec.tables else spec


def load_exported(model_dir: str | Path, device: torch.device) -> tuple[nn.Module, ModelSettings]:
    """An exported model (``export``'s ``out_dir``) on ``device``, in eval mode, and its settings. Its
    tables in float32 (a float16 table's rows exactly; an unsharded bag takes weights of its own type
    only), its bags as ``inference_spec`` says."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(model_dir)
    settings, _ = read_model(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise InputError(f"Cannot load the model {directory}:", [Problem(str(weights), "no such file")])
    # .to: TorchRec's LowRankCrossNet (the DCN model) takes no device and builds on the CPU.
    model = build_model(inference_spec(settings.spec), settings.config(), device, device).to(device).float()
    try:
        state = load_file(str(weights), device=str(device))
        model.load_state_dict(state, strict=True)
    except (SafetensorError, RuntimeError, OSError) as e:
        raise InputError(f"Cannot load the model {directory}:", [Problem(
            str(weights), f"does not hold this model's weights ({str(e).splitlines()[0][:200]})")]) from None
    return model.eval(), settings

