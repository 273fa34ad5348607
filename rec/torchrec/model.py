"""A model's embedding modules as TorchRec's planner sees them, given the sharders: which modules a
sharder takes (its type's sharder is among them; found as TorchRec's enumerator finds them, not
inside a module a sharder takes), their tables as spec rows (``rec.spec.from_model``), and what
the sharders allow and configure. A module a given sharder takes that shardflow cannot plan is
refused, naming it; a module no given sharder takes is left alone, as TorchRec leaves it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rec.errors import InputError, Problem
from rec.sharding import NOT_PLANNED, ComputeDevice, ComputeKernel, ModuleKind, ShardingType, sharder_options
from rec.spec.types import DEFAULT_MODULE, table_key

# Where a model that is itself an embedding module is planned (its ShardingPlan entry is at "").
ROOT_PATHS = {ModuleKind.EMBEDDING_BAG_COLLECTION: DEFAULT_MODULE,
              ModuleKind.EMBEDDING_COLLECTION: "model.sparse_arch.embedding_collection"}


@dataclass(frozen=True)
class PlannedModule:
    """One embedding module a given sharder takes, and shardflow plans."""

    path: str  # in the spec and plan (a stand-in from ROOT_PATHS when the model is the module)
    kind: ModuleKind
    module: Any  # the nn.Module
    sharder: Any  # TorchRec's sharder that takes it
    sharding_types: tuple[str, ...] | None  # what the sharder allows, where it restricts TorchRec's defaults
    compute_kernels: tuple[str, ...] | None


@dataclass(frozen=True)
class ModelTables:
    """The tables TorchRec's planner would plan, as spec rows (before constraints), and their modules."""

    rows: tuple[dict[str, Any], ...]  # spec rows, each with its module path
    modules: tuple[PlannedModule, ...]
    root: str | None  # the stand-in path when the model itself is the embedding module
    shardable: tuple[Any, ...]  # every module a sharder takes (TorchRec's dense reservation leaves them out)

    def parameters(self) -> dict[str, Any]:
        """Each table's weight, by its key (``rec.spec.types.table_key``)."""
        return {table_key(m.path, name): param for m in self.modules
                for name, param in m.sharder.shardable_parameters(m.module).items()}


def model_tables(model: Any, sharders: list[Any], device: ComputeDevice) -> ModelTables:
    """The tables of ``model``'s modules that ``sharders`` take; InputError naming every module a
    sharder takes that shardflow cannot plan, and sharders shardflow cannot follow."""
    from torch import nn
    from torchrec.distributed.planner.utils import sharder_name

    from rec.spec.from_model import model_rows
    from rec.spec.torchrec_modules import place

    by_type = {sharder_name(s.module_type): s for s in sharders}
    taken = list(_taken(model, by_type))
    root = None
    kinds = {path: module_kind(module) for path, module in taken}
    if taken and taken[0][0] == "" and kinds[""] is not None:
        kind = kinds[""]
        assert kind is not None
        root = ROOT_PATHS[kind]
        model = place(nn.Module(), {root: model})
        taken = [(root, taken[0][1])]
        kinds = {root: kind}
    problems: list[Problem] = []
    # Unvalidated: the planner validates each table with its constraints' cells, naming its own problem.
    # The planner states each table's optimizer against the tables' most common (its cost model's).
    rows, left_out = model_rows(model, optimizers=False)
    reasons = {p.where: p.reason for p in left_out}
    modules = []
    for path, module in taken:
        found_kind = kinds[path]
        where = f"module {path or '(the model itself)'}"
        if found_kind is None:
            problems.append(Problem(where, reasons.get(where, f"{type(module).__name__}: shardflow plans "
                                                               "EmbeddingBagCollection and EmbeddingCollection")))
            continue
        if where in reasons:
            problems.append(Problem(where, reasons[where]))
            continue
        sharder = by_type[sharder_name(type(module))]
        why = _sharder_problem(sharder, module, found_kind, device)
        if why:
            problems.append(Problem(f"{where}: {type(sharder).__name__}", why))
            continue
        types, kernels = _allowed(sharder, found_kind, device)
        modules.append(PlannedModule(path, found_kind, module, sharder, types, kernels))
    if problems:
        raise InputError("shardflow cannot plan these modules of the model:", problems)
    planned = {m.path for m in modules}
    # No module (or only modules without tables): no rows, and the planner returns TorchRec's empty plan.
    return ModelTables(tuple(r for r in rows if r["module"] in planned), tuple(modules), root,
                       tuple(module for _, module in taken))


def _taken(model: Any, by_type: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(path, module) of every module a sharder takes, in TorchRec's enumerator's order (depth first)."""
    from torchrec.distributed.planner.utils import sharder_name

    stack: list[tuple[str, Any]] = [("", model)]
    while stack:
        path, module = stack.pop()
        if sharder_name(type(module)) in by_type:
            yield path, module
            continue
        children = [(f"{path}.{name}" if path else name, child) for name, child in module.named_children()]
        stack += reversed(children)


def module_kind(module: Any) -> ModuleKind | None:
    """The kind of a TorchRec embedding module shardflow plans (its exact class), else None."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    if type(module) is EmbeddingBagCollection:
        return ModuleKind.EMBEDDING_BAG_COLLECTION
    if type(module) is EmbeddingCollection:
        return ModuleKind.EMBEDDING_COLLECTION
    return None


def _sharder_problem(sharder: Any, module: Any, kind: ModuleKind, device: ComputeDevice) -> str | None:
    """Why shardflow cannot plan what ``sharder`` does with ``module``, or None."""
    fused = dict(getattr(sharder, "fused_params", None) or {})
    if fused.get("prefetch_pipeline"):
        return "fused_params prefetch_pipeline is not modelled by shardflow's cost model"
    if fused.get("multipass_prefetch_config") is not None:
        return "fused_params multipass_prefetch_config is not modelled by shardflow's cost model"
    if getattr(sharder, "qcomm_codecs_registry", None):
        return "quantized communication (qcomm_codecs_registry) is not modelled by shardflow's cost model"
    tables = set(sharder.shardable_parameters(module))
    names = {c.name for c in (module.embedding_bag_configs() if kind is ModuleKind.EMBEDDING_BAG_COLLECTION
                              else module.embedding_configs())}
    if tables != names:
        return "shards only some of the module's tables (shardable_params): shardflow plans whole modules"
    allowed = _pairs(sharder, device)
    ours = _shardflow_pairs(device, kind)
    mine = ours & allowed
    if not mine:
        return f"offers none of the sharding types and kernels shardflow plans on {device.value}"
    types, kernels = {st for st, _ in mine}, {ck for _, ck in mine}
    if {(st, ck) for st, ck in ours if st in types and ck in kernels} != mine:
        return "offers kernels per sharding type in a way shardflow's allow-lists cannot express"
    return None


def _allowed(sharder: Any, kind: ModuleKind, device: ComputeDevice) -> tuple[tuple[str, ...] | None,
                                                                              tuple[str, ...] | None]:
    """The allow-lists a sharder narrower than TorchRec's default gives its tables (None: no limit)."""
    ours = _shardflow_pairs(device, kind)
    mine = ours & _pairs(sharder, device)
    types = tuple(st.value for st in ShardingType if any(s == st for s, _ in mine))
    kernels = tuple(ck.value for ck in ComputeKernel if any(k == ck for _, k in mine))
    all_types = {st for st, _ in ours}
    all_kernels = {ck for _, ck in ours}
    return (None if len(types) == len(all_types) else types, None if len(kernels) == len(all_kernels) else kernels)


def _pairs(sharder: Any, device: ComputeDevice) -> set[tuple[ShardingType, ComputeKernel]]:
    out = set()
    for st in sharder.sharding_types(device.value):
        for ck in sharder.compute_kernels(st, device.value):
            try:
                out.add((ShardingType(st), ComputeKernel(ck)))
            except ValueError:
                continue  # a name shardflow does not know (a virtual-table kernel): never planned
    return {(st, ck) for st, ck in out if st not in NOT_PLANNED and ck not in NOT_PLANNED}


def _shardflow_pairs(device: ComputeDevice, kind: ModuleKind) -> set[tuple[ShardingType, ComputeKernel]]:
    return {(st, ck) for st, kernels in sharder_options(device, kind).items() for ck in kernels}
