"""rec.cost against TorchRec 1.8's own enumerator, estimators and storage reservation."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest

from rec.config.cost import CostConfig, Optimizer
from rec.cost import enumerate_options, rank_capacity
from rec.cost.storage import ceil_true_div
from rec.errors import InputError
from rec.sharding import (
    CK_CODE,
    COMPUTE_KERNELS,
    NOT_PLANNED,
    SHARDING_TYPES,
    ST_CODE,
    ComputeDevice,
    ComputeKernel,
    DataType,
    Pooling,
    ShardingType,
    sharder_options,
)
from rec.spec.types import Spec, TableSpec
from rec.topology import types as topo_defaults
from rec.topology.types import Topology
from rec.torchrec.score import torchrec_inputs
from rec.torchrec.topology import torchrec_topology

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator  # noqa: E402
from torchrec.distributed.planner.shard_estimators import (  # noqa: E402
    EmbeddingPerfEstimator,
    EmbeddingStorageEstimator,
)
from torchrec.distributed.planner.storage_reservations import (  # noqa: E402
    HeuristicalStorageReservation,
)
from torchrec.distributed.planner.types import PlannerError  # noqa: E402

DIMS = [4, 8, 12, 16, 36, 48, 64, 100, 124, 128, 132, 192, 200, 256, 260, 384, 516, 640, 1000, 1024]


# ---------------------------------------------------------------- building both sides


def make_topology(
    world_size: int = 8,
    local_world_size: int = 8,
    device: ComputeDevice = ComputeDevice.CUDA,
    batch_size: int = 512,
    **overrides: Any,
) -> Topology:
    values: dict[str, Any] = dict(
        world_size=world_size,
        local_world_size=local_world_size,
        compute_device=device,
        hbm_cap=topo_defaults.HBM_CAP,
        ddr_cap=topo_defaults.DDR_CAP,
        intra_host_bw=topo_defaults.INTRA_NODE_BANDWIDTH,
        inter_host_bw=topo_defaults.CROSS_NODE_BANDWIDTH,
        hbm_mem_bw=topo_defaults.HBM_MEM_BW,
        ddr_mem_bw=topo_defaults.DDR_MEM_BW,
        batch_size=batch_size,
        storage_reservation=0.15,
    )
    values.update(overrides)
    return Topology(**values)


def make_spec(*tables: TableSpec) -> Spec:
    return Spec(tables=tuple(tables), spec_hash="x")


def table(name: str = "t", rows: int = 1000, dim: int = 64, **kw) -> TableSpec:
    return TableSpec(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=(name,), **kw)


def torchrec_model(spec: Spec, config: CostConfig, topology: Topology | None = None):
    """The EBC on the meta device and the ParameterConstraints shardflow's model stands for on
    ``topology`` (whose global batch decides which tables' statistics TorchRec reads)."""
    ebc, constraints, _, _ = torchrec_inputs(spec, topology or make_topology(), config)
    return ebc, constraints


def torchrec_options(spec: Spec, topology: Topology, config: CostConfig) -> dict:
    """(table, sharding type, kernel) -> [(size, offset, perf, hbm, ddr)] from TorchRec."""
    ebc, constraints = torchrec_model(spec, config)
    trec_topology = torchrec_topology(topology)
    enumerator = EmbeddingEnumerator(
        topology=trec_topology,
        batch_size=topology.batch_size,
        constraints=constraints,
        estimator=[
            EmbeddingPerfEstimator(trec_topology, constraints),
            EmbeddingStorageEstimator(trec_topology, constraints),
        ],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = enumerator.enumerate(ebc, [EmbeddingBagCollectionSharder()])
    return {
        (o.name, o.sharding_type, o.compute_kernel): [
            (list(s.size), list(s.offset), s.perf.total, s.storage.hbm, s.storage.ddr)
            for s in o.shards
        ]
        for o in options
    }


def our_options(spec: Spec, topology: Topology, config: CostConfig) -> dict:
    o = enumerate_options(spec, topology, config).expand()
    out = {}
    for i in range(o.num_options):
        s = o.shards(i)
        key = (
            spec.tables[o.table[i]].name,
            SHARDING_TYPES[o.sharding_type[i]].value,
            COMPUTE_KERNELS[o.compute_kernel[i]].value,
        )
        columns = (o.rows, o.cols, o.row_offset, o.col_offset, o.perf, o.hbm, o.ddr)
        out[key] = [
            ([int(r), int(c)], [int(ro), int(co)], float(p), int(h), int(d))
            for r, c, ro, co, p, h, d in zip(*(x[s] for x in columns), strict=True)
        ]
    return out


# ---------------------------------------------------------------- random inputs


def pick(rng: np.random.Generator, values: list, size: int | None = None):
    """rng.choice for enums (numpy would turn them into strings)."""
    if size is None:
        return values[int(rng.integers(len(values)))]
    return [values[i] for i in rng.choice(len(values), size=size, replace=False)]


# Spec validation refuses the names shardflow never plans.
PLANNED_SHARDING_TYPES = [st for st in ShardingType if st not in NOT_PLANNED]
PLANNED_KERNELS = [ck for ck in ComputeKernel if ck not in NOT_PLANNED]


def random_table(rng: np.random.Generator, i: int) -> TableSpec:
    rows = int(np.exp(rng.uniform(np.log(2), np.log(5e7))))
    dim = int(rng.choice(DIMS)) if rng.random() < 0.7 else 4 * int(rng.integers(1, 257))
    nf = int(rng.choice([1, 1, 1, 2, 3]))
    sharding_types = None
    compute_kernels = None
    if rng.random() < 0.3:
        # Always keep table_wise so that the table has options on every device.
        extra = pick(rng, PLANNED_SHARDING_TYPES, size=int(rng.integers(0, 4)))
        sharding_types = tuple(dict.fromkeys([ShardingType.TABLE_WISE, *extra]))
    if rng.random() < 0.3:
        extra = pick(rng, PLANNED_KERNELS, size=int(rng.integers(0, 3)))
        compute_kernels = tuple(dict.fromkeys([ComputeKernel.FUSED, *extra]))
    elif rng.random() < 0.1 and sharding_types is None:
        compute_kernels = (ComputeKernel.DENSE,)  # data_parallel only
    return TableSpec(
        name=f"t{i}",
        num_embeddings=rows,
        embedding_dim=dim,
        feature_names=tuple(f"t{i}_f{k}" for k in range(nf)),
        pooling=Pooling.SUM if rng.random() < 0.8 else Pooling.MEAN,
        data_type=pick(rng, [DataType.FP32] * 2 + [DataType.FP16, DataType.BF16, DataType.INT8]),
        pooling_factor=float(np.round(np.exp(rng.uniform(np.log(0.05), np.log(200))), 3)),
        sharding_types=sharding_types,
        compute_kernels=compute_kernels,
        # a cache size of its own (TorchRec's per-table CacheParams.load_factor) for some tables
        cache_load_factor=float(np.round(rng.uniform(0.01, 1.0), 3)) if rng.random() < 0.3 else None,
    )


def random_topology(
    rng: np.random.Generator, device: ComputeDevice, world_size: int, local_world_size: int
) -> Topology:
    scale = lambda: float(np.exp(rng.uniform(-1.5, 1.5)))  # noqa: E731
    return make_topology(
        world_size=world_size,
        local_world_size=local_world_size,
        device=device,
        batch_size=int(rng.choice([1, 7, 128, 512, 1000, 8192])),
        hbm_cap=int(rng.integers(8, 192)) * 1024**3,
        ddr_cap=int(rng.integers(64, 1024)) * 1024**3,
        intra_host_bw=topo_defaults.INTRA_NODE_BANDWIDTH * scale(),
        inter_host_bw=topo_defaults.CROSS_NODE_BANDWIDTH * scale(),
        hbm_mem_bw=topo_defaults.HBM_MEM_BW * scale(),
        ddr_mem_bw=topo_defaults.DDR_MEM_BW * scale(),
        storage_reservation=float(rng.choice([0.0, 0.15, 0.3])),
    )


# device, world_size, local_world_size, optimizer, caching ratio: every sharding type's comms
# regime (one host, two hosts, more than two), every optimizer multiplier, the 0.0 ratio quirk.
CASES = [
    (ComputeDevice.CUDA, 8, 8, Optimizer.ROWWISE_ADAGRAD, 0.2),
    (ComputeDevice.CUDA, 24, 8, Optimizer.ADAM, 0.5),
    (ComputeDevice.CUDA, 8, 4, Optimizer.SGD, 0.0),
    (ComputeDevice.CUDA, 1, 1, Optimizer.NONE, 0.05),
    (ComputeDevice.CPU, 4, 2, Optimizer.ADAGRAD, 0.2),
    (ComputeDevice.CPU, 27, 3, Optimizer.ROWWISE_ADAGRAD, 0.2),
]


# ---------------------------------------------------------------- faithfulness


@pytest.mark.parametrize("case", range(len(CASES)))
def test_options_shards_perf_and_storage_match_torchrec(case):
    device, world, local, optimizer, caching_ratio = CASES[case]
    rng = np.random.default_rng(case)
    topology = random_topology(rng, device, world, local)
    config = CostConfig(optimizer=optimizer, caching_ratio=caching_ratio)
    spec = with_weighted_module(rng, make_spec(*(random_table(rng, i) for i in range(20))))

    expected = torchrec_options(spec, topology, config)
    got = our_options(spec, topology, config)

    assert set(got) == set(expected)
    for key, shards in expected.items():
        ours = got[key]
        assert [s[:2] for s in ours] == [s[:2] for s in shards], key  # sizes and offsets
        assert [s[3:] for s in ours] == [s[3:] for s in shards], key  # hbm, ddr: exact
        perf, expected_perf = [s[2] for s in ours], [s[2] for s in shards]
        np.testing.assert_allclose(perf, expected_perf, rtol=1e-6, err_msg=str(key))


@pytest.mark.parametrize("device", [ComputeDevice.CUDA, ComputeDevice.CPU])
def test_rank_capacity_matches_heuristical_storage_reservation(device):
    rng = np.random.default_rng(7)
    spec = make_spec(*(random_table(rng, i) for i in range(30)))
    topology = make_topology(world_size=4, local_world_size=2, device=device, batch_size=4096)
    ebc, constraints = torchrec_model(spec, CostConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reserved = HeuristicalStorageReservation(percentage=topology.storage_reservation).reserve(
            torchrec_topology(topology),
            topology.batch_size,
            ebc,
            [EmbeddingBagCollectionSharder()],
            constraints,
        )
    hbm, ddr = rank_capacity(spec, topology)
    assert hbm.tolist() == [d.storage.hbm for d in reserved.devices]
    assert ddr.tolist() == [d.storage.ddr for d in reserved.devices]


def test_rank_capacity_goes_negative_where_torchrec_reservation_raises():
    # 64 MiB of HBM cannot hold 20 copies of a 1M-id input batch.
    spec = make_spec(table("a", pooling_factor=1000.0))
    topology = make_topology(world_size=2, local_world_size=2, batch_size=1024, hbm_cap=2**26)
    ebc, constraints = torchrec_model(spec, CostConfig())
    with pytest.raises(PlannerError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        HeuristicalStorageReservation(percentage=topology.storage_reservation).reserve(
            torchrec_topology(topology), 1024, ebc, [EmbeddingBagCollectionSharder()], constraints
        )
    hbm, _ = rank_capacity(spec, topology)
    assert hbm.tolist() == [int((1 - 0.15) * 2**26) - math.ceil(1000.0 * 1024 * 8.0) * 20] * 2


def test_no_option_left_raises_input_error_where_torchrec_raises():
    # row_wise is cuda-only: on cpu the table has nothing left.
    spec = make_spec(table("a"), table("b", sharding_types=(ShardingType.ROW_WISE,)))
    topology = make_topology(device=ComputeDevice.CPU)
    with pytest.raises(RuntimeError):
        torchrec_options(spec, topology, CostConfig())
    with pytest.raises(InputError) as err:
        enumerate_options(spec, topology)
    assert {p.where for p in err.value.problems} == {"table b"}
    assert err.value.render().splitlines()[1:] == [
        "  - table b: no sharding type and compute kernel left after its allow-lists (sharding_types=row_wise, "
        "compute_kernels=any)",
        "  - table b: on cpu a table of an EmbeddingBagCollection can be data_parallel (dense); table_wise, "
        "column_wise, table_column_wise (fused)"]  # each line whole: a longer one was cut before its remedy


# ---------------------------------------------------------------- user-meaningful properties


def test_row_wise_allow_list_yields_only_row_wise_options():
    spec = make_spec(table("a", sharding_types=(ShardingType.ROW_WISE,)), table("b"))
    options = enumerate_options(spec, make_topology())
    a = options.table == 0
    assert {SHARDING_TYPES[c] for c in options.sharding_type[a]} == {ShardingType.ROW_WISE}
    assert len({SHARDING_TYPES[c] for c in options.sharding_type[~a]}) == 6


def test_a_table_fbgemm_refuses_on_cuda_is_named_with_fbgemms_rule_not_only_its_allow_lists():
    spec = make_spec(table("odd", dim=5, sharding_types=(ShardingType.DATA_PARALLEL,)),
                     table("wide", dim=4096, sharding_types=(ShardingType.TABLE_WISE,)), table("fine"))
    with pytest.raises(InputError) as e:
        enumerate_options(spec, make_topology())
    text = e.value.render()
    assert "table odd: its embedding_dim 5 is no multiple of 4, which FBGEMM's kernels on cuda need" in text
    assert ("table wide: FBGEMM's kernels on cuda take shards of at most 2,048 columns, and only column_wise and "
            "table_column_wise split its 4,096") in text
    assert "table fine" not in text


def test_a_table_without_options_hides_no_other_tables_problem():
    """A table FBGEMM refuses on cuda stopped the check before a table too large for any rank was named:
    the user learned of the second one run later."""
    from rec.search.pipeline import build_search_space

    spec = make_spec(table("wide", dim=4096, sharding_types=(ShardingType.TABLE_WISE,)),
                     table("huge", rows=1 << 40, dim=4), table("fine"))
    with pytest.raises(InputError) as e:
        build_search_space(spec, make_topology())
    assert e.value.title == "Some tables cannot be placed on this topology"
    assert [p.where for p in e.value.problems] == ["table wide"] * 3 + ["table huge"]
    assert e.value.problems[-1].reason.startswith("does not fit: its best option")


def test_table_wise_hbm_on_cuda_with_rowwise_adagrad_is_weights_plus_row_state_plus_io():
    rows, dim, pf, batch, world = 100_000, 64, 3.0, 512, 8
    spec = make_spec(table("a", rows=rows, dim=dim, pooling_factor=pf))
    topology = make_topology(world_size=world, batch_size=batch)
    o = enumerate_options(spec, topology, CostConfig(optimizer=Optimizer.ROWWISE_ADAGRAD))
    tw = np.flatnonzero(
        (o.sharding_type == ST_CODE[ShardingType.TABLE_WISE])
        & (o.compute_kernel == CK_CODE[ComputeKernel.FUSED])
    )
    assert len(tw) == 1
    io = math.ceil(pf * batch * world * 8) + math.ceil(1.0 * batch * world * dim * 4)
    assert o.hbm[o.shards(tw[0])].tolist() == [rows * dim * 4 + rows * 4 + io]
    assert o.ddr[o.shards(tw[0])].tolist() == [0]


def test_cpu_offers_data_parallel_dense_and_fused_model_parallel_only():
    assert sharder_options(ComputeDevice.CPU) == {
        ShardingType.DATA_PARALLEL: (ComputeKernel.DENSE,),
        ShardingType.TABLE_WISE: (ComputeKernel.FUSED,),
        ShardingType.COLUMN_WISE: (ComputeKernel.FUSED,),
        ShardingType.TABLE_COLUMN_WISE: (ComputeKernel.FUSED,),
    }
    options = enumerate_options(make_spec(table()), make_topology(device=ComputeDevice.CPU))
    assert options.num_options == 4
    assert not options.hbm.any()  # a cpu topology has no HBM


def test_grid_shard_and_key_value_are_never_planned_even_when_allow_listed():
    listed = (ShardingType.GRID_SHARD, ShardingType.TABLE_WISE)
    kernels = (ComputeKernel.KEY_VALUE, ComputeKernel.FUSED)
    spec = make_spec(
        table("a", dim=256, sharding_types=listed, compute_kernels=kernels), table("b")
    )
    o = enumerate_options(spec, make_topology(world_size=8, local_world_size=4))
    assert {SHARDING_TYPES[c] for c in o.sharding_type[o.table == 0]} == {ShardingType.TABLE_WISE}
    assert ShardingType.GRID_SHARD not in {SHARDING_TYPES[c] for c in o.sharding_type}
    assert ComputeKernel.KEY_VALUE not in {COMPUTE_KERNELS[c] for c in o.compute_kernel}


def test_options_are_grouped_by_table_in_code_order():
    rng = np.random.default_rng(3)
    spec = make_spec(*(random_table(rng, i) for i in range(30)))
    o = enumerate_options(spec, make_topology())
    key = o.table.astype(np.int64) * 100 + o.sharding_type * 10 + o.compute_kernel
    assert (np.diff(key) > 0).all()


def test_data_parallel_and_row_wise_stay_compact_on_1024_ranks():
    spec = make_spec(table("a", rows=1000), table("b", rows=5_000_000, dim=128))
    topology = make_topology(world_size=1024, local_world_size=8)
    o = enumerate_options(spec, topology)
    assert o.num_entries().max() <= 3  # at most full / partial / empty runs
    dp_rw = np.isin(
        o.sharding_type,
        [ST_CODE[ShardingType.DATA_PARALLEL], ST_CODE[ShardingType.ROW_WISE]],
    )
    assert (o.num_shards()[dp_rw] == 1024).all()
    full = o.expand()
    rw = np.flatnonzero(dp_rw & (o.table == 0))[-1]
    s = full.shards(rw)
    # ceil(1000 / 1024) = 1 row on each of the first 1000 ranks, then empty shards at row 1000.
    assert full.rows[s].tolist() == [1] * 1000 + [0] * 24
    assert full.row_offset[s].tolist() == list(range(1000)) + [1000] * 24
    assert (full.hbm[s][1000:] == 0).all() and (full.hbm[s][:1000] > 0).all()


def test_fp16_and_smaller_types_are_estimated_as_fp16_like_torchrec_ebc():
    topology = make_topology()
    sizes = {}
    for dt in (DataType.FP32, DataType.FP16, DataType.BF16, DataType.INT8, DataType.INT4):
        o = enumerate_options(make_spec(table(data_type=dt)), topology, CostConfig(Optimizer.SGD))
        sizes[dt] = int(o.ddr[o.compute_kernel == CK_CODE[ComputeKernel.FUSED_UVM]][0])
    assert sizes[DataType.FP32] == 1000 * 64 * 4
    assert {sizes[dt] for dt in sizes if dt != DataType.FP32} == {1000 * 64 * 2}


def test_ceil_true_div_matches_python_on_large_operands():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**40, 20000)
    q = rng.integers(1, 2**34, 20000)
    p = (q * rng.random(20000)).astype(np.int64)
    p[:1000] = q[:1000]  # whole tables
    expected = [math.ceil(int(x) * int(y) / int(z)) for x, y, z in zip(a, p, q, strict=True)]
    assert ceil_true_div(a, p, q).tolist() == expected


def test_cuda_leaves_out_what_fbgemm_refuses_wide_shards_and_dense_dims_not_multiple_of_4():
    wide = enumerate_options(make_spec(table("wide", rows=1000, dim=4096)), make_topology())
    kinds = {SHARDING_TYPES[c] for c in wide.sharding_type}
    assert ShardingType.TABLE_WISE not in kinds and ShardingType.DATA_PARALLEL not in kinds
    assert ShardingType.COLUMN_WISE in kinds and int(wide.cols.max()) <= 2048
    odd = table("odd", rows=100, dim=13, sharding_types=(ShardingType.DATA_PARALLEL,))
    with pytest.raises(InputError, match="odd"):
        enumerate_options(make_spec(odd), make_topology())
    cpu = enumerate_options(make_spec(odd), make_topology(device=ComputeDevice.CPU))
    assert cpu.num_options == 1  # the dense kernel takes any dim on cpu


# ---------------------------------------------------------------- profiles: TorchRec's HardwarePerfConfig

from dataclasses import asdict, replace  # noqa: E402

from rec.cost.bandwidth import kernel_bw, links  # noqa: E402
from rec.cost.perf import shard_perf  # noqa: E402
from rec.cost.shards import layout  # noqa: E402
from rec.cost.tables import table_arrays  # noqa: E402
from rec.profile.types import (  # noqa: E402
    DEFAULT_PROFILE,
    Bandwidths,
    Coefficients,
    Extensions,
    KernelBandwidths,
    KernelCoefficients,
    PerfCoefficient,
    Profile,
    ShardingCoefficients,
)

PERF_PARTS = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "prefetch_compute")


def torchrec_hardware(profile: Profile, topology: Topology):
    """TorchRec's Topology (with the profile's bandwidths, bytes/ms) and a HardwarePerfConfig with its
    coefficients, backward multiplier and kernel bandwidths: TorchRec's own way to describe hardware."""
    from torchrec.distributed.planner.estimator import (
        EstimatorPerfCoefficients,
        HardwarePerfConfig,
        PerfCoefficientConfig,
    )
    from torchrec.distributed.planner.estimator import PerfCoefficient as TorchrecCoefficient
    from torchrec.distributed.planner.types import HardwareConfig, KernelConfig, TopologyFactory, TrainerConfig

    def coefficient(c: PerfCoefficient) -> TorchrecCoefficient:
        assert c.fixed_ms == 0.0  # an extension TorchRec has no term for
        return TorchrecCoefficient(c.input_read_size_multiplier, c.lookup_size_multiplier,
                                   c.embedding_output_multiplier, c.hash_size_multiplier)

    def coefficients(c: ShardingCoefficients) -> EstimatorPerfCoefficients:
        return EstimatorPerfCoefficients(fwd=coefficient(c.fwd), bwd=None if c.bwd is None else coefficient(c.bwd))

    def ms(per_second: float | None, default: float) -> float:
        return default if per_second is None else per_second / 1000

    c, b = profile.coefficients, profile.bandwidths
    config = HardwarePerfConfig()
    config._coefficients = PerfCoefficientConfig(
        table_wise=coefficients(c.table_wise),
        row_wise=coefficients(c.row_wise),
        table_row_wise=coefficients(c.table_row_wise),
        data_parallel=coefficients(c.data_parallel),
        column_wise=coefficients(c.column_wise),
        by_kernel={(e.sharding_type.value, e.compute_kernel.value): coefficients(e.coefficients)
                   for e in c.by_kernel},
        bwd_compute_multiplier=c.bwd_compute_multiplier,
        weighted_kernel_multiplier=c.weighted_kernel_multiplier,
        weighted_feature_bwd_compute_multiplier=c.weighted_feature_bwd_compute_multiplier,
    )
    config._bwd_compute_multiplier = c.bwd_compute_multiplier
    config._weighted_feature_bwd_compute_multiplier = c.weighted_feature_bwd_compute_multiplier
    device = topology.compute_device.value
    config.kernel_device_bandwidths = {(device, k): v / 1000 for k, v in asdict(
        profile.kernel_bandwidths).items() if v is not None}
    config.hbm_to_ddr_mem_bw = ms(b.hbm_to_ddr_mem_bw, 32 * 1024**3 / 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trec_topology = TopologyFactory.create_topology(
            trainer_config=TrainerConfig(world_size=topology.world_size, local_world_size=topology.local_world_size,
                                         hbm_cap_bytes=topology.hbm_cap, ddr_cap_bytes=topology.ddr_cap,
                                         ssd_cap_bytes=0),
            hardware_config=HardwareConfig(
                hbm_mem_bw=ms(b.hbm_mem_bw, topology.hbm_mem_bw),
                ddr_mem_bw=ms(b.ddr_mem_bw, topology.ddr_mem_bw),
                hbm_to_ddr_mem_bw=config.hbm_to_ddr_mem_bw,
                intra_host_bw=ms(b.intra_host_bw, topology.intra_host_bw),
                inter_host_bw=ms(b.inter_host_bw, topology.inter_host_bw),
            ),
            kernel_config=KernelConfig(compute_device=device, use_hardware_based_bandwidth=True),
        )
    return trec_topology, config


def torchrec_perfs(spec: Spec, topology: Topology, config: CostConfig) -> dict:
    """(table, sharding type, kernel) -> per shard (fwd_compute, fwd_comms, bwd_compute, bwd_comms,
    prefetch_compute) from TorchRec's EmbeddingPerfEstimator under the profile's HardwarePerfConfig."""
    from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory

    ebc, constraints = torchrec_model(spec, config, topology)
    trec_topology, hardware = torchrec_hardware(config.profile, topology)
    estimator = EmbeddingPerfEstimatorFactory.create_with_config(hardware, topology=trec_topology,
                                                                 constraints=constraints)
    enumerator = EmbeddingEnumerator(
        topology=trec_topology, batch_size=topology.batch_size, constraints=constraints,
        estimator=[estimator, EmbeddingStorageEstimator(trec_topology, constraints)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = enumerator.enumerate(ebc, [EmbeddingBagCollectionSharder()])
    return {(o.name, o.sharding_type, o.compute_kernel): [tuple(getattr(s.perf, p) for p in PERF_PARTS)
                                                          for s in o.shards] for o in options}


def our_perfs(spec: Spec, topology: Topology, config: CostConfig) -> dict:
    """The same from rec.cost's estimator, option by option (runs expanded to shards)."""
    cols = table_arrays(spec, topology.batch_size, config, world_size=topology.world_size)
    hw = links(topology, config.profile)
    out = {}
    for st, kernels in sharder_options(topology.compute_device).items():
        for ck in kernels:
            tab = np.flatnonzero(cols.sharding_allowed[:, ST_CODE[st]] & cols.kernel_allowed[:, CK_CODE[ck]])
            lay = layout(st, cols.rows[tab], cols.dims[tab], topology.world_size, topology.local_world_size)
            t = tab[lay.owner]
            bw = kernel_bw(hw, config.profile, ck, cols.load_factor[t])
            perf = shard_perf(st, ck, topology, config.profile, hw, bw, lay.rows, lay.cols, cols.elem[t],
                              cols.batch_inputs[t], cols.priced_outputs[t], miss_rate=cols.miss_rate[t],
                              cache_fetches=cols.cache_fetches[t], weighted=cols.weighted[t])
            parts = np.stack([np.repeat(getattr(perf, p), lay.repeat) for p in PERF_PARTS], axis=1)
            if not len(tab):
                continue
            ends = np.cumsum(np.add.reduceat(lay.repeat, np.cumsum(lay.count) - lay.count))
            for i, rows in zip(tab, np.split(parts, ends[:-1]), strict=True):
                out[(spec.tables[i].name, st.value, ck.value)] = [tuple(r) for r in rows.tolist()]
    return out


def random_profile(rng: np.random.Generator, device: ComputeDevice) -> Profile:
    """Non-default everything TorchRec's HardwarePerfConfig can express (extensions stay at their defaults)."""
    def coefficient() -> PerfCoefficient:
        a, b, c = (float(rng.uniform(0.1, 4)) for _ in range(3))
        return PerfCoefficient(input_read_size_multiplier=a, lookup_size_multiplier=b, embedding_output_multiplier=c,
                               hash_size_multiplier=float(rng.choice([0.0, rng.uniform(0, 0.1)])))

    def sharding() -> ShardingCoefficients:
        return ShardingCoefficients(coefficient(), coefficient() if rng.random() < 0.5 else None)

    def bandwidth(default: float) -> float | None:
        return None if rng.random() < 0.25 else default * 1000 * float(np.exp(rng.uniform(-3, 2)))

    pairs = [(st, ck) for st, kernels in sharder_options(device).items() for ck in kernels]
    chosen = sorted(rng.choice(len(pairs), size=min(3, len(pairs)), replace=False).tolist())
    kernels = {ck.value: bandwidth(topo_defaults.DDR_MEM_BW) for ck in {ck for _, ck in pairs}
               if rng.random() < 0.3}
    return Profile(
        name="random",
        bandwidths=Bandwidths(bandwidth(topo_defaults.HBM_MEM_BW), bandwidth(topo_defaults.DDR_MEM_BW),
                              bandwidth(32 * 1024**3 / 1000), bandwidth(topo_defaults.INTRA_NODE_BANDWIDTH),
                              bandwidth(topo_defaults.CROSS_NODE_BANDWIDTH)),
        kernel_bandwidths=KernelBandwidths(**kernels),
        coefficients=Coefficients(
            table_wise=sharding(), column_wise=sharding(), row_wise=sharding(), table_row_wise=sharding(),
            data_parallel=sharding(),
            by_kernel=tuple(KernelCoefficients(pairs[i][0], pairs[i][1], sharding()) for i in chosen),
            bwd_compute_multiplier=float(rng.uniform(0.5, 4)),
            weighted_feature_bwd_compute_multiplier=float(rng.uniform(0.5, 2)),
            weighted_kernel_multiplier=float(rng.uniform(0.5, 2)),
        ),
    )


def with_statistics(rng: np.random.Generator, spec: Spec, topology: Topology) -> Spec:
    """``spec`` with TorchRec's cache statistics (a hit-rate curve, the distinct ids of a global batch)
    for about half its tables; some others are counted at another batch, which TorchRec never sees."""
    global_batch = topology.batch_size * topology.world_size
    tables = []
    for t in spec.tables:
        if rng.random() < 0.6:
            skew = float(rng.uniform(1, 6))
            t = replace(t, hit_rate_curve=tuple((f, f ** (1 / skew)) for f in (0.01, 0.05, 0.2, 0.5)),
                        distinct_per_batch=float(rng.uniform(0, 2 * global_batch)),
                        stats_batch_size=global_batch if rng.random() < 0.8 else global_batch + 1)
        tables.append(t)
    return make_spec(*tables)


def with_weighted_module(rng: np.random.Generator, spec: Spec) -> Spec:
    """``spec`` with about a third of its tables moved to a weighted EmbeddingBagCollection (id-score
    lists, TorchRec's ``is_weighted=True``) of their own."""
    return make_spec(*(replace(t, module="sparse.weighted_ebc", is_weighted=True) if rng.random() < 0.35 else t
                       for t in spec.tables))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_per_shard_perf_matches_torchrec_under_an_equivalent_hardware_perf_config(case):
    device, world, local, optimizer, caching_ratio = CASES[case]
    rng = np.random.default_rng(100 + case)
    topology = random_topology(rng, device, world, local)
    config = CostConfig(optimizer=optimizer, caching_ratio=caching_ratio, profile=random_profile(rng, device))
    spec = with_statistics(rng, make_spec(*(random_table(rng, i) for i in range(20))), topology)
    spec = with_weighted_module(rng, spec)

    expected = torchrec_perfs(spec, topology, config)
    got = our_perfs(spec, topology, config)
    assert got and set(got) <= set(expected)
    default = our_perfs(spec, topology, replace(config, profile=DEFAULT_PROFILE))
    assert all(got[k][0][0] != default[k][0][0] for k in got)  # the profile changes every forward compute
    for key, shards in got.items():  # to the last bit: the same float operations in the same order
        assert shards == expected[key], key
    if device is ComputeDevice.CUDA:  # cache statistics price the fetches of some caches, row_wise ones a share
        fetching = {key[1] for key, shards in got.items() if any(p[4] > 0 for p in shards)}
        assert fetching >= {"table_wise", "row_wise", "table_row_wise"}
    # The search's per-shard perf is Perf.total of the same parts.
    totals = our_options(spec, topology, config)
    for key, shards in totals.items():
        np.testing.assert_allclose([s[2] for s in shards], [sum(p[:2]) + sum(p[2:]) for p in expected[key]],
                                   rtol=1e-9, err_msg=str(key))


def test_a_profile_spelling_out_torchrecs_values_gives_the_default_estimates_to_the_last_bit():
    rng = np.random.default_rng(11)
    topology = random_topology(rng, ComputeDevice.CUDA, 16, 8)
    spec = make_spec(*(random_table(rng, i) for i in range(20)))
    t = topology
    spelled = Profile(
        bandwidths=Bandwidths(*(x * 1000 for x in (t.hbm_mem_bw, t.ddr_mem_bw, 32 * 1024**3 / 1000,
                                                   t.intra_host_bw, t.inter_host_bw))),
        coefficients=Coefficients(table_wise=ShardingCoefficients(PerfCoefficient(1.0, 1.0, 1.0, 0.0, 0.0)),
                                  bwd_compute_multiplier=2.0),
        extensions=Extensions(0.0, 0.0, 2.455, 9.22),
    )
    assert not spelled.is_default  # it names bandwidths; the estimates are the default's all the same
    default, same = (enumerate_options(spec, topology, CostConfig(profile=p)) for p in (DEFAULT_PROFILE, spelled))
    assert default.perf.tobytes() == same.perf.tobytes()
    assert default.perf.tobytes() == enumerate_options(spec, topology).perf.tobytes()


def test_extensions_add_fixed_and_latency_terms_and_scale_copy_and_optimizer_kernels():
    topology = make_topology(world_size=16, local_world_size=8)  # two hosts
    rows, dim, batch = 100_000, 128, topology.batch_size
    spec = make_spec(table("a", rows=rows, dim=dim, pooling_factor=4.0))
    inter = topo_defaults.CROSS_NODE_BANDWIDTH  # bytes/ms
    output = batch * 16 * dim * 4  # pooled rows of the whole batch, fp32

    def parts(profile: Profile, st: str, ck: str = "fused") -> dict[str, float]:
        return dict(zip(PERF_PARTS, our_perfs(spec, topology, CostConfig(profile=profile))[("a", st, ck)][0],
                        strict=True))

    base = {st: parts(DEFAULT_PROFILE, st) for st in ("table_wise", "row_wise")}
    base["data_parallel"] = parts(DEFAULT_PROFILE, "data_parallel", "dense")

    fixed = Profile(coefficients=Coefficients(row_wise=ShardingCoefficients(PerfCoefficient(fixed_ms=0.25)),
                                              table_wise=ShardingCoefficients(bwd=PerfCoefficient(fixed_ms=0.5))))
    rw, tw = parts(fixed, "row_wise"), parts(fixed, "table_wise")
    assert rw["fwd_compute"] == pytest.approx(base["row_wise"]["fwd_compute"] + 0.25)
    assert rw["bwd_compute"] == pytest.approx(2 * (base["row_wise"]["fwd_compute"] + 0.25))  # no bwd block
    # A bwd block replaces forward x 2: its own coefficients, without the block penalty, plus its fixed_ms.
    assert tw["bwd_compute"] == pytest.approx(base["table_wise"]["fwd_compute"] + 0.5)  # dim 128: no penalty

    latency = Profile(extensions=Extensions(intra_host_latency_ms=0.01, inter_host_latency_ms=0.1))
    for st, ck in (("table_wise", "fused"), ("row_wise", "fused"), ("data_parallel", "dense")):
        got, before = parts(latency, st, ck), base[st]
        assert got["fwd_comms"] == pytest.approx(before["fwd_comms"] + (0 if st == "data_parallel" else 0.1))
        assert got["bwd_comms"] == pytest.approx(before["bwd_comms"] + 0.1)  # every collective here is inter-host
        assert got["fwd_compute"] == before["fwd_compute"]

    no_copy = Profile(extensions=Extensions(batched_copy_factor=0.0, dp_optimizer_factor=0.0))
    assert parts(no_copy, "row_wise")["bwd_comms"] == pytest.approx(output / inter)  # the all-gather alone
    table_bytes = rows * dim * 4
    all_reduce = table_bytes * 1.5 / (inter * 8)  # ring all-reduce over 2 nodes, one NIC per GPU
    assert parts(no_copy, "data_parallel", "dense")["bwd_comms"] == pytest.approx(all_reduce)


@pytest.mark.parametrize("device", [ComputeDevice.CUDA, ComputeDevice.CPU])
def test_min_partition_sets_the_column_shard_width_as_torchrec_does(device):
    dims_and_bounds = [(512, 256), (512, 100), (768, 300), (256, 1000), (96, 8), (132, 4), (640, None)]
    spec = make_spec(*(table(f"t{i}", rows=5000, dim=dim, min_partition=m)
                       for i, (dim, m) in enumerate(dims_and_bounds)))
    topology = make_topology(world_size=4, local_world_size=2, device=device)
    expected = torchrec_options(spec, topology, CostConfig())
    got = our_options(spec, topology, CostConfig())
    assert set(got) == set(expected)
    for key, shards in expected.items():
        assert [s[:2] for s in got[key]] == [s[:2] for s in shards], key
        assert [s[3:] for s in got[key]] == [s[3:] for s in shards], key
    widths = {name: {s[0][1] for s in shards} for (name, st, _), shards in got.items() if st == "column_wise"}
    assert widths["t0"] == {256} and widths["t1"] == {128} and widths["t2"] == {384} and widths["t3"] == {256}
    assert widths["t4"] == {8} and widths["t5"] == {4}  # below TorchRec's 128 default: narrower shards


def test_empty_bags_are_priced_as_outputs_when_the_profile_says_so_and_storage_stays_torchrecs():
    """A sparse pooled feature (pooling factor below 1) still outputs a vector per sample without
    variable batches: under ``empty_bag_output_multiplier`` 1 its output comms are those of the same
    table at pooling factor 1; at 0 (the default) they are TorchRec 1.8's, and memory is TorchRec's
    either way. Tables with a pooling factor of 1 or more, and unpooled ones, are priced alike."""
    topology = make_topology(world_size=4, local_world_size=4)
    one_per_sample = replace(DEFAULT_PROFILE, extensions=replace(DEFAULT_PROFILE.extensions,
                                                                 empty_bag_output_multiplier=1.0))
    spec = make_spec(table("sparse", pooling_factor=0.1), table("dense_feature", pooling_factor=1.0),
                     table("busy", pooling_factor=7.0),
                     replace(table("sequence", pooling_factor=0.3), pooling=Pooling.NONE, module="seq.ec"))
    default, physical = (our_perfs(spec, topology, CostConfig(profile=p)) for p in (DEFAULT_PROFILE, one_per_sample))
    theirs = torchrec_perfs(spec, topology, CostConfig())  # the bag collection's tables
    assert theirs and all(default[key] == shards for key, shards in theirs.items())  # the default is TorchRec's
    for key, shards in physical.items():
        if key[0] == "sparse":
            dense_key = ("dense_feature", *key[1:])
            assert [s[1] for s in shards] == [s[1] for s in physical[dense_key]], key  # fwd comms, a vector each
            assert all(s[1] > d[1] for s, d in zip(shards, default[key], strict=True) if d[1]), key
        else:
            assert shards == default[key], key
    options = {p: enumerate_options(spec, topology, CostConfig(profile=p)) for p in (DEFAULT_PROFILE, one_per_sample)}
    assert options[DEFAULT_PROFILE].hbm.tobytes() == options[one_per_sample].hbm.tobytes()
