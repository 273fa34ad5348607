"""Plan search: choose an option per table and a rank per shard, minimising the critical path.
Its settings (``SearchConfig``) are ``rec.config.search``."""

from rec.search.mapper import InProcess, Mapper
from rec.search.pipeline import build_search_space, search, search_result
from rec.search.result import SearchResult

__all__ = ["InProcess", "Mapper", "SearchResult", "build_search_space", "search", "search_result"]
