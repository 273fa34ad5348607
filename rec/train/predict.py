"""``shardflow predict``: an exported model's click probability for every row of a dataset.

The data is read as training reads it (``rec.data``: the exported model's features and ``--ids``
policy, each row checked), every row once, in the order of the files and their rows, in batches;
``label`` may be absent. The output is a Parquet file with one column ``prediction`` (float32, the
probability of a click), one row per input row, in input order, written whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.data.columns import PREDICTION_INPUT
from rec.data.files import open_data
from rec.data.parquet import ParquetSource, rebatch
from rec.data.source import reader_threads
from rec.disk_full import whole
from rec.errors import InputError, Problem
from rec.spec.types import Spec
from rec.train.batch import ModuleBatch
from rec.train.export import load_exported, weighted_mean
from rec.train.input import to_batch
from rec.train.model import logits
from rec.train.tables import one_default_ebc

PREDICTION = "prediction"


@dataclass(frozen=True)
class Predicted:
    out: Path
    rows: int
    undefined: int = 0  # rows whose prediction is NaN: the model's output was not finite for them


def weighted_means(spec: Spec) -> dict[str, frozenset[str]]:
    """Per module path, the features of its weighted MEAN tables (``rec.train.export.inference_spec``)."""
    out: dict[str, set[str]] = {}
    for t in spec.tables:
        if weighted_mean(t):
            out.setdefault(t.module, set()).update(t.feature_names)
    return {module: frozenset(features) for module, features in out.items()}


def mean_weighted(kjt: KeyedJaggedTensor, features: frozenset[str]) -> KeyedJaggedTensor:
    """``kjt`` with the weights of ``features``' ids divided by their bag's length: the summed bag is
    then FBGEMM's weighted mean."""
    weights = kjt.weights_or_none()
    if weights is None or not features.intersection(kjt.keys()):
        return kjt
    lengths = kjt.lengths()
    meaned = torch.tensor([k in features for k in kjt.keys()], device=lengths.device)
    per_bag = torch.where(meaned.repeat_interleave(kjt.stride()), 1.0 / lengths.clamp(min=1).to(weights.dtype),
                          torch.ones((), dtype=weights.dtype, device=lengths.device))
    return KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=lengths,
                             weights=weights * per_bag.repeat_interleave(lengths))


def as_inferred(batch: Batch | ModuleBatch, means: dict[str, frozenset[str]]) -> Batch | ModuleBatch:
    """``batch`` as ``load_exported``'s model takes it: weighted MEAN bags' weights divided by their lengths."""
    if not means:
        return batch
    if isinstance(batch, ModuleBatch):
        return replace(batch, sparse_features={path: mean_weighted(kjt, means.get(path, frozenset()))
                                               for path, kjt in batch.sparse_features.items()})
    (features,) = means.values()  # one module: the default EmbeddingBagCollection
    return replace(batch, sparse_features=mean_weighted(batch.sparse_features, features))


def predict(model_dir: str | Path, data: str, out: str | Path, device: torch.device, batch_size: int = 8192,
            progress: Callable[[int, int], None] | None = None) -> Predicted:
    """Write ``out``: the model's prediction for every row of ``data``, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    model, settings = load_exported(model_dir, device)
    files = open_data(data, "--data")
    layout = replace(settings.layout, labelled=False)
    source = ParquetSource.open(files, layout, shuffle=False, policy=settings.ids, threads=reader_threads(None, 1),
                                wording=PREDICTION_INPUT)
    one_module, means = one_default_ebc(settings.spec), weighted_means(settings.spec)
    schema = pa.schema([(PREDICTION, pa.float32())])
    done = undefined = 0
    with ExitStack() as stack:
        try:
            writer = stack.enter_context(pq.ParquetWriter(str(stack.enter_context(whole(out))), schema))
        except OSError as e:  # a directory that cannot be made or written: the path is at fault
            raise InputError("Cannot predict:", [Problem("--out", f"cannot write {out}: {e.strerror or e}")]) from None
        stack.enter_context(torch.no_grad())
        for rows in rebatch(source.share(0, 1), batch_size):
            batch = as_inferred(to_batch(rows, layout, one_module), means).to(device)
            p = torch.sigmoid(logits(model, batch)).to(torch.float32).cpu().numpy()
            writer.write_table(pa.table({PREDICTION: pa.array(p, pa.float32())}, schema=schema))
            done += len(rows)
            undefined += int(np.isnan(p).sum())
            if progress is not None:
                progress(done, source.order.total)
    return Predicted(Path(out), done, undefined)
