"""A job for ``rec.train.launcher`` that needs no torch: each rank prints its rank, its parent (pid
and process name) and which process imported the module, then exits with the code SHARDFLOW_TEST_EXIT
names for it (``RANK:CODE,...``; ``RANK:int`` raises KeyboardInterrupt)."""

from __future__ import annotations

import os

IMPORTED_IN = os.getpid()  # the process that imported the module: the forkserver, for every rank


def main(argv: list[str]) -> int:
    rank = os.environ["RANK"]
    parent = os.getppid()
    with open(f"/proc/{parent}/comm") as comm:
        name = comm.read().strip()
    # One write of the whole line: ranks print at once into one pipe, and print() writes the line
    # and its newline apart where output is unbuffered (PYTHONUNBUFFERED), so lines could interleave.
    os.write(1, f"rank {rank} parent {parent} {name} imported-in {IMPORTED_IN} argv {' '.join(argv)}\n".encode())
    codes = dict(item.split(":") for item in os.environ.get("SHARDFLOW_TEST_EXIT", "").split(",") if item)
    if codes.get(rank) == "int":
        raise KeyboardInterrupt
    return int(codes.get(rank, "0"))
