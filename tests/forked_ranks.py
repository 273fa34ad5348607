"""Ranks of a gloo process group as forked processes of the test: each runs ``target(rank, folder,
*args)``, which writes its result (or its traceback) as JSON to ``folder/rank-R.json``."""

from __future__ import annotations

import json
import multiprocessing


def forked_ranks(target, folder, *args, ranks=2, timeout_s=60.0):
    """Each rank's JSON result, in rank order (None for a rank that wrote none: it hung or died)."""
    fork = multiprocessing.get_context("fork")
    processes = [fork.Process(target=target, args=(r, folder, *args)) for r in range(ranks)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=timeout_s)
        if p.is_alive():
            p.kill()
    files = [folder / f"rank-{r}.json" for r in range(ranks)]
    return [json.loads(f.read_text()) if f.exists() else None for f in files]
