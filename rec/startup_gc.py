"""Python's cyclic garbage collector while a process imports torch and torchrec.

Those imports make ~340,000 objects that live as long as the process. On the way the collector
runs full passes over every object made so far (nine of them importing torch and the training job),
a quarter of the imports' CPU: ~1 CPU-s of every training's launch, and one full pass (0.2 s) each
time a rank collects after a measured plan. Collection is held off while such a process imports,
and what the imports made is frozen (``gc.freeze``: never scanned again), as Python's documentation
advises for a process that forks workers: disable early in the parent, freeze, enable in the child.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def hold_collection() -> None:
    """No collection until ``imports_done``: the imports to come make objects that live on."""
    gc.disable()


def imports_done() -> None:
    """Freeze every object made so far and collect again from here on (a forked child inherits
    the held collector: it calls this itself)."""
    gc.freeze()
    gc.enable()


@contextmanager
def importing() -> Iterator[None]:
    """The block's imports with the collector held, and what they made frozen once it ends (where
    no fork comes between: ``hold_collection`` and ``imports_done`` apart)."""
    hold_collection()
    try:
        yield
    finally:
        imports_done()
