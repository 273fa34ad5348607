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

    def _count(self, world: int) -> int:
        """Batches every rank runs: the largest share's (the shares' sizes come from the files'
        metadata, the same on every rank), at most ``max_batches``."""
        largest = max(stop - start for start, stop in (self.source.share_bounds(r, world) for r in range(world)))
        count = -(-largest // self.batch_size)
        return min(count, self.max_batches) if self.max_batches else count

    def run(self, model: nn.Module, iteration: int) -> Evaluation | None:
        """The metrics after ``iteration`` iterations (rank 0; None on the others: a collective).
        The share is read batch by batch, and a rank keeps only its samples' logits and labels."""
        rank, world = dist.get_rank(), dist.get_world_size()
        group = Group.current()
        count = self._count(world)
        if not count:
            raise InputError("Cannot evaluate:", [Problem(self.source.what, f"{self.source.files.source} has no rows")])
        mine = self._mine(rank, world)
        logits, labels = [], []
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for _ in range(count):
                    rows = next(mine, None)
                    rows = empty(self.layout, 0) if rows is None else rows
                    padded = concat([rows, empty(self.layout, self.batch_size - len(rows))]) \
                        if len(rows) < self.batch_size else rows
                    batch = to_batch(padded, self.layout, self.one_module).to(self.device, non_blocking=True)
                    logits.append(_logits(model(batch))[:len(rows)].to(torch.float64).cpu())
                    labels.append(torch.from_numpy(rows.labels.astype(np.float64)))
        finally:
            model.train(was_training)
        every = group.gather_rows(torch.stack([torch.cat(logits), torch.cat(labels)]))
        if every is None:
            return None
        stacked = torch.cat(every, dim=1).numpy()
        bad = ~np.isfinite(stacked[0])
        if bad.any():  # AUC, logloss and NE would be numbers (or NaN in the JSON) of no meaning
            raise InputError("The model's outputs cannot be evaluated:", [Problem(
                f"{self.source.files.source}", (
                    f"not finite (NaN or infinite) for {int(bad.sum()):,} of {len(bad):,} samples after iteration "
                    f"{iteration}: dense values too large for the model, or a training that diverged"))])
        return evaluate(stacked[0], stacked[1], iteration)


def _logits(output: Any) -> torch.Tensor:
    """The logits of shardflow's model's ``(loss, (loss, logits, labels))``."""
    inner = output[1] if isinstance(output, (tuple, list)) and len(output) == 2 else None
    if not (isinstance(inner, (tuple, list)) and len(inner) == 3 and isinstance(inner[1], torch.Tensor)):
        raise InputError("Cannot evaluate this model:", [Problem(
            "forward(batch)", "does not return (loss, (loss, logits, labels)) as shardflow's and TorchRec's "
                              "DLRMTrain do")])
    logits: torch.Tensor = inner[1].reshape(-1)
    return logits
