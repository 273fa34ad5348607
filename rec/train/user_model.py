"""``--model TARGET``: train the user's own model with a plan (protocol: docs/training.md).

TARGET is ``package.module:function`` or ``path/to/file.py:function``, resolved as ``shardflow spec
from-model`` resolves it. The function takes no arguments and returns ``(model, batches)``:

- ``model``: a ``torch.nn.Module`` holding the plan's embedding modules at the plan's paths (build
  it on the meta device; DMP allocates every parameter on the training device), whose
  ``forward(batch)`` returns ``(loss, output)`` as TorchRec's ``DLRMTrain`` does (the loss a scalar or
  one per sample);
- ``batches``: ``batches(rank, world_size, batch_size, device)`` returning an iterator of batches
  for that rank, each what ``TrainPipelineSparseDist`` takes (``.to(device, non_blocking)``,
  ``.record_stream``, ``.pin_memory``): TorchRec's ``Batch``, or ``rec.train.batch.ModuleBatch``.
  A resumed training passes over the batches the iterations before its checkpoint read, or, where
  ``batches`` takes the keyword ``start``, calls it with the first iteration to make a batch for.

The model must match the plan: every planned module at its path, of its kind, with the planned
tables (rows, dim, data type, weighted or not), and no other EmbeddingBagCollection or
EmbeddingCollection that the plan does not shard. ``model_problems`` names every difference; the
launcher checks before any process starts, and each rank again before sharding.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rec.errors import InputError, Problem
from rec.spec.types import Spec, table_key
from rec.train.rank_log import USER_CODE_NOTE

if TYPE_CHECKING:
    import torch
    from torch import nn

    from rec.plan import Plan

BatchSource = Callable[[int, int, int, "torch.device"], Iterator[Any]]


@dataclass(frozen=True)
class UserModel:
    model: nn.Module
    batches: BatchSource
    target: str = ""  # as the user named it


def load_user_model(target: str) -> UserModel:
    """Import ``target`` and call it; InputError (one line) for anything but ``(model, batches)``."""
    from torch import nn

    from rec.target import bad_target, call_target, kind_of, target_function

    result = call_target(target, target_function(target))
    wanted = "a torch.nn.Module and a function (rank, world_size, batch_size, device) -> batches"
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise bad_target(target, f"{target}() returned {kind_of(result)}, not a pair (model, batches): {wanted}")
    wrong = [f"its {which} is {kind_of(value)}" for which, value, ok in (
        ("first item", result[0], isinstance(result[0], nn.Module)), ("second item", result[1], callable(result[1])))
        if not ok]
    if wrong:
        raise bad_target(target, f"{target}() returned a pair (model, batches), but {' and '.join(wrong)}: {wanted}")
    refused = _refused_call(result[1])
    if refused:  # said now, not as a TypeError in every rank after the launch (exit 1, retried)
        raise bad_target(target, f"the batches {target}() returned cannot be called as batches(rank, world_size, "
                                 f"batch_size, device): {refused}")
    return UserModel(result[0], result[1], target)


def _refused_call(batches: Callable[..., Any]) -> str | None:
    """Why ``batches`` cannot take the four arguments the ranks call it with; None where it can (or
    its signature cannot be read: a builtin, called as the protocol says)."""
    import inspect

    try:
        signature = inspect.signature(batches)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(0, 1, 1, "cpu")
    except TypeError as e:
        return f"{e} (its signature: {signature})"
    return None


@contextmanager
def user_code_exits_fail(target: str) -> Iterator[None]:
    """The block runs ``target``'s code (its model in forward and backward, its batches): an exit
    (``SystemExit``, any code) or another BaseException that is no Exception — a KeyboardInterrupt
    and DCP's CheckpointException aside — is an InputError naming the target, so that the rank
    fails with that cause instead of ending as if it had finished. An exception raised in the
    user's code (or in a library it called) stays what it is, noted with the file and line of the
    user's code it came from and the target (the rank's cause line shows the note)."""
    from torch.distributed.checkpoint.api import CheckpointException

    from rec.target import ended_by

    try:
        yield
    except (KeyboardInterrupt, CheckpointException):
        raise
    except Exception as e:  # a fault as any other (retried): where the user's code raised it is noted
        frame = users_frame(e.__traceback__)
        if frame is not None:
            e.add_note(USER_CODE_NOTE + raised_where(frame, target))
        raise
    except BaseException as e:  # shardflow's own code in the block never exits: the user's did
        raise InputError(f"The training with {target} stopped:", [
            Problem(target, f"its code {ended_by(e)} while training (in its model or its batches); "
                            "a model's code must return or raise")]) from None


def users_frame(tb: TracebackType | None) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame of ``tb`` in no library — neither Python's, an
    installed package's nor shardflow's own — or None where every frame is in one."""
    libraries = tuple({str(Path(p).resolve()) + os.sep for key, p in sysconfig.get_paths().items()
                       if key in ("stdlib", "platstdlib", "purelib", "platlib")}
                      | {str(Path(__file__).resolve().parents[2] / package) + os.sep
                         for package in ("rec", "tasks", "flows", "bench")})
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        name = code.co_filename
        if not name.startswith("<") and not str(Path(name).resolve()).startswith(libraries):
            found = (name, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found


def raised_where(frame: tuple[str, int, str], target: str) -> str:
    """``line 41 (forward) of TARGET`` where the frame is in the target's own file, else
    ``FILE:41 (forward), in the code of TARGET``: the path once where it can be."""
    name, line, function = frame
    own = target.rpartition(":")[0]
    if own.endswith(".py") and Path(own).resolve() == Path(name).resolve():
        return f"line {line} ({function}) of {target}"
    return f"{name}:{line} ({function}), in the code of {target}"


def model_problems(model: nn.Module, spec: Spec, source: str) -> list[Problem]:
    """How ``model``'s embedding modules differ from the planned ones (``spec``: the plan's rows)."""
    from rec.spec import spec_from_rows
    from rec.spec.from_model import model_rows, model_spec, unsharded_modules

    rows, _ = model_rows(model)
    lists = {table_key(t.module, t.name): t for t in spec.tables}
    for row in rows:  # the model's tables checked under the plan's allow-lists (a width-6 table on data_parallel)
        t = lists.get(table_key(row["module"], row["name"]))
        if t is not None and t.sharding_types:
            row["sharding_types"] = [s.value for s in t.sharding_types]
        if t is not None and t.compute_kernels:
            row["compute_kernels"] = [k.value for k in t.compute_kernels]
    try:
        found = spec_from_rows(rows, source=f"from {source}") if rows else model_spec(model, source=source).spec
    except InputError as e:
        return list(e.problems)
    problems = []
    planned_kinds, found_kinds = spec.modules, found.modules
    for path, kind in planned_kinds.items():
        if path not in found_kinds:
            others = ", ".join(found_kinds) or "none"
            problems.append(Problem(f"module {path}", f"the plan shards an {kind.value} here; {source} has none "
                                                      f"there (its embedding modules: {others})"))
        elif found_kinds[path] is not kind:
            problems.append(Problem(f"module {path}", f"is an {found_kinds[path].value} in {source}, the plan's "
                                                      f"is an {kind.value}"))
    for path, kind in found_kinds.items():
        if path not in planned_kinds:
            problems.append(Problem(f"module {path}", f"an {kind.value} of {source} that the plan does not "
                                                      "shard; plan this model (shardflow spec from-model)"))
    problems += [Problem(p.where, f"{p.reason}; DMP would leave it unsharded, whole on every rank")
                 for p in unsharded_modules(model)]
    # Tables of modules present in both, of the same kind (the others are named above).
    planned = {table_key(t.module, t.name): t for t in spec.tables
               if found_kinds.get(t.module) is t.pooling.module_kind}
    have = {table_key(t.module, t.name): t for t in found.tables
            if planned_kinds.get(t.module) is t.pooling.module_kind}
    for key in planned.keys() - have.keys():
        problems.append(Problem(f"table {key}", f"planned, but not in {source}"))
    for key in have.keys() - planned.keys():
        problems.append(Problem(f"table {key}", f"in {source}, but not in the plan"))
    for key in planned.keys() & have.keys():
        p, h = planned[key], have[key]
        differ = [f"{column} {getattr(h, column)} (planned {getattr(p, column)})"
                  for column in ("num_embeddings", "embedding_dim") if getattr(h, column) != getattr(p, column)]
        if h.data_type is not p.data_type:
            differ.append(f"data_type {h.data_type.value} (planned {p.data_type.value})")
        if h.is_weighted != p.is_weighted:
            differ.append(f"is_weighted {str(h.is_weighted).lower()} (planned {str(p.is_weighted).lower()})")
        if differ:
            problems.append(Problem(f"table {key}", f"has {', '.join(differ)} in {source}"))
    return sorted(problems, key=lambda p: p.where)


def check_user_model(target: str, spec: Spec) -> UserModel:
    """The user's model, checked against the plan's tables; InputError naming every difference."""
    user = load_user_model(target)
    problems = model_problems(user.model, spec, target)
    if problems:
        raise InputError(f"The model of {target} does not match the plan:", problems)
    return user


def user_model_problems(target: str, spec: Spec, plan: Plan | None = None) -> tuple[list[Problem], list[str]]:
    """``check_user_model``'s problems as a list (the launcher reports them with its other checks),
    with the tables' optimizers the kernels of ``plan`` (where there is one) cannot run, and the notes
    on a model that passes (``uninitialized``)."""
    try:
        user = check_user_model(target, spec)
    except InputError as e:
        return list(e.problems), []
    problems = [] if plan is None else optimizer_problems(user.model, plan)
    return problems, uninitialized(user.model)


# What FBGEMM's fused kernels (SplitTableBatchedEmbeddingBagsCodegen) run on cpu, as TorchRec names
# them (EmbOptimType's values); the rest they assert away in the ranks. The installed FBGEMM's set
# is checked by tests/rec/test_train_modules.py.
CPU_FUSED_OPTIMIZERS = frozenset({"exact_sgd", "exact_adagrad", "exact_row_wise_adagrad",
                                  "ema_in_place_row_wise_adagrad"})


def optimizer_problems(model: nn.Module, plan: Plan) -> list[Problem]:
    """The optimizers a user's code applied in backward that the training cannot run: on a planned
    table of ``model`` (which has them all: ``model_problems``) more than one, one TorchRec does not
    fuse, one FBGEMM's fused kernels do not run on a cpu plan; more than one on a dense parameter (the
    training steps it with its one: ``rec.train.job.shard_with_plan``)."""
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rec.plan.torchrec_plan import plan_modules
    from rec.sharding import ComputeDevice, ComputeKernel
    from rec.torchrec_internals import optimizer_classes, optimizer_kwargs

    planned = tuple(f"{path}." for path in plan_modules(plan))
    problems = [Problem(f"parameter {name}", f"the model applies {len(optimizer_classes(p))} optimizers to it in "
                                             "backward; the training steps a dense parameter with one")
                for name, p in model.named_parameters()
                if not name.startswith(planned) and len(optimizer_classes(p)) > 1]
    for t in plan.tables:
        module: Any = model.get_submodule(t.module)
        weight = (module.embedding_bags if isinstance(module, EmbeddingBagCollection) else module.embeddings)[
            t.name].weight
        classes, where = optimizer_classes(weight), f"table {t.key}"
        if len(classes) > 1:
            problems.append(Problem(where, f"the model applies {len(classes)} optimizers to it in backward; "
                                           "TorchRec's sharded tables take one"))
            continue
        if not classes:
            continue
        kind = (optimizer_kwargs(weight) or [{}])[0].get("optimizer")  # FBGEMM's own, given by name
        name = classes[0].__name__ if kind is None else f"{classes[0].__name__} (optimizer {kind})"
        if kind is None:
            try:
                kind = optimizer_type_to_emb_opt_type(classes[0])
            except ValueError:
                problems.append(Problem(where, (
                    f"the model applies {name} to it in backward, which TorchRec fuses into no sharded table: "
                    "apply torch.optim's SGD, Adagrad or Adam, one of torchrec.optim's, or none (shardflow's "
                    "row-wise Adagrad)")))
                continue
        fused = t.compute_kernel is not ComputeKernel.DENSE  # a data_parallel table's optimizer is torch's
        if (plan.topology.compute_device is ComputeDevice.CPU and fused
                and str(getattr(kind, "value", kind)) not in CPU_FUSED_OPTIMIZERS):
            problems.append(Problem(where, (
                f"the model applies {name} to it in backward; FBGEMM's kernels on cpu (the plan's compute_device) "
                "run only SGD, Adagrad and RowWiseAdagrad: apply one of those, or none (shardflow's row-wise "
                "Adagrad), or plan for cuda")))
    return problems


def uninitialized(model: nn.Module) -> list[str]:
    """A line for each module whose parameters DMP would allocate on the device but not initialize
    (on the meta device, the module without ``reset_parameters``), whose buffers it would make zero
    (on the meta device), or whose given weights it replaces (an EmbeddingBagCollection's tables):
    the model trains from them all the same."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    out = []
    for path, module in model.named_modules():
        if isinstance(module, EmbeddingBagCollection) and any(not p.is_meta for p in module.parameters()):
            out.append(f"note      module {path}: an EmbeddingBagCollection built with its weights: DMP "
                       "re-initializes its tables; load pretrained ones after sharding")
        if isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)):  # sharded, initialized by TorchRec
            continue
        where = f"module {path}" if path else "the model"
        blank = [name for name, p in module.named_parameters(recurse=False) if p.is_meta]
        if blank and not callable(getattr(module, "reset_parameters", None)):
            out.append(f"note      {where}: {', '.join(blank)} on the meta device without a reset_parameters: "
                       "DMP leaves them uninitialized")
        zeroed = [name for name, b in module.named_buffers(recurse=False) if b.is_meta]
        if zeroed:
            out.append(f"note      {where}: buffer {', '.join(zeroed)} on the meta device: DMP makes it zero")
    return out
