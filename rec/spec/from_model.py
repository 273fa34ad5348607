"""A spec from a TorchRec model: every EmbeddingBagCollection and EmbeddingCollection in it becomes
rows with its ``module``; what shardflow does not plan is reported, not guessed at.

``TARGET`` is ``package.module:function`` or ``path/to/file.py:function``; the function takes no
arguments and returns the model (an ``nn.Module``, on the meta device or any other: nothing is
read from its weights), or a pair (model, constraints) with TorchRec ``ParameterConstraints`` by
table name, or the pair (model, batches) that ``train --model`` takes (the batches are not called).
Imports torch and the user's code: the planning path never loads this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from rec.config.cost import Optimizer
from rec.errors import InputError, Problem
from rec.sharding import ModuleKind, Pooling
from rec.spec.types import Spec
from rec.spec.validate import spec_from_rows
from rec.target import bad_target, call_target, kind_of, target_function
from rec.torchrec_internals import optimizer_classes

if TYPE_CHECKING:
    from torch import nn

# ParameterConstraints fields a spec holds (the rest, when set, are reported as not modelled).
_MODELLED = frozenset({"sharding_types", "compute_kernels", "pooling_factors", "feature_names", "min_partition"})


@dataclass(frozen=True)
class ModelSpec:
    """The spec of a model's embedding modules, and what was left out (one line per cause)."""

    spec: Spec
    left_out: tuple[Problem, ...]  # modules shardflow does not plan, constraints it does not model


def spec_from_model(target: str) -> ModelSpec:
    """Import ``target``, call it, and read its model's embedding modules (``model_spec``)."""
    model, constraints = load_model(target)
    return model_spec(model, constraints, source=target)


def load_model(target: str) -> tuple[nn.Module, Mapping[str, Any]]:
    """The model ``target`` returns and its constraints (empty if it gives none); InputError, with
    the error in one line, for a target that cannot be imported, fails or returns no model."""
    from torch import nn

    result = call_target(target, target_function(target))
    model, constraints = result, None
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], nn.Module):
        model, constraints = result
        if callable(constraints):  # train --model's factory: (model, batches), one function for both
            constraints = None
    if not isinstance(model, nn.Module):
        raise bad_target(target, f"{target}() returned {kind_of(result)}, not a torch.nn.Module nor a pair "
                           "(model, constraints)")
    if constraints is not None and not isinstance(constraints, Mapping):
        raise bad_target(target, f"{target}() returned constraints as {kind_of(constraints)}, not a mapping of table "
                           "name to TorchRec ParameterConstraints")
    return model, dict(constraints or {})


def model_spec(model: nn.Module, constraints: Mapping[str, Any] | None = None, source: str = "the model") -> ModelSpec:
    """Every EmbeddingBagCollection and EmbeddingCollection of ``model`` as spec rows (validated),
    found as DistributedModelParallel finds them: depth first, not inside a module it would shard."""
    rows, left_out = model_rows(model, constraints)
    if not rows:
        raise InputError(f"No tables to plan in {source}:", [
            Problem(source, "the model holds no EmbeddingBagCollection or EmbeddingCollection shardflow plans"),
            *left_out])
    return ModelSpec(spec_from_rows(rows, source=f"from {source}"), tuple(left_out))


def model_rows(model: nn.Module, constraints: Mapping[str, Any] | None = None, optimizers: bool = True
               ) -> tuple[list[dict[str, Any]], list[Problem]]:
    """``model_spec``'s rows before validation (each table as TorchRec configures it, with its
    module path; with ``optimizers``, the optimizer of each marked table), and what was left out: a
    caller validates them with its own cells added."""
    constraints = dict(constraints or {})
    rows: list[dict[str, Any]] = []
    left_out: list[Problem] = []
    for path, module, kind, reason in _embedding_modules(model):
        where = f"module {path or '(the model itself)'}"
        if reason is None and not path:
            reason = ("the model itself is the embedding module: shardflow plans modules inside a model; wrap it "
                      "(e.g. model.ebc = ...) or plan it with to_sharding_plan(plan, '') from a spec naming a module")
        if reason is not None:
            left_out.append(Problem(where, f"{type(module).__name__}: {reason}"))
            continue
        assert kind is not None
        tables, why = _table_rows(module, kind, path, constraints, optimizers)
        if why is not None:
            left_out.append(Problem(where, f"{type(module).__name__}: {why}"))
            continue
        rows += tables
    used = {row["name"] for row in rows}
    for name in sorted(set(constraints) - used):
        left_out.append(Problem(f"constraints '{name}'", "names no table of a planned module: ignored"))
    for name in sorted(set(constraints) & used):
        ignored = _unmodelled(constraints[name])
        if ignored:
            left_out.append(Problem(f"constraints '{name}'", f"{', '.join(ignored)} not modelled by shardflow: "
                                                             "ignored"))
    return rows, left_out


def unsharded_modules(model: nn.Module) -> list[Problem]:
    """The embedding modules of ``model`` that DMP would leave unsharded, whole on every rank and
    trained as dense parameters: subclasses of TorchRec's collections, and modules of sharders
    shardflow does not plan (a module reached at two paths is planned at the first)."""
    found = list(_embedding_modules(model))
    planned = {id(module) for _, module, kind, _ in found if kind is not None}
    return [Problem(f"module {path}", f"{type(module).__name__}: {reason}") for path, module, kind, reason in found
            if kind is None and reason is not None and path and id(module) not in planned]


def _embedding_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module, ModuleKind | None, str | None]]:
    """(path, module, kind, why not planned) of every module a TorchRec sharder would shard, and of
    subclasses of TorchRec's embedding modules (no sharder takes them): what DMP reaches, in order."""
    from torchrec.distributed.sharding_plan import get_module_to_default_sharders
    from torchrec.modules.embedding_modules import (
        EmbeddingBagCollection,
        EmbeddingBagCollectionInterface,
        EmbeddingCollection,
        EmbeddingCollectionInterface,
    )

    shardable = get_module_to_default_sharders()
    seen: dict[int, str] = {}
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        path, module = stack.pop()
        kind: ModuleKind | None = None
        if type(module) is EmbeddingBagCollection:
            kind = ModuleKind.EMBEDDING_BAG_COLLECTION
        elif type(module) is EmbeddingCollection:
            kind = ModuleKind.EMBEDDING_COLLECTION
        elif type(module) in shardable:
            sharder = type(shardable[type(module)]).__name__
            yield path, module, None, f"sharded by TorchRec's {sharder}, which shardflow does not plan"
            continue
        elif isinstance(module, (EmbeddingBagCollectionInterface, EmbeddingCollectionInterface)):
            yield path, module, None, ("a subclass of a TorchRec embedding module: no TorchRec sharder takes it "
                                       "(DistributedModelParallel matches the exact class)")
            continue
        if kind is not None:
            if id(module) in seen:
                yield path, module, None, f"the same module as {seen[id(module)]}: planned there"
                continue
            seen[id(module)] = path
            yield path, module, kind, None
            continue
        children = [(f"{path}.{name}" if path else name, child) for name, child in module.named_children()]
        stack += reversed(children)


def _table_rows(module: nn.Module, kind: ModuleKind, path: str, constraints: Mapping[str, Any],
                optimizers: bool = True) -> tuple[list[dict[str, Any]], str | None]:
    """The module's tables as spec rows, or why the module cannot be planned."""
    weighted = False
    if kind is ModuleKind.EMBEDDING_BAG_COLLECTION:
        weighted = bool(module.is_weighted())  # type: ignore[operator]
        configs = module.embedding_bag_configs()  # type: ignore[operator]
    else:
        configs = module.embedding_configs()  # type: ignore[operator]
    rows = []
    for config in configs:
        if getattr(config, "use_virtual_table", False):
            return [], (f"table {config.name} is a virtual table, which needs TorchRec's key-value kernels "
                        "(an SSD or DRAM tier shardflow does not model)")
        row: dict[str, Any] = {
            "name": config.name, "num_embeddings": config.num_embeddings, "embedding_dim": config.embedding_dim,
            "feature_names": list(config.feature_names or [config.name]), "data_type": config.data_type.value,
            "pooling": config.pooling.value if kind is ModuleKind.EMBEDDING_BAG_COLLECTION else Pooling.NONE.value,
            "module": path,
        }
        if weighted:
            row["is_weighted"] = True
        tables: Any = getattr(module, "embedding_bags" if kind is ModuleKind.EMBEDDING_BAG_COLLECTION else "embeddings")
        weight = tables[config.name].weight
        if optimizers and optimizer_classes(weight):  # as TorchRec's estimator reads it; else plan --optimizer
            row["optimizer"] = marked_optimizer(weight).value
        row.update(_constraint_cells(constraints.get(config.name)))
        rows.append(row)
    return rows, None


def marked_optimizer(weight: Any) -> Optimizer:
    """The optimizer TorchRec's storage estimator sizes for a table (``apply_optimizer_in_backward``
    marks its weight), as ``shard_estimators._get_optimizer_multipler`` tells them apart."""
    import torch
    import torchrec.optim as trec_optim

    cls = (optimizer_classes(weight) or [None])[0]
    if cls is None:
        return Optimizer.NONE
    if cls in (torch.optim.SGD, trec_optim.SGD):
        return Optimizer.SGD
    if cls in (torch.optim.Adam, trec_optim.Adam):
        return Optimizer.ADAM
    if cls is trec_optim.RowWiseAdagrad:
        return Optimizer.ROWWISE_ADAGRAD
    return Optimizer.ADAGRAD  # any other: one state tensor the size of the weight


def _constraint_cells(c: Any) -> dict[str, Any]:
    """The spec cells a table's ParameterConstraints give: allow-lists and the mean pooling factor
    over its features (the spec holds one per table)."""
    if c is None:
        return {}
    cells: dict[str, Any] = {}
    if getattr(c, "sharding_types", None):
        cells["sharding_types"] = list(c.sharding_types)
    if getattr(c, "compute_kernels", None):
        cells["compute_kernels"] = list(c.compute_kernels)
    if getattr(c, "min_partition", None):
        cells["min_partition"] = c.min_partition
    factors = list(getattr(c, "pooling_factors", None) or [])
    if factors:
        cells["pooling_factor"] = factors[0] if len(set(factors)) == 1 else sum(factors) / len(factors)
    return cells


def _unmodelled(c: Any) -> list[str]:
    """Fields of ``c`` set to something other than their default that a spec cannot hold."""
    from torchrec.distributed.planner.types import ParameterConstraints

    if not isinstance(c, ParameterConstraints):
        return [f"{type(c).__name__} (not ParameterConstraints)"]
    default = ParameterConstraints()
    return [f.name for f in fields(c) if f.name not in _MODELLED and getattr(c, f.name) != getattr(default, f.name)]
