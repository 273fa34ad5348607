"""``shardflow predict``: an exported model's click probability for every row of a dataset.

The data is read as training reads it (``rec.data``: the exported model's features and ``--ids``
policy, each row checked), every row once, in the order of the files and their rows, in batches;
``label`` may be absent. The output is a Parquet file with one column ``prediction`` (float32, the
probability of a click), one row per input row, in input order, written whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from rec.data.files import open_data
from rec.data.parquet import ParquetSource, rebatch
from rec.data.source import reader_threads
from rec.disk_full import whole
from rec.train.export import load_exported
from rec.train.input import to_batch
from rec.train.model import logits
from rec.train.tables import one_default_ebc

PREDICTION = "prediction"


@dataclass(frozen=True)
class Predicted:
    out: Path
    rows: int


def predict(model_dir: str | Path, data: str, out: str | Path, device: torch.device, batch_size: int = 8192,
            progress: Callable[[int, int], None] | None = None) -> Predicted:
    """Write ``out``: the model's prediction for every row of ``data``, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    model, settings = load_exported(model_dir, device)
    files = open_data(data, "--data")
    layout = replace(settings.layout, labelled=False)
    source = ParquetSource.open(files, layout, shuffle=False, policy=settings.ids, threads=reader_threads(None, 1))
    one_module = one_default_ebc(settings.spec)
    schema = pa.schema([(PREDICTION, pa.float32())])
    done = 0
    with whole(out) as path, pq.ParquetWriter(str(path), schema) as writer, torch.no_grad():
        for rows in rebatch(source.share(0, 1), batch_size):
            batch = to_batch(rows, layout, one_module).to(device)
            p = torch.sigmoid(logits(model, batch)).to(torch.float32).cpu().numpy()
            writer.write_table(pa.table({PREDICTION: pa.array(p, pa.float32())}, schema=schema))
            done += len(rows)
            if progress is not None:
                progress(done, source.order.total)
    return Predicted(Path(out), done)
