"""Evaluation inside the job: each rank runs the model forward over its share of the evaluation
data (``--eval-data``; all of it, or ``--eval-batches`` batches per rank), and rank 0 computes the
metrics (``rec.evaluation``) over every rank's samples at once: an exact AUC, not a mean of the
ranks' AUCs.

The ranks' shares differ by at most a row, and the sharded model needs every rank in every
forward with a batch of the same size: a rank's last batch is filled up with padding rows, and a
rank whose share ran out runs padding batches, which the metrics leave out.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from rec.data.columns import Columns, concat, empty
from rec.data.layout import DataLayout
from rec.data.parquet import ParquetSource, rebatch
from rec.errors import InputError, Problem
from rec.evaluation.metrics import Evaluation, evaluate
from rec.train.collectives import Group
from rec.train.input import to_batch


@dataclass
class Evaluator:
    source: ParquetSource
    layout: DataLayout
    one_module: bool
    batch_size: int
    max_batches: int  # per rank; 0: the whole share
    device: torch.device

    def _mine(self, rank: int, world: int) -> Iterator[Columns]:
        batches = rebatch(self.source.share(rank, world), self.batch_size)
        return itertools.islice(batches, self.max_batches) if self.max_batches else batches

    def run(self, model: nn.Module, iteration: int) -> Evaluation | None:
        """The metrics after ``iteration`` iterations (rank 0; None on the others: a collective)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        group = Group.current()
        mine = list(self._mine(rank, world))  # Columns of one batch each: bounded by the share
        count = int(group.max([len(mine)])[0])
        logits, labels, valid = [], [], []
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for k in range(count):
                    rows = mine[k] if k < len(mine) else empty(self.layout, 0)
                    padded = concat([rows, empty(self.layout, self.batch_size - len(rows))]) \
                        if len(rows) < self.batch_size else rows
                    batch = to_batch(padded, self.layout, self.one_module).to(self.device, non_blocking=True)
                    logits.append(_logits(model(batch)).to(torch.float64).cpu())
                    labels.append(torch.from_numpy(padded.labels.astype(np.float64)))
                    valid.append(torch.arange(self.batch_size) < len(rows))
        finally:
            model.train(was_training)
        if not count:
            raise InputError("Cannot evaluate:", [Problem("--eval-data", f"{self.source.files.source} has no rows")])
        local = torch.stack([torch.cat(logits), torch.cat(labels), torch.cat(valid).to(torch.float64)])
        every = group.all_gather(local.flatten())
        if rank != 0:
            return None
        stacked = torch.cat([t.view(3, -1) for t in every], dim=1).numpy()
        keep = stacked[2] > 0.5
        return evaluate(stacked[0][keep], stacked[1][keep], iteration)


def _logits(output: Any) -> torch.Tensor:
    """The logits of shardflow's model's ``(loss, (loss, logits, labels))``."""
    inner = output[1] if isinstance(output, (tuple, list)) and len(output) == 2 else None
    if not (isinstance(inner, (tuple, list)) and len(inner) == 3 and isinstance(inner[1], torch.Tensor)):
        raise InputError("Cannot evaluate this model:", [Problem(
            "forward(batch)", "does not return (loss, (loss, logits, labels)) as shardflow's and TorchRec's "
                              "DLRMTrain do")])
    logits: torch.Tensor = inner[1].reshape(-1)
    return logits
