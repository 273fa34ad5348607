"""Log lines of the GPU image's libraries that say nothing to a user, left out where shardflow prints.

FBGEMM 1.6.0 (the GPU image's) warns, for each of its 14 libraries a process loads, that its own
version is missing from its PyTorch compatibility table: 84 lines on the root logger before a command
that imports TorchRec (export, predict, spec from-model), the GPU check or a rank's log says anything,
about a slip of that release (its table ends at 1.5). Its warning of a PyTorch it does not list stays.
"""

from __future__ import annotations

import logging

UNLISTED_FBGEMM = "_fbgemm_torch_compat_table has no entry"


class UnlistedFbgemm(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return UNLISTED_FBGEMM not in record.getMessage()


def quiet_unlisted_fbgemm() -> None:
    """Leave FBGEMM's warning of its own unlisted version out of this process's root logger (once)."""
    root = logging.getLogger()
    if not any(isinstance(f, UnlistedFbgemm) for f in root.filters):
        root.addFilter(UnlistedFbgemm())
