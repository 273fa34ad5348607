"""Work on a stream of tasks in threads, results in the tasks' order, a bounded number ahead.

The readers' work (Parquet decoding, Arrow's take, numpy) runs in C with the GIL released, so
threads read a source's windows in parallel; the results come back in order, so what a rank reads
does not depend on how many threads read it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(work: Callable[[T], R], tasks: Iterable[T], threads: int) -> Iterator[R]:
    """``work(task)`` for each task, in order, with ``threads`` threads at most ``threads + 1`` ahead
    (one thread: in the caller's thread, nothing ahead). An error is raised where its result would be."""
    if threads <= 1:
        yield from map(work, tasks)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="shardflow-reader") as pool:
        pending: deque[Future[R]] = deque()
        try:
            for task in tasks:
                pending.append(pool.submit(work, task))
                if len(pending) > threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
