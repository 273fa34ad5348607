"""Hardware profiles: the cost model's bandwidths and coefficients, read from YAML, validated, hashed.

A ``Profile`` is TorchRec 1.8's ``HardwarePerfConfig`` as a value (docs/profile.md); ``Profile()``
is TorchRec's default, under which the cost model gives exactly the estimates it gives without one.
"""

from __future__ import annotations

from rec.profile.read import read_profile
from rec.profile.types import DEFAULT_PROFILE, Profile
from rec.profile.validate import (
    check_profile_for,
    describe_profile,
    dumps_profile,
    profile_from_dict,
    profile_from_record,
    profile_hash,
    profile_record,
    profile_to_dict,
)

__all__ = [
    "DEFAULT_PROFILE",
    "Profile",
    "check_profile_for",
    "describe_profile",
    "dumps_profile",
    "profile_from_dict",
    "profile_from_record",
    "profile_hash",
    "profile_record",
    "profile_to_dict",
    "read_profile",
]
