"""Processes that run under a file-size limit (a full disk, as tests make one) write no bytecode.

Python writes a ``.pyc`` without checking for a short write: one cut at the limit stays in the
venv or the checkout, and every later import of that module fails (``EOFError: marshal data too
short``). ``make install`` compiles every package's bytecode, but a venv installed otherwise, or a
module edited since, has none to read."""

from __future__ import annotations

import os
from collections.abc import Mapping


def without_bytecode(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's environment by default) with bytecode writing off."""
    return {**(os.environ if env is None else env), "PYTHONDONTWRITEBYTECODE": "1"}
