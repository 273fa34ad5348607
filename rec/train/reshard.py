"""Load a checkpoint written under one plan into a model sharded by another.

``torch.distributed.checkpoint`` already reshards a tensor whose global shape is unchanged: it
reads every saved chunk that overlaps a rank's local shards, whatever the old and new layouts and
world sizes. ``ReshardingLoadPlanner`` adds what changes shape between two plans of a changed
spec: a table whose rows grew or shrank gets its overlapping old rows (weights, and the row-wise
optimizer state, which TorchRec lays out as one segment of ``rows`` per column shard). Tables are
named by key (``rec.spec.types.table_key``): their module's path is part of every tensor's name, so
tables of one name in two modules stay apart. Tensors the
checkpoint does not have (added tables) keep their initialization; tensors whose shape changed
otherwise (another dim, a dense layer sized by the number of features) are re-initialized and
reported. The index is unpickled with an allow-list and non-tensor values with
``weights_only=True``: no arbitrary unpickling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.default_planner import create_default_local_load_plan
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from rec.spec.types import DEFAULT_MODULE
from rec.train.checkpoint import SafeFileSystemReader, SafeLoadPlanner

WEIGHT_SUFFIX = ".weight"
MOMENTUM_SUFFIX = ".momentum1"
TABLE_CONTAINERS = ("embedding_bags", "embeddings")  # an EmbeddingBagCollection's, an EmbeddingCollection's


def table_tensor_names(key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The endings of a table's weight and of its row-wise optimizer state in a checkpoint's
    flattened names (``model.<module>.<container>.<name>.weight``,
    ``optim.state.<module>.<container>.<name>.weight.<name>.momentum1``), for either container."""
    module, _, name = key.rpartition(".")  # table names hold no '.'
    module = module or DEFAULT_MODULE
    weights = tuple(f".{module}.{c}.{name}{WEIGHT_SUFFIX}" for c in TABLE_CONTAINERS)
    return weights, tuple(f"{w}.{name}{MOMENTUM_SUFFIX}" for w in weights)


def is_table_tensor(fqn: str, keys: list[str] | tuple[str, ...]) -> bool:
    """Whether ``fqn`` is the weight or optimizer state of one of the tables ``keys``."""
    return any(fqn.endswith(end) for key in keys for names in table_tensor_names(key) for end in names)


@dataclass
class LoadReport:
    """What the load did, per flattened state-dict key (``model.<param>``, ``optim.state.<...>``)."""

    exact: list[str] = field(default_factory=list)  # same global shape: every value restored
    resized: list[str] = field(default_factory=list)  # overlapping rows restored
    initialized: list[str] = field(default_factory=list)  # not in the checkpoint, or reshaped


@dataclass(frozen=True)
class Rows:
    """How a resized table's rows map: old and new rows, and segments (column shards of a
    row-wise optimizer state; 1 for the weights)."""

    old: int
    new: int
    segments: int = 1


class ReshardingLoadPlanner(SafeLoadPlanner):
    def __init__(self, resized: dict[str, tuple[int, int]]):
        """``resized``: table key -> (old rows, new rows) for the tables whose rows changed."""
        super().__init__(allow_partial_load=True)
        self.resized = resized
        self.report = LoadReport()
        self._targets: dict[tuple[str, int | None], torch.Tensor] = {}
        self._chunks: dict[str, list[ChunkStorageMetadata]] = {}

    def set_up_planner(self, state_dict: dict[str, Any], metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        assert self.metadata is not None
        stored = self.metadata.state_dict_metadata
        keep = {}
        for fqn, obj in self.state_dict.items():
            md = stored.get(fqn)
            if not isinstance(obj, (torch.Tensor, ShardedTensor)):
                if md is not None:
                    keep[fqn] = obj
                continue
            if md is None:
                self.report.initialized.append(fqn)
                continue
            assert isinstance(md, TensorStorageMetadata)
            if tuple(md.size) == tuple(obj.size()):
                keep[fqn] = obj
                self.report.exact.append(fqn)
                continue
            rows = self._rows(fqn, tuple(md.size), tuple(obj.size()))
            if rows is None:
                self.report.initialized.append(fqn)
                continue
            self._chunks[fqn] = self._translate(fqn, obj, rows)
            self.report.resized.append(fqn)
        self.state_dict = keep

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        # Not super(): it takes keys the checkpoint has and the state dict lacks for a checkpoint of
        # torch <= 2.3 and reloads the unfiltered state dict; here they are the reshaped ones.
        plan = create_default_local_load_plan(self.state_dict, self.metadata, False)
        extra: list[ReadItem] = []
        for fqn, chunks in self._chunks.items():
            md = self.metadata.state_dict_metadata[fqn]
            assert isinstance(md, TensorStorageMetadata)
            extra += create_read_items_for_chunk_list(fqn, md, chunks)
        return LoadPlan(plan.items + extra, plan.storage_data, plan.planner_data)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        index = read_item.dest_index
        if index.fqn in self._chunks:
            target = self._targets[(index.fqn, index.index)]
            for dim, (start, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths, strict=True)):
                target = target.narrow(dim, start, length)
            return target
        tensor: torch.Tensor = super().resolve_tensor(read_item)  # torch leaves it unannotated
        return tensor

    def _rows(self, fqn: str, old_size: tuple[int, ...], new_size: tuple[int, ...]) -> Rows | None:
        for key, (old, new) in self.resized.items():
            weights, momenta = table_tensor_names(key)
            if fqn.endswith(weights) and len(old_size) == 2 \
                    and old_size == (old, new_size[1]) and new_size[0] == new:
                return Rows(old, new)
            if fqn.endswith(momenta) and len(old_size) == 1 \
                    and old_size[0] % old == 0 and new_size[0] % new == 0 \
                    and old_size[0] // old == new_size[0] // new:
                return Rows(old, new, old_size[0] // old)
        return None

    def _translate(self, fqn: str, obj: torch.Tensor | ShardedTensor, rows: Rows) -> list[ChunkStorageMetadata]:
        """Chunks in the old tensor's coordinates for the rows each local shard keeps; their
        destination views are remembered by chunk index."""
        chunks: list[ChunkStorageMetadata] = []
        for offsets, local in _local_pieces(obj):
            start, length = offsets[0], local.shape[0]
            pos = start
            while pos < start + length:  # split at segment boundaries
                segment = pos // rows.new
                end = min(start + length, (segment + 1) * rows.new)
                within = pos - segment * rows.new
                keep = min(end - pos, rows.old - within)
                if keep > 0:
                    old_offsets = (segment * rows.old + within, *offsets[1:])
                    chunks.append(ChunkStorageMetadata(offsets=torch.Size(old_offsets),
                                                       sizes=torch.Size((keep, *local.shape[1:]))))
                    self._targets[(fqn, len(chunks) - 1)] = local.narrow(0, pos - start, keep)
                pos = end
        return chunks


def _local_pieces(obj: torch.Tensor | ShardedTensor) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    if isinstance(obj, ShardedTensor):
        return [(tuple(s.metadata.shard_offsets), s.tensor) for s in obj.local_shards()]
    return [(tuple(0 for _ in obj.shape), obj)]


def load_resharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   resized: dict[str, tuple[int, int]]) -> LoadReport:
    """Load the checkpoint at ``directory`` (written under another plan) into the sharded
    ``model`` and ``optimizer``; ``resized``: table key -> (old rows, new rows)."""
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    planner = ReshardingLoadPlanner(resized)
    dcp.load(state, storage_reader=SafeFileSystemReader(str(directory)), planner=planner)
    model.load_state_dict(state["model"], strict=False)
    optimizer.load_state_dict(state["optim"])
    return planner.report
