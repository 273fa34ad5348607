"""The ``shardflow`` command's entry (``python -m shardflow`` alike). shardflow is made of the
packages ``rec``, ``tasks`` and ``flows``: names a Prefect project often gives its own modules
(``flows.py``, ``tasks.py``). One of those earlier on PYTHONPATH (or, for ``python -m``, in the
working directory) would take the place of shardflow's, and the command would fail at its first
import of it: shardflow's own come first (``own_packages_first``, which ``flows`` runs too), as the
launcher puts them for the ranks (``tasks.launch.job_environment``). The entry lives here, in a
package of shardflow's name, because ``flows`` is one of those that can be hidden.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGES = ("rec", "tasks", "flows")
HOME = Path(__file__).resolve().parents[1]  # where shardflow's packages are installed


def hidden() -> list[str]:
    """Those of shardflow's packages that another module of their name takes the place of."""
    out = []
    for name in PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a broken module of that name
            spec = None
        if spec is None or spec.origin is None or Path(spec.origin).resolve() != HOME / name / "__init__.py":
            out.append(name)
    return out


def own_packages_first() -> None:
    """Put shardflow's home first on ``sys.path`` where another module hides one of its packages (the
    entry here, and ``flows`` for those who import it otherwise: ``python -m flows.cli``, Prefect)."""
    if hidden():
        sys.path.insert(0, str(HOME))


def main() -> int:
    """``shardflow``: ``flows.cli``'s command, with shardflow's own packages."""
    own_packages_first()
    from flows.cli import main as command

    return command()
