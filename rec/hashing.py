"""Content hashes that ignore how an input was written: canonical JSON, then sha256."""

from __future__ import annotations

import hashlib
import json

HASH_CHARS = 16  # 64 bits of sha256: plenty to key caches and runs, short enough to read


def canonical_json(payload: object) -> str:
    """One byte-exact JSON text per value: sorted keys, no whitespace, ASCII only."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def content_hash(payload: object) -> str:
    """The first ``HASH_CHARS`` hex digits of sha256 over ``canonical_json(payload)``."""
    return hashlib.sha256(canonical_json(payload).encode("ascii")).hexdigest()[:HASH_CHARS]
