"""Plan search: choose an option per table and a rank per shard, minimising the critical path."""

from rec.search.config import SearchConfig
from rec.search.mapper import InProcess, Mapper
from rec.search.planner import build_search_space, search, search_result
from rec.search.result import SearchResult

__all__ = ["InProcess", "Mapper", "SearchConfig", "SearchResult", "build_search_space", "search", "search_result"]
