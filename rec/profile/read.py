"""``read_profile``: a profile YAML file -> a validated ``Profile``."""

from __future__ import annotations

from pathlib import Path

from rec.input_files import read_yaml_file
from rec.profile.types import Profile
from rec.profile.validate import profile_from_dict

MAX_PROFILE_FILE_BYTES = 1 << 20  # a profile is a few hundred numbers


def read_profile(path: str | Path) -> Profile:
    """Read and validate a profile YAML file."""
    document = read_yaml_file(path, "profile", MAX_PROFILE_FILE_BYTES,
                              "write {} for TorchRec's defaults; docs/profile.md lists the keys")
    return profile_from_dict(document, source=str(path))
