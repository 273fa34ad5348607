"""The plan cache: ``CACHE_DIR/<key>/`` holds the plan a search gave for the inputs ``key`` stands for.

An entry is a plan directory (plan.json, shards.parquet) plus ``cache-digest.json``: the sha256 of
both files' bytes, bound to the key by an HMAC-SHA256 under a secret private to this state
directory (``CACHE_DIR.key``, 32 random bytes, mode 0600, beside the cache rather than in it). The
search writes the digest with the plan, atomically (``rec.plan.io.write_plan_files``). An entry is
used only if its digest verifies, the plan is the one the request asks for (spec, topology,
planner configuration, previous plan) and it passes every check of a plan read back
(``rec.analysis.check_plan``: sound, unedited, its metrics recomputed from its shards). Whoever can
write the cache directory but not read the secret can delete entries, but not plant or edit one:
a planted or edited entry is searched again. Nothing is unpickled.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rec.analysis import check_plan
from rec.documents import DocumentError, load_json
from rec.errors import InputError
from rec.file_lock import file_lock
from rec.hashing import canonical_json
from rec.input_files import MAX_SPEC_FILE_BYTES, read_at_most
from rec.plan import PLAN_FILE, SHARDS_FILE, Plan
from rec.plan.io import WRITE_LOCK, parse_plan, shards_problems, write_plan

log = logging.getLogger(__name__)

DIGEST_FORMAT = "shardflow.plan-cache-digest/v1"
CACHE_DIGEST_FILE = "cache-digest.json"  # beside an entry's plan.json and shards.parquet
SECRET_BYTES = 32
SECRET_SUFFIX = ".key"  # CACHE_DIR.key: the secret, beside the cache directory
MAX_DIGEST_BYTES = 4096
DIGESTED = (PLAN_FILE, SHARDS_FILE)


@dataclass(frozen=True)
class Lookup:
    plan: Plan | None  # the cached plan, or None: search
    refused: str | None = None  # why an entry that was there is not used


def secret_path(cache_dir: str | Path) -> Path:
    cache = Path(cache_dir).resolve()
    return cache.with_name(cache.name + SECRET_SUFFIX)


def read_entry(cache_dir: str | Path, key: str, fits: Callable[[Plan], str | None]) -> Lookup:
    """The plan cached under ``key`` if its digest verifies and it passes ``check_plan`` and
    ``fits`` (which says why a plan is not the one asked for, or None)."""
    entry = Path(cache_dir, key)
    if not os.path.lexists(entry / PLAN_FILE):
        return Lookup(None)
    try:
        secret = cache_secret(cache_dir)
        with ExitStack() as stack:
            if os.path.lexists(entry / WRITE_LOCK):  # a writer of this entry finishes first
                stack.enter_context(file_lock(entry / WRITE_LOCK, shared=True, removed=True))
            digest = _read(entry / CACHE_DIGEST_FILE, MAX_DIGEST_BYTES)
            files = {name: _read(entry / name, MAX_SPEC_FILE_BYTES) for name in DIGESTED}
    except FileNotFoundError as e:
        return Lookup(None, f"{Path(e.filename or '?').name} is missing")
    except OSError as e:
        return Lookup(None, f"cannot read it ({e.strerror or e})")
    why = _digest_problem(digest, key, files, secret)
    if why is not None:
        return Lookup(None, why)
    # The bytes that verified are the ones parsed: files swapped after hashing change nothing.
    try:
        plan = parse_plan(files[PLAN_FILE], entry / PLAN_FILE)
        problems = shards_problems(plan, entry / SHARDS_FILE, files[SHARDS_FILE])
        if problems:
            raise InputError("", problems)
        check_plan(plan, earlier_cost_models=False)  # one of an earlier cost model: searched again
    except InputError as e:
        return Lookup(None, str(e.problems[0]) if e.problems else e.title)
    why = fits(plan)
    return Lookup(None, why) if why is not None else Lookup(plan)


def write_entry(cache_dir: str | Path, key: str, plan: Plan) -> None:
    """Cache ``plan`` under ``key`` with its digest; a failure is reported in one line, not raised
    (the plan is searched again next time)."""
    try:
        secret = cache_secret(cache_dir)

        def digest(tmp: Path) -> None:
            files = {name: (tmp / name).read_bytes() for name in DIGESTED}
            (tmp / CACHE_DIGEST_FILE).write_text(json.dumps(_signed(key, files, secret), indent=1) + "\n",
                                                 encoding="utf-8")

        write_plan(plan, Path(cache_dir, key), extra=digest, owned=(CACHE_DIGEST_FILE,))
    except OSError as e:
        log.warning("plan cache: cannot store plan %s in %s (%s); it will be searched again next time",
                    plan.plan_id, Path(cache_dir, key), e.strerror or e)


def cache_secret(cache_dir: str | Path) -> bytes:
    """The secret of this cache, made on first use; one that is not private to this user (another
    owner, readable by others, a symbolic link) is replaced, which voids every entry signed with it."""
    path = secret_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        data, why = _existing_secret(path)
        if data is not None:
            return data
        if why is not None:
            log.warning("plan cache: the key %s %s; made a new one (cached plans will be searched again)",
                        path, why)
            return _replace_secret(path)
        made = _new_secret(path)
        if made is not None:
            return made  # else another process made one first: read that


def _existing_secret(path: Path) -> tuple[bytes | None, str | None]:
    """(the secret, None), or (None, why it cannot be trusted), or (None, None) if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        return None, "is a symbolic link"
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        data = f.read(SECRET_BYTES + 1)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        return None, f"is not private to this user (mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid})"
    if len(data) != SECRET_BYTES:
        return None, f"holds {len(data)} bytes, not {SECRET_BYTES}"
    return data, None


def _replace_secret(path: Path) -> bytes:
    made = _new_secret(path, replace=True)
    assert made is not None
    return made


def _new_secret(path: Path, replace: bool = False) -> bytes | None:
    """A new secret in ``path`` (created 0600, then moved into place); None if, not replacing,
    another process made one first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    data = secrets.token_bytes(SECRET_BYTES)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # never over a secret another process just made
            except FileExistsError:
                return None
        return data
    finally:
        tmp.unlink(missing_ok=True)


def _read(path: Path, limit: int) -> bytes:
    with open(path, "rb") as f:
        data = read_at_most(f, limit)
    if len(data) > limit:
        raise OSError(errno.EFBIG, "larger than any file the cache writes", str(path))
    return data


def _signed(key: str, files: dict[str, bytes], secret: bytes) -> dict[str, object]:
    body: dict[str, object] = {"format": DIGEST_FORMAT, "key": key,
                               "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}}
    return {**body, "hmac_sha256": _mac(body, secret)}


def _mac(body: dict[str, object], secret: bytes) -> str:
    return hmac.new(secret, canonical_json(body).encode("ascii"), hashlib.sha256).hexdigest()


def _digest_problem(digest: bytes, key: str, files: dict[str, bytes], secret: bytes) -> str | None:
    """Why the entry's digest does not vouch for its files; None when it does."""
    try:
        claimed = load_json(digest)
    except DocumentError as e:
        return f"its {CACHE_DIGEST_FILE}: {e}"
    if not isinstance(claimed, dict) or claimed.get("format") != DIGEST_FORMAT:
        return f"its {CACHE_DIGEST_FILE} is not a {DIGEST_FORMAT}"
    expected = _signed(key, files, secret)
    if not hmac.compare_digest(str(claimed.get("hmac_sha256", "")), str(expected["hmac_sha256"])):
        if claimed.get("key") != key:
            return f"its digest was made for entry {claimed.get('key')!r:.40}"
        if claimed.get("sha256") != expected["sha256"]:
            return "its files changed after the search wrote them"
        return "its digest was not made with this state directory's key"
    return None
