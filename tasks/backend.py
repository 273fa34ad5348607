"""Where a plan search runs: the ``--backend`` of ``SearchSettings``."""

from __future__ import annotations

from enum import StrEnum


class Backend(StrEnum):
    LOCAL = "local"  # search in this process
    RAY = "ray"  # table groups on Ray actors (RAY_ADDRESS, or a local Ray started on demand)
    AUTO = "auto"  # Ray from AUTO_RAY_MIN_TABLES tables on, local below or when Ray is away
