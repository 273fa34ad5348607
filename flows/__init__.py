"""Prefect flows and the ``shardflow`` CLI: they compose ``rec`` and ``tasks``, nothing else."""

import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path

# A module of the same name earlier on the path (a ``tasks.py`` on PYTHONPATH: invoke's file) would
# take the place of shardflow's own package: the project comes first, as it does in the ranks
# (tasks.launch.job_environment).
_ROOT = str(_Path(__file__).resolve().parents[1])
for _name in ("tasks", "rec"):
    if _name not in _sys.modules:
        _found = _util.find_spec(_name)
        if _found is None or not (_found.origin or "").startswith(_ROOT + "/"):
            _sys.path.insert(0, _ROOT)
            break
