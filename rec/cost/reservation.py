"""Per-rank capacity left for embedding shards, as TorchRec's ``HeuristicalStorageReservation``."""

from __future__ import annotations

import math

import numpy as np

from rec.cost.constants import INDEX_BYTES, KJT_COPIES
from rec.sharding import ComputeDevice
from rec.spec.types import Spec
from rec.topology.types import Topology


def kjt_bytes(spec: Spec, batch_size: int) -> int:
    """``_get_kjt_storage``: ceil(sum of per-feature pf * batch_size * 8) * 20, over every module."""
    # TorchRec walks the model's modules in order, each module's tables in order: the spec's modules in
    # order of first appearance, as a model built from the spec holds them.
    position = {module: k for k, module in enumerate(spec.modules)}
    tables = sorted(spec.tables, key=lambda t: position[t.module]) if len(position) > 1 else spec.tables
    n = len(tables)
    pf = np.fromiter((t.pooling_factor for t in tables), np.float64, n)
    nf = np.fromiter((max(len(t.feature_names), 1) for t in tables), np.int64, n)
    # One term per feature in module order, summed with Python's sum() like TorchRec.
    return kjt_reserved((np.repeat(pf, nf) * batch_size).tolist())


def kjt_reserved(batch_inputs: list[float]) -> int:
    """``_get_kjt_storage``: the bytes of 20 copies of ``batch_inputs`` ids (per input, its pooling
    factor x batch size), 8 bytes an id, summed in order with Python's sum() as TorchRec sums them."""
    return math.ceil(sum(batch_inputs) * float(INDEX_BYTES)) * KJT_COPIES


def rank_capacity(spec: Spec, topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    """(hbm, ddr) bytes per rank after ``HeuristicalStorageReservation(storage_reservation)``.

    The percentage applies to HBM only; the dense-parameter reservation is 0 for a bare
    EmbeddingBagCollection; the input KJT reservation comes off HBM on cuda and off DDR on cpu
    (where TorchRec's topology has no HBM at all). HBM may come out negative where TorchRec
    raises PlannerError(INSUFFICIENT_STORAGE); no plan can then fit.
    """
    cuda = topology.compute_device == ComputeDevice.CUDA
    hbm = int((1 - topology.storage_reservation) * (topology.hbm_cap if cuda else 0))
    ddr = int(topology.ddr_cap)
    kjt = kjt_bytes(spec, topology.batch_size)
    if cuda:
        hbm -= kjt
    else:
        ddr -= kjt
    w = topology.world_size
    return np.full(w, hbm, dtype=np.int64), np.full(w, ddr, dtype=np.int64)
