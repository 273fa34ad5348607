"""``ShardflowPlanner``: TorchRec's ``ShardingPlanner`` interface, planned by shardflow's search.

A drop-in for ``EmbeddingShardingPlanner`` in a TorchRec training script (docs/torchrec-planner.md):

    planner = ShardflowPlanner(topology=topology, batch_size=batch_size, constraints=constraints)
    plan = planner.collective_plan(model, sharders, pg)
    model = DistributedModelParallel(model, plan=plan, sharders=sharders, ...)

It takes ``EmbeddingShardingPlanner``'s keywords where they mean the same thing, plans every
EmbeddingBagCollection and EmbeddingCollection the sharders take, jointly, with
``rec.planning.plan_spec``, and returns the ``ShardingPlan`` keyed by module path. What it cannot
plan as TorchRec would is refused with one ``InputError`` naming every such option, module or
constraint. Imports torch and torchrec.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rec.config.cost import UVM_CACHING_RATIO, CostConfig, Optimizer
from rec.config.search import SearchConfig
from rec.cost.tables import kernel_group_keys
from rec.errors import InputError, Problem
from rec.highs.process import HIGHS
from rec.plan.types import Plan
from rec.planning import plan_spec
from rec.profile import DEFAULT_PROFILE, Profile, read_profile
from rec.profile.validate import profile_problems
from rec.settings import check
from rec.sharding import ComputeDevice, ComputeKernel, ShardingType
from rec.spec import spec_from_rows
from rec.spec.from_model import marked_optimizer
from rec.spec.types import table_key
from rec.topology.types import BATCH_SIZE
from rec.torchrec.constraints import kernel_fields, stats_cells, table_constraints, unsized_statistics
from rec.torchrec.model import ModelTables, model_tables, module_kind
from rec.torchrec.topology import (
    reservation_settings,
    shardflow_topology,
    topology_problems,
    topology_profile,
    torchrec_kjt_bytes,
)
from rec.validation import positive_integer

try:  # the interface, so that isinstance(planner, ShardingPlanner) holds where TorchRec checks it
    from torchrec.distributed.types import ShardingPlanner
except ImportError:  # pragma: no cover - torchrec is what this module is for
    ShardingPlanner = object

log = logging.getLogger(__name__)

# EmbeddingShardingPlanner's keywords that replace a stage shardflow's search stands for.
UNSUPPORTED = {
    "enumerator": "shardflow enumerates with its own TorchRec-faithful cost model (rec.cost)",
    "proposer": "shardflow's search replaces the proposers",
    "partitioner": "shardflow's search places the shards itself",
    "performance_model": "plans are rated with TorchRec's NoopPerfModel (the busiest rank), or a profile (profile=)",
    "callbacks": "callbacks edit TorchRec's sharding options, which shardflow never builds",
    "plan_loader": "shardflow plans every time (or reads a plan with rec.plan.read_plan)",
}


@dataclass(frozen=True)
class _Planned:
    plan: Plan
    kernel: dict[str, dict[str, Any]]  # each table's ParameterSharding fields from its constraints
    root: bool  # the model itself is the embedding module: its ShardingPlan entry is at ""


class ShardflowPlanner(ShardingPlanner):  # type: ignore[misc]
    """TorchRec's ``ShardingPlanner`` planned by shardflow. Keywords as ``EmbeddingShardingPlanner``'s
    (``topology``, ``batch_size``, ``storage_reservation``, ``constraints``, ``debug``,
    ``timeout_seconds``: the search's time limit), plus ``profile`` (a hardware profile or its YAML
    path) and ``plan_dir`` (where each plan's plan.json and shards.parquet are written)."""

    def __init__(self, topology: Any = None, batch_size: int | None = None, enumerator: Any = None,
                 storage_reservation: Any = None, proposer: Any = None, partitioner: Any = None,
                 performance_model: Any = None, stats: Any = None, constraints: dict[str, Any] | None = None,
                 debug: bool = True, callbacks: Any = None, timeout_seconds: float | None = None,
                 plan_loader: Any = None, *, profile: Profile | str | Path | None = None,
                 plan_dir: str | Path | None = None) -> None:
        given = {"enumerator": enumerator, "proposer": proposer, "partitioner": partitioner,
                 "performance_model": performance_model, "callbacks": callbacks, "plan_loader": plan_loader}
        problems = [Problem(name, f"{type(value).__name__} is not supported: {UNSUPPORTED[name]}")
                    for name, value in given.items() if value]
        reservation, reserve = reservation_settings(storage_reservation)
        problems += reserve
        if topology is not None:
            problems += topology_problems(topology)
        if plan_dir is not None:
            problems += _plan_dir_problems(Path(plan_dir))
        if profile is not None and not isinstance(profile, (str, Path)):  # a file is checked as it is read
            problems += profile_problems(profile)  # built in code: the bounds a profile file is held to
        if batch_size:  # as TorchRec's: none (or 0) is its default
            try:
                positive_integer(batch_size)
            except ValueError as e:
                problems.append(Problem("batch_size", str(e)))
        if constraints is not None and not isinstance(constraints, Mapping):
            problems.append(Problem("constraints", f"expected a dict of table names to ParameterConstraints, "
                                                   f"got {type(constraints).__name__}"))
        search = SearchConfig() if timeout_seconds is None else SearchConfig(time_limit_s=float(timeout_seconds))
        try:
            check(search, "", where={"time_limit_s": "timeout_seconds"})
        except InputError as e:
            problems += e.problems
        own = DEFAULT_PROFILE
        if not problems:
            own = read_profile(profile) if isinstance(profile, (str, Path)) else (profile or DEFAULT_PROFILE)
            if topology is not None:  # what it sets of the cost model: named now rather than at plan()
                problems += topology_profile(own, topology)[1]
        if problems:
            raise InputError("ShardflowPlanner cannot plan with these options:", problems)
        self._topology = topology
        self._batch_size = int(batch_size) if batch_size else BATCH_SIZE
        self._reservation = reservation
        self._constraints = dict(constraints or {})
        self._debug = debug
        self._search = search
        self._profile = own
        self._plan_dir = None if plan_dir is None else Path(plan_dir)
        self.last_plan: Plan | None = None  # shardflow's plan behind the last ShardingPlan returned
        self.last_search_s = 0.0  # seconds the last search took (plan_spec)

    def plan(self, module: Any, sharders: list[Any]) -> Any:
        """The ``ShardingPlan`` of every embedding module of ``module`` that ``sharders`` take (empty,
        as TorchRec's, when they take none with tables)."""
        started = time.perf_counter()
        planned = self._planned(module, sharders)
        if self._debug and planned is not None:
            from rec.torchrec.summary import plan_summary

            log.info("%s", plan_summary(planned.plan, time.perf_counter() - started, self.last_search_s))
        elif self._debug:
            log.info("shardflow planned no tables: the sharders take no embedding module with tables")
        return self._sharding_plan(planned)

    def collective_plan(self, module: Any, sharders: list[Any] | None = None, pg: Any = None) -> Any:
        """Plan on the group's first rank and send the plan (plan.json's text, not a pickle) to
        the others, which build the same ``ShardingPlan``. A failure there is raised on every rank
        (rank 0's own error there, the same InputError elsewhere): no rank waits for a plan that
        never comes."""
        import torch.distributed as dist

        if pg is None:
            if not dist.is_initialized():
                raise InputError("collective_plan needs a process group:", [Problem(
                    "pg", "torch.distributed is not initialized: call init_process_group first, or use plan()")])
            pg = dist.GroupMember.WORLD
        if sharders is None:
            from torchrec.distributed.sharding_plan import get_default_sharders

            sharders = get_default_sharders()
        from rec.plan.io import dumps_plan, parse_plan

        group = _group(pg)
        if pg.rank() != 0:
            planned = self._received(json.loads(group.broadcast_bytes(b"", pg)), module)
            return self._sharding_plan(planned)
        try:
            sharding_plan = self.plan(module, sharders)
            if self.last_plan is not None:  # read back as the other ranks will: refused here, refused everywhere
                parse_plan(dumps_plan(self.last_plan), "the plan rank 0 sent")
        except InputError as e:
            group.broadcast_bytes(json.dumps({"error": {"title": e.title, "problems": [
                [p.where, p.reason] for p in e.problems]}}).encode(), pg)
            raise
        except Exception as e:
            group.broadcast_bytes(json.dumps({"failed": f"{type(e).__name__}: {e}"}).encode(), pg)
            raise
        if self.last_plan is None:  # no tables: every rank returns the empty plan
            group.broadcast_bytes(json.dumps({"empty": True}).encode(), pg)
        else:
            group.broadcast_bytes(json.dumps({"plan": dumps_plan(self.last_plan)}).encode(), pg)
        return sharding_plan

    def _received(self, message: dict[str, Any], module: Any) -> _Planned | None:
        from rec.plan.io import parse_plan

        if "error" in message:
            error = message["error"]
            raise InputError(error["title"], [Problem(w, r) for w, r in error["problems"]])
        if "failed" in message:
            raise RuntimeError(f"rank 0 could not plan: {message['failed']}")
        if message.get("empty"):
            self.last_plan = None
            return None
        plan = parse_plan(message["plan"], "the plan rank 0 sent")
        self.last_plan = plan
        kernel = {t.key: kernel_fields(self._constraints.get(t.name)) for t in plan.tables}
        return _Planned(plan, kernel, module_kind(module) is not None)

    def _planned(self, module: Any, sharders: list[Any]) -> _Planned | None:
        """shardflow's plan of the model's tables; None when there are none (TorchRec's empty plan)."""
        self.last_plan, self.last_search_s = None, 0.0
        topology = self._torchrec_topology()
        device = ComputeDevice(topology.compute_device)
        tables = model_tables(module, list(sharders), device)
        if not tables.rows:
            return None
        profile, problems = topology_profile(self._profile, topology)
        rows, kernel, cost, found = self._rows(tables, device, self._batch_size * topology.world_size, profile)
        problems += found
        try:
            spec = spec_from_rows(rows, source="from the model")
        except InputError as e:  # each table's own problem (its dim, its size), beside its constraints'
            problems += _labelled(e.problems, rows, tables.root)
        if problems:
            raise InputError("ShardflowPlanner cannot plan these tables as TorchRec would:", problems)
        inputs = []
        for row in tables.rows:  # TorchRec's input lengths: a table's constraints' pooling factors, else [1.0]
            c = self._constraints.get(row["name"])
            inputs.append(([1.0], None) if not c else (list(c.pooling_factors), list(c.batch_sizes or []) or None))
        dense, shown = self._reservation.dense(module, list(tables.shardable),
                                               torchrec_kjt_bytes(inputs, self._batch_size), spec, self._batch_size,
                                               device is ComputeDevice.CUDA)
        ours = shardflow_topology(topology, self._batch_size, self._reservation.percentage, dense, shown)
        started = time.perf_counter()
        try:
            plan = plan_spec(spec, ours, cost, self._search)
        except InputError as e:  # the tables named as the planner names them (module path, not spec key)
            raise InputError(e.title, _labelled(e.problems, rows, tables.root)) from None
        finally:
            HIGHS.close()  # a training plans once: its rank need not keep the solver's process
        self.last_search_s = time.perf_counter() - started
        self.last_plan = plan
        if self._plan_dir is not None:
            _write(plan, self._plan_dir)
        return _Planned(plan, kernel, tables.root is not None)

    def _rows(self, tables: ModelTables, device: ComputeDevice, global_batch: int, profile: Profile
              ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], CostConfig, list[Problem]]:
        """Spec rows with each table's constraints (cache statistics as counted at ``global_batch``
        samples), kernel fields by table key, the cost model (under ``profile``), and what cannot be
        planned as TorchRec would."""
        problems: list[Problem] = []
        rows, kernel = [], {}
        optimizers: list[tuple[dict[str, Any], Optimizer]] = []  # each table's row and its optimizer
        modules = {m.path: m for m in tables.modules}
        weights = tables.parameters()
        for row in tables.rows:
            m = modules[row["module"]]
            key = table_key(m.path, row["name"])
            where = _where(row, tables.root)
            mapped, found = table_constraints(self._constraints.get(row["name"]), where, len(row["feature_names"]),
                                              row["pooling"] != "NONE", self._batch_size, device.value)
            problems += found
            cells = _kind_narrowed({**mapped.cells, **_narrowed(mapped.cells, m.sharding_types, m.compute_kernels)},
                                   row["pooling"])
            rows.append({**row, **cells})
            why = _dense_dim_problem(device, row["embedding_dim"], cells)
            if why:
                problems.append(Problem(where, why))
            kernel[key] = mapped.kernel
            fused = getattr(m.sharder, "fused_params", None) or {}
            factor = mapped.load_factor if mapped.load_factor is not None else fused.get("cache_load_factor")
            if factor is not None and not _load_factor_ok(factor):
                given = ("cache_params.load_factor" if mapped.load_factor is not None
                         else "the sharder's cache_load_factor")
                problems.append(Problem(f"{where}: {given}", f"{factor!r} is not a number in (0, 1], the share of "
                                                            "the table's rows its cache holds (CacheParams')"))
                continue
            if _may_cache(device, rows[-1].get("compute_kernels")):
                cells, why = stats_cells(mapped.stats, global_batch, factor)
                if why:
                    problems.append(Problem(f"{where}: cache_params.stats", why))
                if factor is not None and "cache_load_factor" not in cells:  # else statistics measured at few sizes
                    floor = mapped.load_factor is not None and "hit_rate_curve" in cells and _scalable(mapped.stats)
                    rows[-1]["min_cache_load_factor" if floor else "cache_load_factor"] = float(factor)
                rows[-1].update(cells)
            optimizers.append((rows[-1], marked_optimizer(weights[key])))
        # The cost model's optimizer is the tables' most common one (the first of a tie); a table with
        # another states its own, so that specs of one optimizer read as they did.
        counts = Counter(optimizer for _, optimizer in optimizers)
        common = max(counts, key=counts.__getitem__, default=Optimizer.NONE)
        for row, optimizer in optimizers:
            if optimizer is not common:
                row["optimizer"] = optimizer.value
        cost = CostConfig(optimizer=common, profile=profile)
        try:
            check(cost, "")  # every cost setting within its bounds, whatever the model gave
        except InputError as e:
            problems += e.problems
        return rows, kernel, cost, problems

    def _torchrec_topology(self) -> Any:
        """The topology given, or TorchRec's default for the process group (as EmbeddingShardingPlanner)."""
        if self._topology is not None:
            return self._topology
        import torch
        import torch.distributed as dist
        from torchrec.distributed.comm import get_local_size
        from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

        if not dist.is_initialized():
            raise InputError("ShardflowPlanner needs a topology:", [Problem(
                "topology", "none given and torch.distributed is not initialized: pass TorchRec's Topology")])
        # TorchRec's own default, through its factory (TorchRec 1.8 warns of a Topology built directly)
        self._topology = TopologyFactory.create_topology(
            TrainerConfig(world_size=dist.get_world_size(), local_world_size=get_local_size()),
            kernel_config=KernelConfig(compute_device="cuda" if torch.cuda.is_available() else "cpu"))
        problems = topology_problems(self._topology)
        if problems:
            raise InputError("ShardflowPlanner cannot plan with these options:", problems)
        return self._topology

    def _sharding_plan(self, planned: _Planned | None) -> Any:
        from rec.plan.torchrec_plan import to_sharding_plan

        if planned is None:
            from torchrec.distributed.types import ShardingPlan

            return ShardingPlan(plan={})
        sharding_plan = to_sharding_plan(planned.plan, "" if planned.root else None)
        spec = planned.plan.spec
        spec_tables = {t.key: t for t in spec.tables}
        group = dict(zip(spec_tables, kernel_group_keys(spec, planned.plan.planner.cost).tolist(), strict=True))
        # FBGEMM gives an unstated cache its kernel group's mean of the stated sizes: a cache is left
        # unstated only beside caches of TorchRec's default size.
        sized = {group[t.key] for t in planned.plan.tables
                 if (stated := sharding_plan.plan["" if planned.root else t.module][t.name].cache_params) is not None
                 and stated.load_factor not in (None, UVM_CACHING_RATIO)}
        for t in planned.plan.tables:
            fields = planned.kernel.get(t.key)
            if fields:  # as TorchRec's planner copies them from the constraints
                module_plan = sharding_plan.plan["" if planned.root else t.module]
                ours = module_plan[t.name].cache_params
                given = fields.get("cache_params")
                if ours is not None and given is not None:  # the size the plan gives (at least a floor given)
                    unsized = unsized_statistics(given.stats, given.load_factor, spec_tables[t.key],
                                                 group[t.key] in sized)
                    fields = {**fields, "cache_params": replace(given, load_factor=None if unsized
                                                                else ours.load_factor)}
                module_plan[t.name] = replace(module_plan[t.name], **fields)
        return sharding_plan


def _where(row: dict[str, Any], root: str | None) -> str:
    """How the planner names a table: by name and module path (name only in a model that is itself the module)."""
    return f"table {row['name']}" + ("" if root else f" in module {row['module']}")


def _labelled(problems: tuple[Problem, ...], rows: list[dict[str, Any]], root: str | None) -> list[Problem]:
    """Problems found in the spec of the model's tables, each table named as the planner names it:
    with its module path, and without the stand-in path of a model that is itself the module."""
    from collections import Counter

    names = Counter(row["name"] for row in rows)  # the spec names a table by name alone: unique ones only
    ours = {f"table '{row['name']}'": _where(row, root) for row in rows if names[row["name"]] == 1}
    ours.update({f"table {table_key(row['module'], row['name'])}": _where(row, root) for row in rows})
    ours.update({f"table '{row['name']}' in module '{row['module']}'": _where(row, root) for row in rows})

    def named(text: str) -> str:
        if root is None:
            return text
        return text.replace(f"table {root}.", "table ").replace(f" in module '{root}'", "")

    return [Problem(ours.get(p.where, named(p.where)), named(p.reason)) for p in problems]


def _dense_dim_problem(device: ComputeDevice, dim: object, cells: dict[str, Any]) -> str | None:
    """Why a table left only data_parallel (the dense kernel) cannot be planned on ``device``: on
    cuda its dim must be a multiple of 4 (the spec allows any dim there, as on cpu)."""
    from rec.cost.constants import CUDA_DIM_MULTIPLE

    dense = (cells.get("sharding_types") == [ShardingType.DATA_PARALLEL.value]
             or cells.get("compute_kernels") == [ComputeKernel.DENSE.value])
    if device is not ComputeDevice.CUDA or not dense or not isinstance(dim, int) or dim <= 0:
        return None
    if dim % CUDA_DIM_MULTIPLE == 0:
        return None
    below = dim - dim % CUDA_DIM_MULTIPLE
    choices = f"{below} or {below + CUDA_DIM_MULTIPLE}" if below else f"{CUDA_DIM_MULTIPLE}"
    return (f"embedding_dim {dim} is not a multiple of {CUDA_DIM_MULTIPLE}, which FBGEMM's dense kernel "
            f"(data_parallel) needs on cuda: TorchRec plans it and training fails; use {choices}, or cpu ranks")


def _load_factor_ok(value: object) -> bool:
    """A cache's share of its table: a finite number in (0, 1] (TorchRec refuses others when it builds the cache)."""
    import math

    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= 1)


def _narrowed(cells: dict[str, Any], types: tuple[str, ...] | None,
              kernels: tuple[str, ...] | None) -> dict[str, Any]:
    """The allow-lists of a table whose sharder offers less than TorchRec's default one: the
    constraint's narrowed to what the sharder offers (names shardflow refuses kept, to be named)."""
    from rec.sharding import NOT_PLANNED

    refused = {m.value for m in NOT_PLANNED}
    out: dict[str, Any] = {}
    for column, offered in (("sharding_types", types), ("compute_kernels", kernels)):
        if offered is None:
            continue
        listed = cells.get(column)
        out[column] = list(offered) if not listed else [v for v in listed if v in offered or v in refused]
    return out


def _kind_narrowed(cells: dict[str, Any], pooling: str) -> dict[str, Any]:
    """``cells`` with each allow-list narrowed to what the table's module kind's sharder offers, as
    TorchRec's enumerator takes from a constraint what its sharder offers (one policy for the tables
    of an EmbeddingBagCollection and an EmbeddingCollection); a list of which nothing is offered is
    kept, to be named."""
    from rec.sharding import NOT_PLANNED, Pooling, offered

    types, kernels = offered(Pooling(pooling).module_kind)
    refused = {m.value for m in NOT_PLANNED}
    out = dict(cells)
    for column, known in (("sharding_types", types), ("compute_kernels", kernels)):
        listed = cells.get(column)
        kept = [v for v in listed or () if v in {m.value for m in known} or v in refused]
        if listed and kept:
            out[column] = kept
    return out


def _scalable(stats: Any) -> bool:
    """Whether TorchRec's EmbeddingOffloadScaleupProposer grows a cache whose load factor is stated
    beside ``stats`` (its ``get_scalable_sharding_options``: cacheability x expected lookups > 0),
    taking the stated size as the least; every other proposer keeps it."""
    try:
        growth = float(stats.cacheability) * float(stats.expected_lookups)
        return math.isfinite(growth) and growth > 0
    except Exception:  # a user's statistics without cacheability: TorchRec's proposer cannot grow it either
        return False


def _may_cache(device: ComputeDevice, kernels: list[str] | None) -> bool:
    """Whether a table may get the fused_uvm_caching kernel, whose estimate reads the load factor."""
    return device is ComputeDevice.CUDA and (not kernels or ComputeKernel.FUSED_UVM_CACHING.value in kernels)


def _group(pg: Any) -> Any:
    """The ``Group`` whose tensors live where ``pg``'s backend takes them (NCCL: this rank's GPU)."""
    import torch
    import torch.distributed as dist

    from rec.train.collectives import Group

    if dist.get_backend(pg) == "nccl":
        return Group(torch.device("cuda", torch.cuda.current_device()))
    return Group(torch.device("cpu"))


def _plan_dir_problems(directory: Path) -> list[Problem]:
    """Why plans cannot be written to ``directory``, found before anything is planned."""
    import os

    where = f"plan_dir {directory}"
    if directory.is_dir():
        return [] if os.access(directory, os.W_OK | os.X_OK) else [Problem(where, "is not writable")]
    if directory.exists() or directory.is_symlink():
        return [Problem(where, "exists and is not a directory: give a directory (created if missing)")]
    parent = directory.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return [Problem(where, f"{parent} is a file, not a directory")]
    if not os.access(parent, os.W_OK | os.X_OK):
        return [Problem(where, f"cannot be created: {parent} is not writable")]
    return []


def _write(plan: Plan, directory: Path) -> None:
    """plan.json and shards.parquet, validated, with the writer every plan goes through."""
    from rec.plan import validate_plan
    from rec.plan.io import write_plan

    problems = validate_plan(plan)
    if problems:
        raise AssertionError(f"shardflow built an invalid plan (a bug): {problems.items[:5]}")
    write_plan(plan, directory)
