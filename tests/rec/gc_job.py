"""A job for ``rec.train.launcher`` that prints, per rank, whether its garbage collector runs and how
many objects the process froze before the rank began (``rec.startup_gc``)."""

from __future__ import annotations

import gc
import os


def main(argv: list[str]) -> int:
    os.write(1, f"rank {os.environ['RANK']} collects {gc.isenabled()} frozen {gc.get_freeze_count()}\n".encode())
    return 0
