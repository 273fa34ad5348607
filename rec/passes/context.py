"""What a whole-plan pass gets: the inputs of the search, and a way to search again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rec.config.cost import CostConfig
from rec.config.search import SearchConfig
from rec.search.result import SearchResult
from rec.search.space import SearchSpace
from rec.spec.types import Spec
from rec.topology.types import Topology

RELATIVE_GAIN = 1e-9  # a plan must be better by more than rounding to replace another


@dataclass(frozen=True)
class PassContext:
    """The search's inputs; ``search`` searches a space again (None: the pass may not, e.g. for a
    replan's warm-started placements, whose shards must stay where they are)."""

    spec: Spec
    topology: Topology
    cost: CostConfig
    config: SearchConfig
    search: Callable[[SearchSpace], SearchResult] | None = None
    # The same search without its exact stage: the heuristic alone, for spaces a pass tries on the side.
    heuristic: Callable[[SearchSpace], SearchResult] | None = None
    # The exact stage from a result, where the first search left it to the passes (None: it ran):
    # where they change the search space, it is worth its time only on the space they end with.
    exact: Callable[[SearchResult, float], SearchResult] | None = None


class WholePlanPass(Protocol):
    """A cost the search cannot see shard by shard, dealt with after it: ``applies`` says whether the
    cost model has it; ``run`` returns the result, or a better plan by that cost."""

    def applies(self, context: PassContext) -> bool: ...

    def run(self, result: SearchResult, context: PassContext) -> SearchResult: ...
