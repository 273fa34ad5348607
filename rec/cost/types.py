"""The search's hot data: every candidate option of every table, as flat numpy arrays.

An *option* is one (table, sharding type, compute kernel) with its shard layout. Shards of
option ``o`` are ``shard_start[o]:shard_start[o + 1]`` in the per-shard arrays (CSR layout).
Where a shard may be placed follows from the sharding type (see ``rec.search.placement``).

Shards are run-length encoded so that 1,024-rank data_parallel / row_wise options stay small: entry
``s`` stands for ``repeat[s]`` consecutive shards of the same size and cost, the k-th of which
starts at row ``row_offset[s] + k * row_step[s]`` (DP replicas: step 0; row splits: step = rows).
Only data_parallel, row_wise and table_row_wise entries have ``repeat > 1``; shard k
of a data_parallel or row_wise option lives on rank k. ``expand()`` gives one entry per shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Options:
    """All candidate options with per-shard perf (ms, TorchRec ``Perf.total``) and storage."""

    table: np.ndarray  # (O,) int32: index into spec.tables
    sharding_type: np.ndarray  # (O,) int8: code into SHARDING_TYPES
    compute_kernel: np.ndarray  # (O,) int8: code into COMPUTE_KERNELS
    shard_start: np.ndarray  # (O+1,) int64
    perf: np.ndarray  # (S,) float64
    hbm: np.ndarray  # (S,) int64 bytes
    ddr: np.ndarray  # (S,) int64 bytes
    row_offset: np.ndarray  # (S,) int64
    col_offset: np.ndarray  # (S,) int64
    rows: np.ndarray  # (S,) int64
    cols: np.ndarray  # (S,) int64
    repeat: np.ndarray  # (S,) int32 shards per entry
    row_step: np.ndarray  # (S,) int64 row offset step within a run

    @property
    def num_options(self) -> int:
        return len(self.table)

    def shards(self, option: int) -> slice:
        """The option's entries (runs of shards) in the per-shard arrays."""
        return slice(int(self.shard_start[option]), int(self.shard_start[option + 1]))

    def num_entries(self) -> np.ndarray:
        """Entries (runs) per option."""
        return np.diff(self.shard_start)

    def find(self, table: np.ndarray, sharding_type: np.ndarray, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the option of each (table, sharding type, kernel), whether there is one): where there is
        none the option given is another's."""
        from rec.sharding import COMPUTE_KERNELS, SHARDING_TYPES

        def key(t: np.ndarray, st: np.ndarray, ck: np.ndarray) -> np.ndarray:
            out: np.ndarray = (np.asarray(t, np.int64) * len(SHARDING_TYPES) + st) * len(COMPUTE_KERNELS) + ck
            return out

        mine = key(self.table, self.sharding_type, self.compute_kernel)
        wanted = key(table, sharding_type, kernel)
        order = np.argsort(mine, kind="stable")
        option = order[np.minimum(np.searchsorted(mine[order], wanted), max(len(order) - 1, 0))]
        return option, mine[option] == wanted

    def entries(self, options: np.ndarray) -> np.ndarray:
        """Indices of all entries of ``options``, option by option."""
        starts = self.shard_start[options]
        counts = self.shard_start[options + 1] - starts
        offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
        return np.asarray(np.arange(counts.sum()) + offsets)

    def largest(self, values: np.ndarray) -> np.ndarray:
        """(O,) the largest of a per-entry array over each option's shards."""
        if not self.num_options:
            return values[:0]
        return np.maximum.reduceat(values, self.shard_start[:-1])

    def total(self, values: np.ndarray) -> np.ndarray:
        """(O,) the sum of a per-shard quantity over each option's shards (runs expanded)."""
        if not self.num_options:
            return values[:0]
        expanded: np.ndarray = values * self.repeat
        return np.add.reduceat(expanded, self.shard_start[:-1])

    def num_shards(self) -> np.ndarray:
        """Shards per option, runs expanded (data_parallel and row_wise: world_size)."""
        totals = np.concatenate(([0], np.cumsum(self.repeat, dtype=np.int64)))
        shards: np.ndarray = totals[self.shard_start[1:]] - totals[self.shard_start[:-1]]
        return shards

    def expand(self) -> Options:
        """The same options with one entry per shard (repeat all 1); for small topologies."""
        rep = self.repeat.astype(np.int64)
        totals = np.concatenate(([0], np.cumsum(rep)))
        idx = np.repeat(np.arange(len(rep)), rep)
        k = np.arange(len(idx)) - totals[idx]  # position of each shard within its run
        return Options(
            table=self.table,
            sharding_type=self.sharding_type,
            compute_kernel=self.compute_kernel,
            shard_start=totals[self.shard_start],
            perf=self.perf[idx],
            hbm=self.hbm[idx],
            ddr=self.ddr[idx],
            row_offset=self.row_offset[idx] + k * self.row_step[idx],
            col_offset=self.col_offset[idx],
            rows=self.rows[idx],
            cols=self.cols[idx],
            repeat=np.ones(len(idx), dtype=np.int32),
            row_step=np.zeros(len(idx), dtype=np.int64),
        )
