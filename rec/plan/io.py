"""``plan.json`` and ``shards.parquet`` (docs/plan-format.md): identical plans give identical bytes.

Writing is atomic with plan.json as the commit point: every file is written in a private temporary
directory, files of an earlier plan that the new one does not have are removed, and the new files
are moved into place, plan.json last. A reader that finds plan.json finds the shards.parquet of the
same plan, or a newer one if a writer crashed in between: reading a plan directory checks its
shards.parquet against plan.json (``shards_problems``). A write that fails (a full disk) leaves
the directory as it was.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from rec.cost.types import COMPUTE_KERNELS, SHARDING_TYPES
from rec.errors import InputError, Problem
from rec.plan.chart import CHART_FILE
from rec.plan.types import PLAN_FORMATS, Plan, PlanMetrics, Replicas, Shard, TablePlan
from rec.sharding import ComputeKernel, ShardingType
from rec.spec.types import DEFAULT_MODULE

PLAN_FILE = "plan.json"
SHARDS_FILE = "shards.parquet"
MOVEMENT_FILE = "movement.parquet"  # replanned plans: bytes moving into and out of each rank
PLAN_FILES = (PLAN_FILE, SHARDS_FILE)  # what a plan is read from (``read_plan`` of its directory)
CACHE_DIGEST_FILE = "cache-digest.json"  # plan cache entries only (tasks.plan_cache)
# Every file a plan directory may hold: a write removes those the new plan does not have.
PLAN_DIR_FILES = (PLAN_FILE, SHARDS_FILE, CHART_FILE, MOVEMENT_FILE, CACHE_DIGEST_FILE)
# A write that fails for want of space (a full disk, a quota, a file size limit) is reported as such.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
TMP_PREFIX = ".tmp-plan-"
WRITE_LOCK = ".plan-write.lock"
SHARD_COLUMNS = ("plan_id", "table", "sharding_type", "compute_kernel", "shard", "rank",
                 "row_offset", "col_offset", "rows", "cols")
# A plan with tables outside the default module (plan.json v3) also has a module column after table.
SHARD_COLUMNS_MODULES = (*SHARD_COLUMNS[:2], "module", *SHARD_COLUMNS[2:])
TEXT_COLUMNS = (*SHARD_COLUMNS[:4], "module")  # the rest are integers
ROWS_PER_GROUP = 1 << 22  # shards.parquet is written in row groups of at most this many shards


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plan.json holds it (for inspection; ``dumps_plan`` writes the text)."""
    import orjson

    payload: dict[str, Any] = orjson.loads(dumps_plan(plan))
    return payload


def _header(plan: Plan) -> dict[str, Any]:
    metrics = asdict(plan.metrics)
    if metrics["movement"] is None:
        del metrics["movement"]
    previous = {"previous_plan_id": plan.previous_plan_id} if plan.previous_plan_id else {}
    return {"format": plan.format, "plan_id": plan.plan_id, "spec_hash": plan.spec_hash, **previous,
            "topology": plan.topology, "planner": plan.planner, "tables": None, "metrics": metrics,
            "spec": None}


def table_lines(plan: Plan) -> list[str]:
    """One JSON object per table, written from the columns (100,000 tables in well under a second)."""
    c = plan.columns
    names = [json.dumps(n) if m == DEFAULT_MODULE else f'{json.dumps(n)},"module":{json.dumps(m)}'
             for n, m in zip(c.names, c.modules, strict=True)]  # v3: the module after the name
    st = [SHARDING_VALUES[x] for x in c.sharding_type.tolist()]
    ck = [KERNEL_VALUES[x] for x in c.compute_kernel.tolist()]
    perf, hbm, ddr = map(list, (c.perf.tolist(), c.hbm.tolist(), c.ddr.tolist()))
    start, replicated = c.shard_start.tolist(), c.replicated.tolist()
    rank, r0, c0, nr, nc = (getattr(c, f).tolist() for f in ("rank", "row_offset", "col_offset", "rows", "cols"))
    lines = []
    for i in range(len(names)):
        lo, hi = start[i], start[i + 1]
        head = f'{{"name":{names[i]},"sharding_type":"{st[i]}","compute_kernel":"{ck[i]}",'
        est = f'"est":{{"perf":{perf[i]!r},"storage":{{"hbm":{hbm[i]},"ddr":{ddr[i]}}}}}}}'
        if replicated[i]:  # v2: one replica stands for one on every rank
            lines.append(f'{head}"replicated":true,"shards":[{{"offsets":[{r0[lo]},{c0[lo]}],'
                         f'"sizes":[{nr[lo]},{nc[lo]}]}}],{est}')
            continue
        shards = ",".join([f'{{"rank":{rank[j]},"offsets":[{r0[j]},{c0[j]}],"sizes":[{nr[j]},{nc[j]}]}}'
                           for j in range(lo, hi)])
        lines.append(f'{head}"ranks":[{",".join(map(str, rank[lo:hi]))}],"shards":[{shards}],{est}')
    return lines


SHARDING_VALUES = [m.value for m in SHARDING_TYPES]
KERNEL_VALUES = [m.value for m in COMPUTE_KERNELS]


def plan_from_dict(d: object, source: str = "plan") -> Plan:
    """Parse a plan.json payload; a malformed one is an InputError naming what is wrong."""
    if not isinstance(d, dict) or d.get("format") not in PLAN_FORMATS:
        got = d.get("format") if isinstance(d, dict) else f"a JSON {type(d).__name__}"
        raise InputError(f"{source} is not a shardflow plan:",
                         [Problem("format", f"expected one of {', '.join(PLAN_FORMATS)}, got {got!r}")])
    try:
        if not isinstance(d["topology"], dict):
            raise TypeError("topology must be a mapping")
        world = _int(d["topology"]["world_size"])
        tables = tuple(_table_from_dict(t, world) for t in _list(d["tables"]))
        m = d["metrics"]
        if not isinstance(m, dict):
            raise TypeError("metrics must be a mapping")
        known = {f.name for f in fields(PlanMetrics)}  # newer plans may carry more metrics
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in m.items() if k in known}
        metrics = PlanMetrics(**values)
        spec = tuple(_list(d.get("spec", [])))
        if not all(isinstance(row, dict) for row in spec):
            raise TypeError("spec rows must be mappings")
        previous = d.get("previous_plan_id")
        return Plan(_text(d["plan_id"]), _text(d["spec_hash"]), d["topology"], d.get("planner", {}),
                    tables, metrics, spec, None if previous is None else _text(previous))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        raise InputError(f"{source} is not a valid shardflow plan:", [Problem(source, what)]) from None


def _table_from_dict(t: object, world: int) -> TablePlan:
    if not isinstance(t, dict):
        raise TypeError(f"a table entry must be a mapping, got {t!r:.60}")
    shards: tuple[Shard, ...] | Replicas
    if t.get("replicated") is True:
        (only,) = _list(t["shards"])
        shards = Replicas(Shard(0, _pair(only["offsets"]), _pair(only["sizes"])), world)
        ranks: tuple[int, ...] | range = range(world)
    else:
        shards = tuple(Shard(_int(s["rank"]), _pair(s["offsets"]), _pair(s["sizes"]))
                       for s in _list(t["shards"]))
        ranks = tuple(_int(r) for r in _list(t["ranks"]))
        if ShardingType(t["sharding_type"]) is ShardingType.DATA_PARALLEL:
            shards, ranks = _as_replicas(shards, ranks, world)  # v1 listed every replica
    return TablePlan(
        module=_text(t.get("module", DEFAULT_MODULE)),
        name=_text(t["name"]),
        sharding_type=ShardingType(t["sharding_type"]),
        compute_kernel=ComputeKernel(t["compute_kernel"]),
        ranks=ranks,
        shards=shards,
        perf=float(t["est"]["perf"]),
        hbm=_int(t["est"]["storage"]["hbm"]),
        ddr=_int(t["est"]["storage"]["ddr"]),
    )


def _as_replicas(shards: tuple[Shard, ...], ranks: tuple[int, ...],
                 world: int) -> tuple[tuple[Shard, ...] | Replicas, tuple[int, ...] | range]:
    """v1's explicit replicas as ``Replicas`` when they are exactly one per rank (else as they are,
    for validation to name what is wrong)."""
    if shards and len(shards) == world and ranks == tuple(range(world)) \
            and all(s.rank == k and s.offsets == shards[0].offsets and s.sizes == shards[0].sizes
                    for k, s in enumerate(shards)):
        return Replicas(shards[0], world), range(world)
    return shards, ranks


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r:.60}")
    return value


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r:.60}")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r:.60}")
    return value


def _pair(value: object) -> tuple[int, int]:
    items = _list(value)
    if len(items) != 2:
        raise ValueError(f"expected [row, col], got {value!r:.60}")
    return (_int(items[0]), _int(items[1]))


def dumps_plan(plan: Plan) -> str:
    """One line per top-level key, table and spec row: readable, diffable, and fast to write."""
    import orjson

    lines = ["{"]
    items = list(_header(plan).items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "tables":
            body = ",\n  ".join(table_lines(plan))
        elif key == "spec":
            body = b",\n  ".join(map(orjson.dumps, plan.spec_tables)).decode()
        else:
            lines.append(f"{json.dumps(key)}: {orjson.dumps(value).decode()}{comma}")
            continue
        lines.append(f"{json.dumps(key)}: [\n  {body}\n]{comma}" if body else f"{json.dumps(key)}: []{comma}")
    return "\n".join(lines) + "\n}\n"


def plan_file(path: str | Path) -> Path:
    """The plan.json that ``path`` names: the file itself, or the one in the directory."""
    path = Path(path)
    return path / PLAN_FILE if path.is_dir() else path


def read_plan(path: str | Path) -> Plan:
    """The plan in ``path`` (plan.json or its directory); InputError for anything that is not one.
    The shards.parquet beside plan.json is checked against it: a directory must have one, a
    plan.json named on its own is complete without it."""
    from rec.input_files import MAX_SPEC_FILE_BYTES, read_text

    directory = Path(path).is_dir()
    path = plan_file(path)
    plan = parse_plan(read_text(path, "the plan", MAX_SPEC_FILE_BYTES), path)
    shards = path.parent / SHARDS_FILE
    if directory or os.path.lexists(shards):
        problems = shards_problems(plan, shards)
        if problems:
            raise InputError(f"Cannot use the plan in {path.parent}:", problems)
    return plan


def parse_plan(text: str | bytes, path: str | Path) -> Plan:
    """The plan in plan.json's ``text`` (read from ``path``); InputError if it is not one."""
    import orjson

    try:
        # orjson: strict (no NaN, UTF-8, bounded nesting) and fast; a key written twice keeps the
        # last value, and what it changes is caught by validation and the plan_id check.
        payload = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InputError(f"Cannot read the plan {path}", [Problem(str(path), f"not valid JSON: {e}")]) from None
    return plan_from_dict(payload, str(path))


def shards_problems(plan: Plan, path: str | Path, data: bytes | None = None) -> list[Problem]:
    """Why ``path`` (or ``data``, its bytes as read) is not the shards.parquet of ``plan`` (missing,
    truncated, of another plan, edited); empty when it lists exactly the plan's shards."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(path)
    where = str(path)
    plan = replace(plan, tables=plan.columns)  # columns once, for the count and the rows
    if data is None and not path.is_file():
        return [Problem(where, f"is missing (or not a file): a plan directory holds the {PLAN_FILE} and "
                               f"{SHARDS_FILE} of one plan; write the plan again")]
    expected = int(np.where(plan.columns.replicated, plan.world_size, np.diff(plan.columns.shard_start)).sum())
    try:
        f = pq.ParquetFile(path if data is None else pa.BufferReader(data))
        names = f.schema_arrow.names
        columns = shard_columns(plan)
        if names != list(columns):
            return [Problem(where, f"has the columns {', '.join(names[:12])}, not those of a {SHARDS_FILE} "
                                   f"({', '.join(columns)})")]
        kinds = [pa.types.is_string(t) if name in TEXT_COLUMNS else pa.types.is_integer(t)
                 for name, t in zip(names, f.schema_arrow.types, strict=True)]
        if not all(kinds):
            found = ", ".join(f"{n} {t}" for n, t in zip(names, f.schema_arrow.types, strict=True))
            return [Problem(where, f"has columns of other types ({found}): text for {', '.join(TEXT_COLUMNS)}, "
                                   "integers for the rest")]
        ids = [str(v) for v in pc.unique(f.read(columns=["plan_id"])["plan_id"]).to_pylist()]
        if ids != [plan.plan_id]:
            return [Problem(where, f"belongs to plan {', '.join(ids[:3]) or '(none)'}, not to plan {plan.plan_id} "
                                   f"of its {PLAN_FILE}; write the plan again")]
        if f.metadata.num_rows != expected:
            return [Problem(where, f"has {f.metadata.num_rows:,} rows, but plan {plan.plan_id} has {expected:,} "
                                   "shards: truncated or edited; write the plan again")]
        table = f.read()
        offset = 0
        for batch in shard_tables(plan):
            want = batch.cast(table.schema)
            if not table.slice(offset, len(want)).equals(want):
                return [Problem(where, f"does not list the shards of its {PLAN_FILE} (plan {plan.plan_id}): one of "
                                       "the two was edited; write the plan again")]
            offset += len(want)
    except (OSError, ValueError, pa.ArrowException):  # pyarrow's own words say no more than this
        return [Problem(where, "is not a readable Parquet file (truncated or corrupt); write the plan again")]
    return []


def shard_columns(plan: Plan) -> tuple[str, ...]:
    """shards.parquet's columns for ``plan``: with ``module`` where a table is outside the default module."""
    return SHARD_COLUMNS if all(m == DEFAULT_MODULE for m in plan.columns.modules) else SHARD_COLUMNS_MODULES


def shard_tables(plan: Plan, rows_per_group: int = ROWS_PER_GROUP) -> Iterator[Any]:
    """``shards.parquet``'s rows as Arrow tables of at most ``rows_per_group`` shards (more for
    one table with more shards): one row per shard, replicas expanded, in table and shard order."""
    import pyarrow as pa

    c = plan.columns
    n = len(c)
    replicated = c.replicated
    counts = np.where(replicated, plan.world_size, np.diff(c.shard_start))
    flat = np.stack([c.rank, c.row_offset, c.col_offset, c.rows, c.cols], axis=1)
    first = c.shard_start[:-1]
    names = _strings(list(c.names))
    columns = shard_columns(plan)
    modules = _strings(list(c.modules)) if "module" in columns else None
    st_values = _strings(SHARDING_VALUES)
    ck_values = _strings(KERNEL_VALUES)
    st_code, ck_code = c.sharding_type.astype(np.int32), c.compute_kernel.astype(np.int32)
    plan_id = _strings([plan.plan_id])
    ends = np.cumsum(counts)
    start = 0
    while start < n or (n == 0 and start == 0):
        stop = max(int(np.searchsorted(ends, (ends[start - 1] if start else 0) + rows_per_group,
                                       side="right")), start + 1) if n else 0
        t = np.repeat(np.arange(start, stop), counts[start:stop])
        k = np.arange(len(t)) - np.repeat(ends[start:stop] - counts[start:stop], counts[start:stop]) \
            + (ends[start - 1] if start else 0)
        values = flat[first[t] + np.where(replicated[t], 0, k)]
        values[:, 0] = np.where(replicated[t], k, values[:, 0])  # replica k lives on rank k
        by_table = [pa.DictionaryArray.from_arrays(_ints(t.astype(np.int32)), names)]
        if modules is not None:
            by_table.append(pa.DictionaryArray.from_arrays(_ints(t.astype(np.int32)), modules))
        yield pa.Table.from_arrays([
            pa.DictionaryArray.from_arrays(_ints(np.zeros(len(t), np.int32)), plan_id),
            *by_table,
            pa.DictionaryArray.from_arrays(_ints(st_code[t]), st_values),
            pa.DictionaryArray.from_arrays(_ints(ck_code[t]), ck_values),
            _ints(k), *(_ints(values[:, j]) for j in range(5)),
        ], names=list(columns))
        if n == 0:
            return
        start = stop


def write_plan(plan: Plan, out_dir: str | Path,
               extra: Callable[[Path], None] | None = None) -> Path:
    """Write the plan (``write_plan_files``); returns the path of plan.json."""
    return write_plan_files(plan, out_dir, extra)[0]


def write_plan_files(plan: Plan, out_dir: str | Path,
                     extra: Callable[[Path], None] | None = None) -> tuple[Path, ...]:
    """Write plan.json and shards.parquet (movement.parquet for a replanned plan, and what
    ``extra(tmp_dir)`` adds once those are in ``tmp_dir``) as one unit: the files of an earlier
    plan in ``out_dir`` that this one does not have are removed, plan.json is replaced last.
    Returns the files written, plan.json first. A failed write leaves ``out_dir`` as it was; out
    of space, it raises OSError naming the file (``DISK_FULL_ERRNOS``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / WRITE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent writers into one directory take turns
        try:
            return _write_plan_files(plan, out, extra)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_plan_files(plan: Plan, out: Path, extra: Callable[[Path], None] | None) -> tuple[Path, ...]:
    _remove_abandoned(out)
    tmp = out / f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    writing = out
    try:
        tmp.mkdir()
        writing = out / SHARDS_FILE
        _write_shards(plan, tmp / SHARDS_FILE)
        if plan.metrics.movement:
            writing = out / MOVEMENT_FILE
            _write_movement(plan.metrics.movement, tmp / MOVEMENT_FILE)
        writing = out / PLAN_FILE
        (tmp / PLAN_FILE).write_text(dumps_plan(plan), encoding="utf-8")
        if extra is not None:
            writing = out
            extra(tmp)
        names = sorted(os.listdir(tmp), key=_listed_order)  # plan.json first
        for name in set(PLAN_DIR_FILES) - set(names):  # an earlier plan's, e.g. a chart or movement
            if (out / name).is_file() or (out / name).is_symlink():
                (out / name).unlink()
        for name in sorted(names, key=lambda n: n == PLAN_FILE):  # plan.json last: the commit point
            os.replace(tmp / name, out / name)
    except OSError as e:
        if e.errno in DISK_FULL_ERRNOS:
            raise OSError(e.errno, os.strerror(e.errno), str(writing)) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tuple(out / name for name in names)


def _listed_order(name: str) -> tuple[int, str]:
    return (PLAN_DIR_FILES.index(name) if name in PLAN_DIR_FILES else len(PLAN_DIR_FILES), name)


def _write_shards(plan: Plan, path: Path) -> None:
    import pyarrow.parquet as pq

    writer: Any = None
    try:
        for table in shard_tables(plan):
            # store_schema=False: readers see plain string columns, as shardflow always wrote them.
            writer = writer or pq.ParquetWriter(path, table.schema, compression="zstd",
                                                write_statistics=False, store_schema=False)
            writer.write_table(table)
        if writer is not None:
            closing, writer = writer, None
            closing.close()
    finally:
        if writer is not None:  # a write failed: that error is the one to report, not the close's
            try:
                writer.close()
            except OSError:
                pass


def _write_movement(movement: dict[str, Any], path: Path) -> None:
    """One row per rank: ``rank``, ``bytes_in``, ``bytes_out`` (moved parameter + optimizer bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    incoming = np.asarray(movement["bytes_in"], np.int64)
    table = pa.Table.from_arrays([_ints(np.arange(len(incoming), dtype=np.int64)), _ints(incoming),
                                  _ints(np.asarray(movement["bytes_out"], np.int64))],
                                 names=["rank", "bytes_in", "bytes_out"])
    pq.write_table(table, path, compression="zstd", store_schema=False)


def _remove_abandoned(out: Path) -> None:
    """Temporary directories of writers on this host that died (SIGKILL) before cleaning up."""
    host = socket.gethostname()
    for tmp in out.glob(f"{TMP_PREFIX}{host}-*"):
        try:
            pid = int(tmp.name.removeprefix(f"{TMP_PREFIX}{host}-").split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


# Arrow arrays from raw buffers: ``pa.array`` would import pandas (0.3 s) just to check whether its
# argument is a pandas object, which would dominate planning 500 tables.


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


def _ints(values: np.ndarray) -> Any:
    import pyarrow as pa

    wide = values.dtype != np.int32
    values = np.ascontiguousarray(values, dtype=np.int64 if wide else np.int32)
    kind = pa.int64() if wide else pa.int32()
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])
