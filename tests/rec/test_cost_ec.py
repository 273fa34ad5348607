"""rec.cost on EmbeddingCollections (pooling NONE) and models of several embedding modules, against
TorchRec 1.8's enumerator and estimators run on the same module tree with both sharders."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from rec.config.cost import CostConfig, Optimizer
from rec.cost import enumerate_options, rank_capacity
from rec.cost.bandwidth import kernel_bw, links
from rec.cost.perf import shard_perf
from rec.cost.shards import layout
from rec.cost.tables import table_arrays, table_optimizer
from rec.sharding import (
    COMPUTE_KERNELS,
    SHARDING_TYPES,
    ComputeDevice,
    ComputeKernel,
    ModuleKind,
    Pooling,
    ShardingType,
    offered,
    sharder_options,
)
from rec.spec.torchrec_modules import spec_model
from rec.spec.types import Spec, TableSpec
from rec.torchrec.score import _optimizer_class
from rec.torchrec.topology import torchrec_topology
from tests.rec.test_cost import CASES, DIMS, PERF_PARTS, pick, random_table, random_topology, torchrec_hardware

torch = pytest.importorskip("torch")

from torchrec.distributed.embedding import EmbeddingCollectionSharder  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator  # noqa: E402
from torchrec.distributed.planner.shard_estimators import (  # noqa: E402
    EmbeddingPerfEstimator,
    EmbeddingStorageEstimator,
)
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation  # noqa: E402

SHARDERS = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
EC_TYPES = sorted(offered(ModuleKind.EMBEDDING_COLLECTION)[0])


def make_spec(*tables: TableSpec) -> Spec:
    return Spec(tables=tuple(tables), spec_hash="x")


# ---------------------------------------------------------------- TorchRec's side: the module tree


def torchrec_model(spec: Spec, config: CostConfig):
    """The spec's modules at their paths on the meta device, and constraints by table name (TorchRec
    keys them by name alone: tables sharing a name across modules get the same constraints)."""
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    model = spec_model(spec)
    for t in spec.tables:  # each table's own optimizer, else the cost model's, as apply_optimizer_in_backward marks it
        optimizer_class = _optimizer_class(table_optimizer(t, config))
        if optimizer_class is not None:
            tables = getattr(model.get_submodule(t.module), "embedding_bags" if t.pooled else "embeddings")
            tables[t.name].weight._optimizer_classes = [optimizer_class]
    constraints: dict[str, ParameterConstraints] = {}
    for t in spec.tables:
        c = ParameterConstraints(
            sharding_types=[s.value for s in t.sharding_types] if t.sharding_types else None,
            compute_kernels=[k.value for k in t.compute_kernels] if t.compute_kernels else None,
            pooling_factors=[t.pooling_factor] * len(t.feature_names),
            cache_params=CacheParams(
                load_factor=config.caching_ratio if t.cache_load_factor is None else t.cache_load_factor),
        )
        assert constraints.setdefault(t.name, c) == c, "tables sharing a name need the same constraints"
    return model, constraints


def torchrec_enumerate(spec: Spec, topology, config: CostConfig, perf_estimator=None):
    model, constraints = torchrec_model(spec, config)
    trec_topology = torchrec_topology(topology)
    enumerator = EmbeddingEnumerator(
        topology=trec_topology, batch_size=topology.batch_size, constraints=constraints,
        estimator=[perf_estimator or EmbeddingPerfEstimator(trec_topology, constraints),
                   EmbeddingStorageEstimator(trec_topology, constraints)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return enumerator.enumerate(model, SHARDERS)


def torchrec_options(spec: Spec, topology, config: CostConfig) -> dict:
    """(module, table, sharding type, kernel) -> per shard (size, offset, perf parts, hbm, ddr)."""
    return {
        (o.path, o.name, o.sharding_type, o.compute_kernel): [
            (list(s.size), list(s.offset), tuple(getattr(s.perf, p) for p in PERF_PARTS), s.storage.hbm,
             s.storage.ddr) for s in o.shards]
        for o in torchrec_enumerate(spec, topology, config)
    }


# ---------------------------------------------------------------- shardflow's side


def our_options(spec: Spec, topology, config: CostConfig) -> dict:
    """The same from enumerate_options, with each shard's perf parts from rec.cost.perf (pooled per table)."""
    o = enumerate_options(spec, topology, config).expand()
    parts = _our_perf_parts(spec, topology, config)
    out = {}
    for i in range(o.num_options):
        s = o.shards(i)
        t = spec.tables[o.table[i]]
        key = (t.module, t.name, SHARDING_TYPES[o.sharding_type[i]].value, COMPUTE_KERNELS[o.compute_kernel[i]].value)
        columns = (o.rows, o.cols, o.row_offset, o.col_offset, o.perf, o.hbm, o.ddr)
        out[key] = [([int(r), int(c)], [int(ro), int(co)], float(p), int(h), int(d))
                    for r, c, ro, co, p, h, d in zip(*(x[s] for x in columns), strict=True)]
        assert len(parts[key]) == len(out[key])
        out[key] = [(size, offset, part, h, d) for (size, offset, _, h, d), part in zip(out[key], parts[key],
                                                                                         strict=True)]
        np.testing.assert_allclose([sum(p) for p in parts[key]], o.perf[s], rtol=1e-12)  # Perf.total
    return out


def _our_perf_parts(spec: Spec, topology, config: CostConfig) -> dict:
    cols = table_arrays(spec, topology.batch_size, config, world_size=topology.world_size)
    hw = links(topology, config.profile)
    device = topology.compute_device
    out = {}
    for kind in ModuleKind:
        mine = cols.pooled == (kind is ModuleKind.EMBEDDING_BAG_COLLECTION)
        for st, kernels in sharder_options(device, kind).items():
            tab = np.flatnonzero(mine)
            lay = layout(st, cols.rows[tab], cols.dims[tab], topology.world_size, topology.local_world_size)
            t = tab[lay.owner]
            for ck in kernels:
                bw = kernel_bw(hw, config.profile, ck, cols.load_factor[t])
                perf = shard_perf(st, ck, topology, config.profile, hw, bw, lay.rows, lay.cols, cols.elem[t],
                                  cols.batch_inputs[t], cols.batch_outputs[t], pooled=cols.pooled[t])
                runs = np.stack([np.repeat(getattr(perf, p), lay.repeat) for p in PERF_PARTS], axis=1)
                if not len(tab):
                    continue
                ends = np.cumsum(np.add.reduceat(lay.repeat, np.cumsum(lay.count) - lay.count))
                for i, rows in zip(tab, np.split(runs, ends[:-1]), strict=True):
                    table = spec.tables[i]
                    out[(table.module, table.name, st.value, ck.value)] = [tuple(r) for r in rows.tolist()]
    return out


# ---------------------------------------------------------------- random inputs


def random_ec_tables(rng: np.random.Generator, module: str, count: int, first: int) -> list[TableSpec]:
    """An EmbeddingCollection's tables: pooling NONE and one embedding_dim; allow-lists from what its
    sharder offers (table_wise always kept, so every table has options on every device)."""
    dim = int(rng.choice(DIMS[1:]))  # a multiple of 4: every sharding type
    tables = []
    for i in range(first, first + count):
        t = random_table(rng, i)
        sharding_types = None
        if rng.random() < 0.3:
            extra = pick(rng, EC_TYPES, size=int(rng.integers(0, 3)))
            sharding_types = tuple(st for st in ShardingType if st in {ShardingType.TABLE_WISE, *extra})
        compute_kernels = t.compute_kernels if t.compute_kernels != (ComputeKernel.DENSE,) else None
        tables.append(TableSpec(
            name=t.name, num_embeddings=t.num_embeddings, embedding_dim=dim, feature_names=t.feature_names,
            pooling=Pooling.NONE, data_type=t.data_type, pooling_factor=t.pooling_factor,
            sharding_types=sharding_types, compute_kernels=compute_kernels, module=module))
    return tables


def random_model_spec(rng: np.random.Generator, ebc_modules: list[str], ec_modules: list[str],
                      per_module: int = 6) -> Spec:
    """Tables of several EBCs and ECs, interleaved in the spec (their order in the model is the spec's
    order of first appearance)."""
    tables: list[TableSpec] = []
    for path in ebc_modules:
        tables += [_with_module(random_table(rng, len(tables) + i), path) for i in range(per_module)]
    for path in ec_modules:
        tables += random_ec_tables(rng, path, per_module, len(tables))
    order = rng.permutation(len(tables))
    return make_spec(*(tables[i] for i in order))


def _with_module(t: TableSpec, module: str) -> TableSpec:
    return TableSpec(**{**vars(t), "module": module})


def assert_same_options(spec: Spec, topology, config: CostConfig) -> None:
    expected = torchrec_options(spec, topology, config)
    if topology.compute_device is ComputeDevice.CPU:  # TorchRec offers it, but cannot train it (issue 1255)
        unpooled = {(t.module, t.name) for t in spec.tables if t.pooling is Pooling.NONE}
        expected = {k: v for k, v in expected.items() if not (k[:2] in unpooled and k[2] == "data_parallel")}
    got = our_options(spec, topology, config)
    assert set(got) == set(expected)
    for key, shards in expected.items():
        ours = got[key]
        assert [s[:2] for s in ours] == [s[:2] for s in shards], key  # sizes and offsets
        assert [s[3:] for s in ours] == [s[3:] for s in shards], key  # hbm, ddr: exact
        assert [s[2] for s in ours] == [s[2] for s in shards], key  # perf parts: to the last bit


# ---------------------------------------------------------------- faithfulness


@pytest.mark.parametrize("case", range(len(CASES)))
def test_embedding_collection_options_shards_perf_and_storage_match_torchrec(case):
    device, world, local, optimizer, caching_ratio = CASES[case]
    rng = np.random.default_rng(200 + case)
    topology = random_topology(rng, device, world, local)
    config = CostConfig(optimizer=optimizer, caching_ratio=caching_ratio)
    spec = make_spec(*random_ec_tables(rng, "sequence.ec", 16, 0))
    assert_same_options(spec, topology, config)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_mixed_bag_and_sequence_modules_match_torchrec(case):
    device, world, local, optimizer, caching_ratio = CASES[case]
    rng = np.random.default_rng(300 + case)
    topology = random_topology(rng, device, world, local)
    config = CostConfig(optimizer=optimizer, caching_ratio=caching_ratio)
    spec = random_model_spec(rng, ["user_tower.ebc", "item_tower.blocks.0.ebc"], ["sequence.ec", "history"])
    # a third of the tables with an optimizer of their own (apply_optimizer_in_backward per table)
    spec = make_spec(*(replace(t, optimizer=list(Optimizer)[int(rng.integers(len(Optimizer)))])
                       if rng.random() < 1 / 3 else t for t in spec.tables))
    assert_same_options(spec, topology, config)


def test_unpooled_outputs_are_per_id_and_row_wise_splits_them_across_ranks():
    """Pooled: one vector per sample per feature; unpooled: one per id (pooling_factor per sample).
    row_wise: a pooled table's every rank writes the whole batch's (partial) sums, an unpooled table's
    each rank writes only its share of the ids."""
    from rec.cost.storage import storage_parts

    topology = random_topology(np.random.default_rng(0), ComputeDevice.CUDA, 8, 8)
    b, w, pf, dim = topology.batch_size, 8, 20.0, 64
    bag = TableSpec("a", 80_000, dim, ("a",), pooling_factor=pf)
    seq = TableSpec("a", 80_000, dim, ("a",), pooling=Pooling.NONE, pooling_factor=pf, module="seq")
    cols = table_arrays(make_spec(bag, seq), b, CostConfig(), world_size=w)
    assert cols.batch_outputs.tolist() == [b, pf * b]
    rows, col = np.array([10_000, 10_000]), np.array([dim, dim])
    for st, ids, per_rank in ((ShardingType.TABLE_WISE, pf * b * w, [b * w, pf * b * w]),
                              (ShardingType.ROW_WISE, pf * b, [b * w, pf * b])):
        parts = storage_parts(st, w, 8, 0.2, cols.rows, cols.dims, cols.elem, cols.optimizer_multiplier, rows, col,
                              cols.batch_inputs, cols.batch_outputs, False, pooled=cols.pooled)
        inputs = ids * 8  # row_wise: each rank reads its share of the ids
        assert parts.io.tolist() == [inputs + per_rank[0] * dim * 4, inputs + per_rank[1] * dim * 4], st


def test_capacity_reserves_every_modules_input_like_torchrec():
    rng = np.random.default_rng(5)
    spec = random_model_spec(rng, ["a.ebc", "b.ebc"], ["a.ec"], per_module=8)
    for device in ComputeDevice:
        topology = random_topology(rng, device, 4, 2)
        model, constraints = torchrec_model(spec, CostConfig())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reserved = HeuristicalStorageReservation(percentage=topology.storage_reservation).reserve(
                torchrec_topology(topology), topology.batch_size, model, SHARDERS, constraints)
        hbm, ddr = rank_capacity(spec, topology)
        assert hbm.tolist() == [d.storage.hbm for d in reserved.devices]
        assert ddr.tolist() == [d.storage.ddr for d in reserved.devices]


def test_profiles_rate_unpooled_tables_as_torchrecs_hardware_perf_config_does():
    from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory

    from tests.rec.test_cost import random_profile

    rng = np.random.default_rng(9)
    topology = random_topology(rng, ComputeDevice.CUDA, 16, 8)
    config = CostConfig(profile=random_profile(rng, ComputeDevice.CUDA))
    spec = random_model_spec(rng, ["ebc"], ["ec"], per_module=10)
    model, constraints = torchrec_model(spec, config)
    trec_topology, hardware = torchrec_hardware(config.profile, topology)
    estimator = EmbeddingPerfEstimatorFactory.create_with_config(hardware, topology=trec_topology,
                                                                 constraints=constraints)
    enumerator = EmbeddingEnumerator(topology=trec_topology, batch_size=topology.batch_size,
                                     constraints=constraints, estimator=[estimator])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = enumerator.enumerate(model, SHARDERS)
    expected = {(o.path, o.name, o.sharding_type, o.compute_kernel): [tuple(getattr(s.perf, p) for p in PERF_PARTS)
                                                                      for s in o.shards] for o in options}
    got = _our_perf_parts(spec, topology, config)
    assert {k for k in expected if k[0] == "ec"} <= set(got)
    for key, shards in expected.items():
        assert got[key] == shards, key


# ---------------------------------------------------------------- what the sharders offer


def test_embedding_collections_get_their_sharders_options_on_cpu_and_cuda():
    seq = TableSpec("s", 10_000, 64, ("s",), pooling=Pooling.NONE, module="seq")
    bag = TableSpec("b", 10_000, 64, ("b",))
    for device in ComputeDevice:
        topology = random_topology(np.random.default_rng(1), device, 4, 4)
        o = enumerate_options(make_spec(seq, bag), topology)
        kinds = {(SHARDING_TYPES[s], COMPUTE_KERNELS[k]) for s, k in zip(o.sharding_type[o.table == 0],
                                                                         o.compute_kernel[o.table == 0], strict=True)}
        assert kinds == {(st, ck) for st, cks in sharder_options(device, ModuleKind.EMBEDDING_COLLECTION).items()
                         for ck in cks}
        types = {SHARDING_TYPES[s] for s in o.sharding_type[o.table == 0]}
        # row_wise on cpu too, never table_row_wise; data_parallel only on cuda (on cpu TorchRec's dense kernel
        # returns one row per bag, not per id: TorchRec issue 1255)
        assert types == {ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE,
                         *[ShardingType.DATA_PARALLEL] * (device is ComputeDevice.CUDA)}
        bag_types = {SHARDING_TYPES[s] for s in o.sharding_type[o.table == 1]}
        assert (ShardingType.ROW_WISE in bag_types) == (device is ComputeDevice.CUDA)


def test_a_spec_without_modules_is_rated_exactly_as_before():
    rng = np.random.default_rng(4)
    tables = [random_table(rng, i) for i in range(25)]
    topology = random_topology(rng, ComputeDevice.CUDA, 16, 8)
    plain = enumerate_options(make_spec(*tables), topology)
    # The same tables named into one explicit module of their own: same options, same bytes.
    moved = enumerate_options(make_spec(*(_with_module(t, "towers.0.ebc") for t in tables)), topology)
    for field in ("table", "sharding_type", "compute_kernel", "shard_start", "perf", "hbm", "ddr", "rows"):
        assert getattr(plain, field).tobytes() == getattr(moved, field).tobytes(), field
    assert Optimizer.ROWWISE_ADAGRAD is CostConfig().optimizer


def test_an_embedding_collection_table_left_with_data_parallel_on_cpu_says_what_it_can_be():
    from rec.errors import InputError

    seq = TableSpec("s", 10_000, 64, ("s",), pooling=Pooling.NONE, module="seq",
                    sharding_types=(ShardingType.DATA_PARALLEL,))
    topology = random_topology(np.random.default_rng(2), ComputeDevice.CPU, 2, 2)
    with pytest.raises(InputError) as e:
        enumerate_options(make_spec(seq), topology)
    assert {p.where for p in e.value.problems} == {"table seq.s"}
    assert "on cpu a table of an EmbeddingCollection can be table_wise, column_wise, row_wise (fused)" in \
        [p.reason for p in e.value.problems]
    cuda = random_topology(np.random.default_rng(2), ComputeDevice.CUDA, 2, 2)
    assert enumerate_options(make_spec(seq), cuda).num_options == 1  # data_parallel on cuda
