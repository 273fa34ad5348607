"""How the search's tasks are run: a one-method protocol, in this process by default.

The pipeline (``rec.search.pipeline``) describes its work as tasks ``fn(space, item)`` over a
search space the mapper holds; a mapper only decides where and when they run. ``InProcess`` runs
each task in this process when its result is taken; ``tasks.ray_search`` runs them on Ray actors
that each hold the space once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

from rec.search.space import SearchSpace

T = TypeVar("T")
R = TypeVar("R")


class Mapper(Protocol):
    def map(self, fn: Callable[[SearchSpace, T], R], items: Iterable[T]) -> Iterable[R]:
        """``fn(space, item)`` for every item, in the items' order. A mapper may run the tasks as
        their results are taken (the caller stops taking once it has what it needs, and the tasks
        after do not run) or all at once; it takes each item when it starts that task."""
        ...


class InProcess:
    """Run each task in this process, one after the other, when its result is taken."""

    def __init__(self, space: SearchSpace):
        self.space = space

    def map(self, fn: Callable[[SearchSpace, T], R], items: Iterable[T]) -> Iterator[R]:
        return (fn(self.space, item) for item in items)
