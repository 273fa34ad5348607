"""plan.json's ``tables`` -> the plan's tables, every entry checked (``rec.plan.parse`` reads the rest).

A plan shardflow wrote has its entries in one form (docs/plan-format.md): those are checked in one
pass and become ``TableColumns`` at once, as fast as the search builds them (a 100,000-table plan is
read in seconds). An entry in any other form is read key by key with the rules of
``rec.validation``, so that every problem is named: names without control characters, a known
sharding type and kernel, offsets and sizes integers from 0 to 2^42 (the most rows a table holds),
ranks, estimates within what 64-bit arithmetic holds. Whether the shards tile their table and sit
on the right ranks is ``rec.plan.validate``'s to say.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rec.errors import show
from rec.plan.columns import SHARD_FIELDS, TableColumns
from rec.plan.types import Replicas, Shard, TablePlan
from rec.sharding import CK_CODE, COMPUTE_KERNELS, SHARDING_TYPES, ST_CODE, ComputeKernel, ShardingType
from rec.spec.limits import MAX_TABLE_WEIGHTS
from rec.spec.types import DEFAULT_MODULE
from rec.topology.types import MAX_WORLD_SIZE
from rec.validation import Problems, boolean, choice, finite_number, integer, known_keys, name, required

TABLE_KEYS = ("name", "module", "sharding_type", "compute_kernel", "cache_load_factor", "replicated", "ranks", "shards",
              "est")
SHARD_KEYS = ("rank", "offsets", "sizes")
MAX_BYTES = 2**62  # any byte count: the cost model's int64 sums stay exact
MAX_RANK = 2**31  # a rank outside [0, world_size) is validation's to name; this keeps arithmetic exact
MAX_NAME = 1024  # table and module names (the spec's own limits are stricter)
V1_HAS_NO = "format shardflow.plan/v1 has no such key"

# The forms shardflow writes (rec.plan.plan_json.table_lines): a table placed shard by shard, or
# replicated (data_parallel, and only it), each with or without ``module``.
_PLACED = frozenset({"name", "sharding_type", "compute_kernel", "ranks", "shards", "est"})
_REPLICATED = frozenset({"name", "sharding_type", "compute_kernel", "replicated", "shards", "est"})
_EXTRAS: tuple[frozenset[str], ...] = (frozenset(), frozenset({"module"}), frozenset({"cache_load_factor"}),
                                       frozenset({"module", "cache_load_factor"}))
_FORMS = tuple(form | extra for form in (_PLACED, _REPLICATED) for extra in _EXTRAS)
_SHARD, _REPLICA, _EST, _STORAGE = frozenset(SHARD_KEYS), frozenset(SHARD_KEYS[1:]), {"perf", "storage"}, {"hbm", "ddr"}
_ST = {m.value: i for i, m in enumerate(SHARDING_TYPES)}
_CK = {m.value: i for i, m in enumerate(COMPUTE_KERNELS)}
_DP = ST_CODE[ShardingType.DATA_PARALLEL]
_CACHING = CK_CODE[ComputeKernel.FUSED_UVM_CACHING]


def table_columns(entries: list[object], world: int) -> TableColumns | None:
    """The entries as columns when every one is in a form shardflow writes, with values of the right
    types and ranges; None otherwise (``read_tables`` then names what is wrong)."""
    names, modules, st, ck, perf, hbm, ddr, replicated, counts = [], [], [], [], [], [], [], [], []
    load_factors: list[float] = []
    flat: list[object] = []  # rank, row offset, col offset, rows, cols of every shard
    listed: list[object] = []  # the tables' ``ranks``
    for t in entries:
        if type(t) is not dict or t.keys() not in _FORMS:
            return None
        table, module = t["name"], t.get("module", DEFAULT_MODULE)
        s, k = _ST.get(t["sharding_type"]) if type(t["sharding_type"]) is str else None, \
            _CK.get(t["compute_kernel"]) if type(t["compute_kernel"]) is str else None
        rep = "replicated" in t
        if not (type(table) is str and type(module) is str and _plain_name(table) and _plain_name(module)) \
                or s is None or k is None or (s == _DP) != rep or (rep and t["replicated"] is not True):
            return None
        est, shards = t["est"], t["shards"]
        if type(est) is not dict or est.keys() != _EST or type(shards) is not list or not shards \
                or (rep and len(shards) != 1):
            return None
        storage, p = est["storage"], est["perf"]
        if type(storage) is not dict or storage.keys() != _STORAGE or type(p) not in (float, int) \
                or not 0 <= p < math.inf:
            return None
        for shard in shards:
            if type(shard) is not dict or shard.keys() != (_REPLICA if rep else _SHARD):
                return None
            offsets, sizes = shard["offsets"], shard["sizes"]
            if type(offsets) is not list or type(sizes) is not list or len(offsets) != 2 or len(sizes) != 2:
                return None
            flat += (0 if rep else shard["rank"], *offsets, *sizes)
        if not rep:
            if t["ranks"] != [shard["rank"] for shard in shards]:
                return None
            listed += t["ranks"]
        lf = t.get("cache_load_factor", math.nan)
        if "cache_load_factor" in t and not (type(lf) is float and 0 < lf <= 1 and k == _CACHING):
            return None
        load_factors.append(lf)
        names.append(table)
        modules.append(module)
        st.append(s)
        ck.append(k)
        perf.append(p)
        hbm.append(storage["hbm"])
        ddr.append(storage["ddr"])
        replicated.append(rep)
        counts.append(len(shards))
    if not all(type(v) is int and -MAX_BYTES <= v <= MAX_BYTES for v in (*flat, *hbm, *ddr, *listed)):
        return None
    shard = np.array(flat, dtype=np.int64).reshape(-1, 5)
    rank, sizes = shard[:, 0], shard[:, 1:]
    bytes_ = np.array([*hbm, *ddr], dtype=np.int64)
    if (np.abs(rank) > MAX_RANK).any() or (sizes < 0).any() or (sizes > MAX_TABLE_WEIGHTS).any() or (bytes_ < 0).any():
        return None
    return TableColumns(
        names=tuple(names), sharding_type=np.array(st, np.int8), compute_kernel=np.array(ck, np.int8),
        perf=np.array(perf, np.float64), hbm=np.array(hbm, np.int64), ddr=np.array(ddr, np.int64),
        replicated=np.array(replicated, bool),
        shard_start=np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(np.int64),
        **{f: np.ascontiguousarray(shard[:, j]) for j, f in enumerate(SHARD_FIELDS)},
        world_size=world, modules=tuple(modules), load_factor=np.array(load_factors, np.float64))


def _plain_name(text: str) -> bool:
    return 0 < len(text) <= MAX_NAME and text.isprintable() and text.strip() == text


def read_tables(entries: object, world: int | None, v1: bool,
                problems: Problems) -> Sequence[TablePlan] | None:
    """plan.json's ``tables`` (of a plan of ``world`` ranks, in format v1 or not) as the plan's tables,
    or None with every problem recorded. Entries exactly as shardflow writes them become columns at
    once; anything else is read entry by entry, so that each problem is named."""
    if isinstance(entries, list) and world is not None and not v1:
        columns = table_columns(entries, world)
        if columns is not None:
            return columns
    if not isinstance(entries, list):
        problems.add("tables", f"expected a list of tables, got {show(entries)}")
        return None
    tables = []
    for i, entry in enumerate(entries):
        label = f"tables[{i}]"
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str) and entry["name"].isprintable():
            label = f"table {show(entry['name'], 80)}"
        tables.append(_table(entry, world, v1, problems.within(label)))
    return None if any(t is None for t in tables) else tuple(t for t in tables if t is not None)


def record(d: object, keys: Sequence[str], problems: Problems, *, new_in_v2: Sequence[str] = (),
           v1: bool = False) -> Mapping[str, object] | None:
    """A record of a plan file: a mapping (else None, named), its keys known (in a v1 file, its
    keys that came with v2 named too)."""
    if not isinstance(d, Mapping):
        problems.add("", f"expected a mapping, got {show(d)}")
        return None
    for key in new_in_v2 if v1 else ():
        if key in d:
            problems.add(key, V1_HAS_NO)
    return known_keys(d, keys, problems)


def _table(record_: object, world: int | None, v1: bool, problems: Problems) -> TablePlan | None:
    before = len(problems.items)
    t = record(record_, TABLE_KEYS, problems, new_in_v2=("replicated", "module", "cache_load_factor"), v1=v1)
    if t is None:
        return None
    replicated = False if t.get("replicated") is None else problems.take("replicated", boolean, t["replicated"])
    required(t, ("name", "sharding_type", "compute_kernel", "shards", "est", *(() if replicated else ("ranks",))),
             problems)
    if replicated and "ranks" in t:
        problems.add("ranks", "a replicated table lists no ranks: its replica is on every rank")
    table_name = problems.take_from(t, "name", _name)
    module = DEFAULT_MODULE if t.get("module") is None else problems.take("module", _name, t["module"])
    sharding_type = problems.take_from(t, "sharding_type", lambda v: choice(ShardingType, v))
    kernel = problems.take_from(t, "compute_kernel", lambda v: choice(ComputeKernel, v))
    shards = _shards(t.get("shards"), bool(replicated), problems)
    ranks = None if replicated or t.get("ranks") is None else \
        problems.take("ranks", lambda v: _list_of(v, _rank, "ranks"), t["ranks"])
    est = _est(t.get("est"), problems.within("est"))
    load_factor = None if t.get("cache_load_factor") is None else \
        problems.take("cache_load_factor", _load_factor, t["cache_load_factor"])
    if load_factor is not None and kernel is not None and kernel is not ComputeKernel.FUSED_UVM_CACHING:
        problems.add("cache_load_factor", f"only a fused_uvm_caching table has a cache, this one is {kernel.value}")
    if len(problems.items) > before or None in (table_name, module, sharding_type, kernel, shards, est) \
            or world is None:
        return None
    assert table_name is not None and module is not None and sharding_type is not None and kernel is not None
    assert shards is not None and est is not None
    placed: tuple[Shard, ...] | Replicas = Replicas(shards[0], world) if replicated else shards
    held: tuple[int, ...] | range = range(world) if replicated else (ranks or ())
    if not replicated and sharding_type is ShardingType.DATA_PARALLEL:
        placed, held = _as_replicas(shards, tuple(held), world)  # v1 listed every replica
    return TablePlan(table_name, sharding_type, kernel, held, placed, est[0], est[1], est[2], module, load_factor)


def _shards(value: object, replicated: bool, problems: Problems) -> tuple[Shard, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        problems.add("shards", f"expected a list of shards, got {show(value)}")
        return None
    if replicated and len(value) != 1:
        problems.add("shards", f"a replicated table has one shard, its replica; got {len(value):,}")
        return None
    shards = []
    for k, s in enumerate(value):
        where = problems.within(f"shards[{k}]")
        if not isinstance(s, Mapping):
            where.add("", f"expected a mapping of rank, offsets and sizes, got {show(s)}")
            continue
        keys = SHARD_KEYS[1:] if replicated else SHARD_KEYS
        s = known_keys(s, keys, where)
        required(s, keys, where)
        rank = 0 if replicated else where.take_from(s, "rank", _rank)
        offsets = where.take_from(s, "offsets", _pair_of_sizes)
        sizes = where.take_from(s, "sizes", _pair_of_sizes)
        if rank is not None and offsets is not None and sizes is not None:
            shards.append(Shard(rank, offsets, sizes))
    return tuple(shards) if len(shards) == len(value) else None


def _est(value: object, problems: Problems) -> tuple[float, int, int] | None:
    if not isinstance(value, Mapping):
        problems.add("", f"expected a mapping of perf and storage, got {show(value)}")
        return None
    value = known_keys(value, ("perf", "storage"), problems)
    required(value, ("perf", "storage"), problems)
    perf = problems.take_from(value, "perf", milliseconds)
    storage = value.get("storage")
    if storage is not None and not isinstance(storage, Mapping):
        problems.add("storage", f"expected a mapping of hbm and ddr bytes, got {show(storage)}")
        return None
    if storage is None:
        return None
    inner = problems.within("storage")
    storage = known_keys(storage, ("hbm", "ddr"), inner)
    required(storage, ("hbm", "ddr"), inner)
    hbm, ddr = (inner.take_from(storage, key, byte_count) for key in ("hbm", "ddr"))
    if perf is None or hbm is None or ddr is None:
        return None
    return float(perf), hbm, ddr


def _as_replicas(shards: tuple[Shard, ...], ranks: tuple[int, ...],
                 world: int) -> tuple[tuple[Shard, ...] | Replicas, tuple[int, ...] | range]:
    """v1's explicit replicas as ``Replicas`` when they are exactly one per rank (else as they are,
    for validation to name what is wrong)."""
    if shards and len(shards) == world and ranks == tuple(range(world)) \
            and all(s.rank == k and s.offsets == shards[0].offsets and s.sizes == shards[0].sizes
                    for k, s in enumerate(shards)):
        return Replicas(shards[0], world), range(world)
    return shards, ranks


def _load_factor(value: object) -> float:
    """A cache's share of its table's rows: a number in (0, 1]."""
    number = finite_number(value, "a number in (0, 1]")
    if not 0 < number <= 1:
        raise ValueError(f"must be in (0, 1], got {number!r}")
    return number


def _name(value: object) -> str:
    return name(value, max_length=MAX_NAME)


def _rank(value: object) -> int:
    return integer(value, minimum=-MAX_RANK, maximum=MAX_RANK)


def byte_count(value: object) -> int:
    """An integer number of bytes, within what the cost model's 64-bit sums hold."""
    return integer(value, "an integer number of bytes", minimum=0, maximum=MAX_BYTES)


def milliseconds(value: object) -> float:
    """A finite number of ms, not negative."""
    return finite_number(value, "a number of ms", minimum=0.0)


def _pair_of_sizes(value: object) -> tuple[int, int]:
    """[row, col]: offsets and sizes lie within a table, whose rows and columns are each at most 2^42."""
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"expected [rows, columns], got {show(value)}")
    first, second = (integer(v, minimum=0, maximum=MAX_TABLE_WEIGHTS) for v in value)
    return first, second


def _list_of(value: object, rule: Callable[[object], int], what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_WORLD_SIZE:
        raise ValueError(f"expected a list of {what}, got {show(value)}")
    return tuple(rule(v) for v in value)
