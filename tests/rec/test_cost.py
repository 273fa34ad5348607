"""rec.cost against TorchRec 1.8's own enumerator, estimators and storage reservation."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rec.cost import CostConfig, Optimizer, enumerate_options, rank_capacity
from rec.cost.storage import ceil_true_div
from rec.cost.types import CK_CODE, COMPUTE_KERNELS, SHARDING_TYPES, ST_CODE
from rec.errors import InputError
from rec.plan.torchrec_score import torchrec_inputs, torchrec_topology
from rec.sharding import (
    NOT_PLANNED,
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


def torchrec_model(spec: Spec, config: CostConfig):
    """The EBC on the meta device and the ParameterConstraints shardflow's model stands for."""
    ebc, constraints, _, _ = torchrec_inputs(spec, make_topology(), config)
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
    spec = make_spec(*(random_table(rng, i) for i in range(20)))

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
    assert [p.where for p in err.value.problems] == ["table b"]


# ---------------------------------------------------------------- user-meaningful properties


def test_row_wise_allow_list_yields_only_row_wise_options():
    spec = make_spec(table("a", sharding_types=(ShardingType.ROW_WISE,)), table("b"))
    options = enumerate_options(spec, make_topology())
    a = options.table == 0
    assert {SHARDING_TYPES[c] for c in options.sharding_type[a]} == {ShardingType.ROW_WISE}
    assert len({SHARDING_TYPES[c] for c in options.sharding_type[~a]}) == 6


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


def test_cost_model_imports_no_torch():
    code = "import sys, rec.cost; sys.exit('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


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
