"""TorchRec 1.8 planner constants the cost model uses (``torchrec/distributed/planner/constants.py``
and the estimators' module constants), one home each."""

from __future__ import annotations

INDEX_BYTES = 8  # BIGINT_DTYPE: TBE converts indices to int64
# Our Topology has no key for the HBM<->DDR (UVM) link, so TorchRec's default applies unless a
# profile sets it, as for a torchrec Topology built without hbm_to_ddr_mem_bw (bytes/ms).
HBM_TO_DDR_MEM_BW = 32 * 1024 * 1024 * 1024 / 1000
# UVM_CACHING_RATIO is CostConfig's default caching_ratio: rec.config.cost.
# TorchRec's empirical perf factors (backward multiplier, batched copy, data_parallel optimizer
# kernels) are a profile's defaults: rec.profile.types.
MIN_CW_DIM = 128
FULL_BLOCK_EMB_DIM = 128
HALF_BLOCK_PENALTY = 1.15
QUARTER_BLOCK_PENALTY = 1.75
# FBGEMM's CUDA kernels (embedding_forward_split_template.cu): every table's width a multiple of 4
# (the dense kernel too), and at most 2,048 columns per shard.
CUDA_DIM_MULTIPLE = 4
CUDA_MAX_SHARD_DIM = 2048
KJT_COPIES = 20  # HeuristicalStorageReservation: 2 pipelined batches x 10 copies of the input KJT
