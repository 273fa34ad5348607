"""A rank's input pipeline: ``Columns`` from a data source become TorchRec batches in a background
thread, a bounded number ahead (pinned host memory on cuda, so the copy to the GPU overlaps compute),
and the training loop's wait for each batch is measured.

A spec of one EmbeddingBagCollection at the default path (``one_default_ebc``) gets TorchRec's
``Batch`` (one KJT, shardflow's DLRM); any other a ``ModuleBatch``: one KJT per embedding module, so
each module is fed its own features. A weighted module's KJT carries its ids' weights.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.data.columns import Columns
from rec.data.layout import DataLayout
from rec.train.batch import ModuleBatch

T = TypeVar("T")
STOP_POLL_S = 0.1  # how often a blocked producer looks whether the consumer has gone


def module_kjts(columns: Columns, layout: DataLayout) -> dict[str, KeyedJaggedTensor]:
    """Each embedding module's features of ``columns`` as one KeyedJaggedTensor; a weighted module's
    with its features' weights (float32, one per id)."""
    out = {}
    for module in layout.modules:
        lengths = np.concatenate([columns.lengths[s] for s in module.slots])
        values = np.concatenate([columns.ids[s] for s in module.slots])
        weights = torch.from_numpy(np.concatenate([columns.weights_of(s) for s in module.slots])) \
            if module.weighted else None
        out[module.path] = KeyedJaggedTensor(keys=list(module.keys), values=torch.from_numpy(values),
                                             weights=weights, lengths=torch.from_numpy(lengths))
    return out


def to_batch(columns: Columns, layout: DataLayout, one_module: bool) -> Batch | ModuleBatch:
    """``columns`` as the batch shardflow's model takes (``one_module``: TorchRec's ``Batch``)."""
    dense = torch.from_numpy(np.array(columns.dense, np.float32))  # a copy: Arrow's buffers are read-only
    labels = torch.from_numpy(np.array(columns.labels, np.float32))
    kjts = module_kjts(columns, layout)
    if one_module:
        return Batch(dense_features=dense, sparse_features=next(iter(kjts.values())), labels=labels)
    return ModuleBatch(dense_features=dense, sparse_features=kjts, labels=labels)


@dataclass
class _Failed:
    error: BaseException


class Prefetched(Generic[T]):
    """``produce``'s items made by a background thread, at most ``depth`` ahead. An error in the
    thread is raised by the ``next`` that would have returned its item; ``waited_s`` adds up the
    time ``next`` waited."""

    def __init__(self, produce: Iterator[T], depth: int, name: str = "shardflow-input"):
        self._queue: queue.Queue[T | _Failed] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self.waited_s = 0.0
        self._thread = threading.Thread(target=self._run, args=(produce,), name=name, daemon=True)
        self._thread.start()

    def _run(self, produce: Iterator[T]) -> None:
        try:
            for item in produce:
                if not self._put(item):
                    return
        except BaseException as e:  # handed to the consumer, which raises it
            self._put(_Failed(e))
            return
        self._put(_Failed(StopIteration()))

    def _put(self, item: T | _Failed) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=STOP_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetched[T]:
        return self

    def __next__(self) -> T:
        began = time.perf_counter()
        item = self._queue.get()
        self.waited_s += time.perf_counter() - began
        if isinstance(item, _Failed):
            self._queue.put(item)  # every later next raises it too
            raise item.error
        return item

    def close(self) -> None:
        self._stop.set()


def input_pipeline(columns: Iterator[Columns], layout: DataLayout, one_module: bool, depth: int,
                   pin_memory: bool) -> Prefetched[Batch | ModuleBatch]:
    """Batches from ``columns`` made ``depth`` ahead in a background thread."""
    def batches() -> Iterator[Batch | ModuleBatch]:
        for c in columns:
            batch = to_batch(c, layout, one_module)
            yield batch.pin_memory() if pin_memory else batch

    return Prefetched(batches(), depth)
