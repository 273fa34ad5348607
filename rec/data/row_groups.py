"""Row groups as the readers of one source share them: each read once while it is still needed.

Consecutive windows of a rank's share usually split a row group between them, and with several
reader threads two windows may want one row group at the same time: ``RowGroups`` keeps the most
recent row groups (a bounded number) and hands a row group that is being read to every thread that
asks for it, instead of reading it again. Each thread opens the Parquet files it reads itself (a
``ParquetFile`` is not shared between threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from rec.data.files import DataFiles
from rec.errors import InputError

if TYPE_CHECKING:
    import pyarrow as pa

# Parquet files a thread keeps open: an open file holds its last row group's pages, and reopening
# one costs far less than reading a row group.
OPEN_FILES = 1


class RowGroups:
    def __init__(self, files: DataFiles, columns: tuple[str, ...], keep: int):
        self._files = files
        self._columns = list(columns)
        self._keep = max(1, keep)
        self._lock = threading.Lock()
        self._kept: OrderedDict[int, Future[pa.Table]] = OrderedDict()
        self._local = threading.local()

    def get(self, group: int) -> pa.Table:
        """Row group ``group`` (an index of ``files.row_groups``), only the columns asked for."""
        with self._lock:
            kept = self._kept.get(group)
            mine = kept is None
            if kept is None:
                kept = self._kept[group] = Future()
                while len(self._kept) > self._keep:
                    self._kept.popitem(last=False)
            else:
                self._kept.move_to_end(group)
        if mine:
            try:
                kept.set_result(self._read(group))
            except BaseException as e:
                kept.set_exception(e)
                with self._lock:
                    if self._kept.get(group) is kept:
                        del self._kept[group]  # the next reader tries again
        return kept.result()

    def _read(self, group: int) -> pa.Table:
        rg = self._files.row_groups[group]
        handles: OrderedDict[int, Any] = getattr(self._local, "handles", None) or OrderedDict()
        self._local.handles = handles
        import pyarrow as pa

        try:
            handle = handles.pop(rg.file, None) or self._files.parquet_file(rg.file)
            handles[rg.file] = handle
            while len(handles) > OPEN_FILES:
                handles.popitem(last=False)
            table: pa.Table = handle.read_row_group(rg.index, columns=self._columns)
        except (OSError, pa.ArrowException) as e:
            handles.pop(rg.file, None)
            raise InputError("Cannot read the data:", [self._files.unreadable(rg, e)]) from None
        return table
