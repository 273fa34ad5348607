"""The training input pipeline alone: the old Parquet path against the streaming one, in one run.

Writes a Criteo-shaped dataset (``label`` float32, ``dense`` fixed_size_list<float32, 13>,
``cat_0 .. cat_25`` list<int64> of one skewed id each, row groups of 65,536 rows, written as
``shardflow data criteo`` writes them) of ``--rows`` rows, and ``--big-factor`` such files (each
drawn with its own seed) as the big dataset. Every measurement is a fresh interpreter pinned to one
core (affinity, one OpenMP, torch and Arrow thread), rank 0 of 1, alternating, ``--repeats`` each:

- ``old``: ``parquet_batches`` as it was (below, verbatim): the whole table, Python lists, every
  batch built before the first is returned;
- ``new``: ``ParquetSource`` (shuffle on) through ``input_pipeline`` (a background thread, as the
  training job runs it); ``new_inline``: ``to_batch`` called in the loop; ``new_columns``: the
  source's ``Columns`` alone; ``new_stages``: ``new_inline`` with the time of each stage added up;
- ``new_big``: ``new`` on the big dataset; ``new_two_epochs``: two epochs and a batch of the small one.

Per run: the time to the first batch (from opening the data, after the imports), samples/s over
``--batches`` batches after it (by default the rest of one epoch of the file, so that the old path's
end-to-end rate counts every batch it built) and end to end including the first, the peak RSS growth
(``VmHWM`` reset after the imports, minus the RSS then). Prints medians, spreads (min-max) and
ratios, checks the targets (exit 1 naming each one missed) and writes
bench/results/data_bench_cpu_DATE.json with every run.

    .venv/bin/python bench/data_bench.py                       # ~1M rows and 10x, 3 repeats
    .venv/bin/python bench/data_bench.py --old-rows 200000     # the old path on a smaller file too
    .venv/bin/python bench/data_bench.py --profile             # and cProfile's view of the new path
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from itertools import cycle
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rec.errors import InputError, Problem  # noqa: E402
from rec.hit_rates import ID_SKEW  # noqa: E402
from rec.spec import Spec, spec_from_rows  # noqa: E402
from rec.spec.types import TableSpec  # noqa: E402
from rec.train.tables import one_default_ebc  # noqa: E402

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rec.train.batch import ModuleBatch

GROUP_ROWS = 1 << 16  # rows per row group, as `shardflow data criteo` writes
DENSE_IN_FEATURES = 13
FEATURES = tuple(f"cat_{i}" for i in range(26))
CLICK_RATE = 0.25
DEPTH = 4  # the training job's --prefetch-batches default
MODES = ("old", "new", "new_inline", "new_columns", "new_stages")  # alternated on the small file
MIB = 1 << 20
TARGET_RATE = 500_000  # samples/s of the new path on one core
TARGET_SPEEDUP = 50.0  # the new path's end-to-end rate over the old path's, same file
TARGET_GROWTH_MIB = 100e6 / MIB  # 100 MB: the new path's peak RSS growth, big dataset over small
TARGET_FIRST_S = 10.0  # the new path's first batch, both sizes


# The reference: the old path, verbatim from commit 0d25d60, rec/train/data.py (``parquet_batches``
# and the helpers it calls), so that it runs as it did however rec/ changes.

DATA_COLUMNS = ("label", "dense")  # besides one column per feature name


def feature_tables(spec: Spec | tuple[TableSpec, ...]) -> list[tuple[str, int, float]]:
    """(feature, rows of its table, pooling factor) in the module's feature order (spec order)."""
    tables = spec.tables if isinstance(spec, Spec) else spec
    return [(f, t.num_embeddings, t.pooling_factor) for t in tables for f in t.feature_names]


def module_tables(spec: Spec) -> dict[str, tuple[TableSpec, ...]]:
    """Each embedding module's tables, modules in model order, tables in spec order."""
    return {path: tuple(t for t in spec.tables if t.module == path) for path in spec.modules}


def data_problems(path: str, feature_names: Sequence[str]) -> list[Problem]:
    """What makes ``path`` unusable as training data, from its schema alone."""
    if not Path(path).exists():
        return [Problem(f"--data {path}", "no such file or directory")]
    import pyarrow.dataset as ds

    try:
        columns = set(ds.dataset(path, format="parquet").schema.names)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        return [Problem(f"--data {path}", f"cannot read it as Parquet: {e}")]
    missing = [c for c in (*DATA_COLUMNS, *feature_names) if c not in columns]
    if missing:
        return [Problem(f"--data {path}", f"missing columns {', '.join(missing)} (needs label, dense and "
                                          "one list<int64> column per feature name)")]
    return []


def parquet_batches(path: str, spec: Spec, batch_size: int, dense_in_features: int, rank: int,
                    world_size: int, pin_memory: bool = False) -> Iterator[Batch | ModuleBatch]:
    """Batches from Parquet rows (this rank's share), cycled so any iteration count works."""
    import pyarrow.dataset as ds
    import torch
    from torchrec.datasets.utils import Batch

    from rec.train.batch import ModuleBatch

    features = list(dict.fromkeys(f for f, _, _ in feature_tables(spec)))
    problems = data_problems(path, features)
    if problems:
        raise InputError("Cannot train on this data:", problems)
    table = ds.dataset(path, format="parquet").to_table()
    rows = np.arange(rank, table.num_rows, world_size)
    usable = len(rows) // batch_size * batch_size
    if usable == 0:
        raise InputError("Cannot train on this data:", [Problem(
            f"--data {path}", f"{table.num_rows} rows give rank {rank} of {world_size} no full batch of "
                              f"{batch_size}; use a smaller --batch-size or more rows")])
    table = table.take(rows[:usable])
    modules = module_tables(spec)
    made: list[Batch | ModuleBatch] = []
    for start in range(0, usable, batch_size):
        chunk = table.slice(start, batch_size)
        dense = np.asarray(chunk.column("dense").to_pylist(), dtype=np.float32)
        if dense.shape[1] != dense_in_features:
            raise InputError("Cannot train on this data:", [Problem(
                f"--data {path}", f"dense has {dense.shape[1]} values per sample, --dense-in-features "
                                  f"is {dense_in_features}")])
        ids = {f: chunk.column(f).to_pylist() for f in features}
        labels = torch.tensor(chunk.column("label").to_pylist(), dtype=torch.float32)
        batch: Batch | ModuleBatch
        if one_default_ebc(spec):
            batch = Batch(torch.from_numpy(dense), _kjt(spec.tables, ids), labels)
        else:
            batch = ModuleBatch(torch.from_numpy(dense), {p: _kjt(t, ids) for p, t in modules.items()}, labels)
        made.append(batch.pin_memory() if pin_memory else batch)
    return cycle(made)


def _kjt(tables: tuple[TableSpec, ...], ids: dict[str, list[list[int]]]) -> KeyedJaggedTensor:
    """The KJT of ``tables``' features from each feature's ids per sample."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = [f for f, _, _ in feature_tables(tables)]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor([i for f in keys for sample in ids[f] for i in sample], dtype=torch.int64),
        lengths=torch.tensor([len(sample) for f in keys for sample in ids[f]], dtype=torch.int32),
    )


# The data.

def bench_spec(rows_per_table: int) -> Spec:
    """Criteo's 26 tables, one feature each, one id per sample."""
    return spec_from_rows([{"name": f"t_{f}", "num_embeddings": rows_per_table, "embedding_dim": 16,
                            "feature_names": [f], "pooling_factor": 1.0} for f in FEATURES],
                          source="data_bench")


def write_file(path: Path, rows: int, rows_per_table: int, seed: int) -> None:
    """``rows`` Criteo-shaped rows: ids ``rows_per_table x u**ID_SKEW`` (a few hot rows, a long tail)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rec.data.criteo import CriteoSettings, output_schema

    schema = output_schema()
    codec = CriteoSettings(rows_per_table=1).compression.value  # the converter's default
    with pq.ParquetWriter(path, schema, compression=codec, use_dictionary=False, write_statistics=False) as w:
        for k, start in enumerate(range(0, rows, GROUP_ROWS)):
            n = min(GROUP_ROWS, rows - start)
            rng = np.random.default_rng([seed, k])
            one_each = pa.array(np.arange(n + 1, dtype=np.int32))
            dense = pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(n * DENSE_IN_FEATURES, np.float32)), DENSE_IN_FEATURES)
            ids = [pa.ListArray.from_arrays(one_each, pa.array(
                (rows_per_table * rng.random(n) ** ID_SKEW).astype(np.int64))) for _ in FEATURES]
            labels = pa.array((rng.random(n) < CLICK_RATE).astype(np.float32))
            w.write_table(pa.Table.from_arrays([labels, dense, *ids], schema=schema), row_group_size=GROUP_ROWS)


# One measurement, in a pinned child process.

def rss_mib(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` (peak) of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def pin(core: int) -> None:
    """One core, honestly: affinity, and one thread for torch and Arrow (OMP_NUM_THREADS is set by
    the parent, before the child's imports)."""
    os.sched_setaffinity(0, {core})
    import pyarrow as pa
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)


class Stages:
    """Seconds the new path spends in each stage, added up by wrapping, in place, functions it calls
    through a module or class attribute: pyarrow's (stable hooks, whatever rec/data's internals),
    ``from_arrow`` as ``rec.data.parquet`` calls it, and the window's shuffle (``Columns.take``, or
    Arrow's ``Table.take``, which calls ``pyarrow.compute.take``, in versions that shuffled with it)."""

    def __init__(self) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        import rec.data.parquet as parquet_module
        from rec.data.columns import Columns

        self.s: dict[str, float] = {"parquet_read_decode": 0.0, "take_shuffle": 0.0, "from_arrow": 0.0}
        pq.ParquetFile.read_row_group = self.timed("parquet_read_decode", pq.ParquetFile.read_row_group)
        pc.take = self.timed("take_shuffle", pc.take)
        parquet_module.from_arrow = self.timed("from_arrow", parquet_module.from_arrow)  # type: ignore[attr-defined]
        if hasattr(Columns, "take"):
            Columns.take = self.timed("take_shuffle", Columns.take)  # type: ignore[method-assign]

    def timed(self, name: str, f: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                self.s[name] += time.perf_counter() - began
        return wrapper


def preload() -> None:
    """What either path imports on its way, imported before the clock starts (a job has them)."""
    import pyarrow.compute
    import pyarrow.dataset
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401
    import torchrec  # noqa: F401
    from torchrec.datasets.utils import Batch  # noqa: F401


def child(mode: str, data: str, rows_per_table: int, batch_size: int, batches: int, window: int) -> dict[str, Any]:
    """Open ``data`` the ``mode`` way, take the first batch and ``batches`` more; times, rates, memory."""
    preload()
    from rec.data.files import open_data
    from rec.data.layout import DataLayout
    from rec.data.order import Position
    from rec.data.parquet import ParquetSource
    from rec.train.input import input_pipeline, to_batch

    spec = bench_spec(rows_per_table)
    layout = DataLayout.of_spec(spec, DENSE_IN_FEATURES)
    one = one_default_ebc(spec)
    stages = Stages() if mode == "new_stages" else None
    to_batch_s = 0.0
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0+)
    before = rss_mib("VmRSS")
    began = time.perf_counter()
    it: Iterator[Any]
    if mode == "old":
        it = parquet_batches(data, spec, batch_size, DENSE_IN_FEATURES, 0, 1)
    else:
        source = ParquetSource.open(open_data(data), layout, seed=0, shuffle=True, window=window)
        columns = source.batches(Position(1), 0, batch_size)
        if mode == "new":
            it = input_pipeline(columns, layout, one, DEPTH, pin_memory=False)
        elif mode == "new_columns":
            it = columns
        else:
            def inline() -> Iterator[Any]:
                nonlocal to_batch_s
                for c in columns:
                    t = time.perf_counter()
                    batch = to_batch(c, layout, one)
                    to_batch_s += time.perf_counter() - t
                    yield batch
            it = inline()
    first = next(it)
    first_s = time.perf_counter() - began
    del first
    if stages is not None:  # the steady state's stages: the first batch's are in first_s
        stages.s = dict.fromkeys(stages.s, 0.0)
        to_batch_s = 0.0
    after_first = time.perf_counter()
    for _ in range(batches):
        next(it)
    rest_s = time.perf_counter() - after_first
    out: dict[str, Any] = {"first_batch_s": first_s, "rest_s": rest_s,
                           "samples_per_s": batches * batch_size / rest_s,
                           "end_to_end_samples_per_s": (batches + 1) * batch_size / (first_s + rest_s),
                           "peak_rss_growth_mib": rss_mib("VmHWM") - before, "rss_before_mib": before}
    if mode != "old":
        out["reader_threads"] = getattr(source, "threads", 1)  # rec/data reads in threads where it can
    if stages is not None:
        timed = {**stages.s, "to_batch": to_batch_s}
        out["stages_s"] = {**timed, "rest": rest_s - sum(timed.values())}  # slicing, concatenating, rebatching
    return out


def profile(data: str, rows_per_table: int, batch_size: int, batches: int, window: int) -> None:
    """cProfile's view of the new path with ``to_batch`` inline: ``batches`` batches after the first."""
    import cProfile
    import pstats

    from rec.data.files import open_data
    from rec.data.layout import DataLayout
    from rec.data.order import Position
    from rec.data.parquet import ParquetSource
    from rec.train.input import to_batch

    preload()
    spec = bench_spec(rows_per_table)
    layout = DataLayout.of_spec(spec, DENSE_IN_FEATURES)
    source = ParquetSource.open(open_data(data), layout, seed=0, shuffle=True, window=window)
    columns = source.batches(Position(1), 0, batch_size)
    to_batch(next(columns), layout, True)
    with cProfile.Profile() as p:
        for _ in range(batches):
            to_batch(next(columns), layout, True)
    pstats.Stats(p).sort_stats("tottime").print_stats(15)


# The driver.

def run_child(mode: str, data: Path, a: argparse.Namespace, batches: int) -> dict[str, Any]:
    job = {"mode": mode, "data": str(data), "rows_per_table": a.rows_per_table, "batch_size": a.batch_size,
           "batches": batches, "window": a.window}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(job), "--core", str(a.core)],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"data_bench: {mode} on {data} failed:\n{r.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def code_state() -> dict[str, str]:
    """The commit measured, and the input pipeline's files that differ from it (others edit them)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted": git("status", "--porcelain", "--", "rec/data", "rec/train/input.py")}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, dict):
            out[key] = summary([r[key] for r in runs])
            continue
        values = np.array([r[key] for r in runs], float)
        out[key] = {"median": float(np.median(values)), "min": float(values.min()), "max": float(values.max())}
    return out


def show(s: dict[str, Any], key: str, scale: float = 1.0, digits: int = 0) -> str:
    m = s[key]
    return f"{m['median'] / scale:,.{digits}f} ({m['min'] / scale:,.{digits}f}-{m['max'] / scale:,.{digits}f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the small dataset")
    p.add_argument("--old-rows", type=int, default=None,
                   help="rows of the file the old path reads, if not --rows (the new path reads it too; "
                        "keep it several --window long, or the new path's rate after its first batch means little)")
    p.add_argument("--big-factor", type=int, default=10, help="the big dataset: this many files of --rows rows")
    p.add_argument("--rows-per-table", type=int, default=1_000_000)
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--batches", type=int, default=0, help="batches timed after the first; 0: the rest of one "
                                                            "epoch of the file (never more)")
    p.add_argument("--window", type=int, default=1 << 16, help="the new path's shuffle window")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)), help="the core every run is pinned to")
    p.add_argument("--workdir", default=None, help="the datasets go here (default: a temporary directory)")
    p.add_argument("--profile", action="store_true", help="also print cProfile's view of the new path")
    p.add_argument("--out", default=None, help="default: bench/results/data_bench_cpu_DATE.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        pin(a.core)
        job = json.loads(a.child)
        if job["mode"] == "profile":
            profile(**{k: v for k, v in job.items() if k != "mode"})
        else:
            print(json.dumps(child(**job)))
        return 0
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        return measure(a, Path(tmp))


def measure(a: argparse.Namespace, work: Path) -> int:
    small, big = work / "small.parquet", work / "big"
    big.mkdir()
    old_file = small if a.old_rows in (None, a.rows) else work / "old.parquet"
    began = time.perf_counter()
    write_file(small, a.rows, a.rows_per_table, seed=0)
    for k in range(a.big_factor):
        write_file(big / f"part-{k:05d}.parquet", a.rows, a.rows_per_table, seed=1 + k)
    if old_file != small:
        write_file(old_file, a.old_rows, a.rows_per_table, seed=0)
    print(f"data_bench: wrote {a.rows:,} rows and {a.big_factor} files of as many in "
          f"{time.perf_counter() - began:.0f} s ({small.stat().st_size / MIB:,.0f} MiB a file); every run pinned "
          f"to core {a.core}", flush=True)
    epoch = a.rows // a.batch_size - 1  # batches after the first that one epoch of the file holds
    small_batches = min(a.batches or epoch, epoch)
    old_epoch = (a.old_rows or a.rows) // a.batch_size - 1
    old_batches = min(a.batches or old_epoch, old_epoch)
    plan: list[tuple[str, str, Path, int]] = [  # (name, mode, data, batches after the first)
        ("old", "old", old_file, old_batches),
        *((m, m, small, small_batches) for m in MODES[1:]),
        ("new_big", "new", big, small_batches),
        ("new_two_epochs", "new", small, 2 * (epoch + 1)),
    ]
    if old_file != small:
        plan.insert(1, ("new_on_old_file", "new", old_file, old_batches))
    code = code_state()
    changed = code["uncommitted"].replace("\n", ", ")
    print(f"data_bench: measuring commit {code['commit']}{f' with uncommitted {changed}' if changed else ''}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in plan}
    for k in range(a.repeats):
        for name, mode, data, batches in plan:
            r = run_child(mode, data, a, batches)
            runs[name].append(r)
            print(f"  {name:15s} run {k + 1}: first batch {r['first_batch_s']:6.2f} s, "
                  f"{r['samples_per_s']:>13,.0f} samples/s after it, {r['end_to_end_samples_per_s']:>9,.0f} end to "
                  f"end, peak RSS +{r['peak_rss_growth_mib']:,.0f} MiB", flush=True)
    result = {name: summary(rs) for name, rs in runs.items()}
    pair = "new_on_old_file" if old_file != small else "new"
    med = {name: {k: v["median"] for k, v in s.items() if "median" in v} for name, s in result.items()}
    ratios = {"new_over_old_end_to_end": med[pair]["end_to_end_samples_per_s"] / med["old"]["end_to_end_samples_per_s"],
              "new_steady_over_old_end_to_end": med[pair]["samples_per_s"] / med["old"]["end_to_end_samples_per_s"],
              "old_over_new_first_batch": med["old"]["first_batch_s"] / med[pair]["first_batch_s"],
              "old_over_new_peak_rss": med["old"]["peak_rss_growth_mib"] / med[pair]["peak_rss_growth_mib"]}
    growth = med["new_big"]["peak_rss_growth_mib"] - med["new"]["peak_rss_growth_mib"]
    targets = {  # name: (value, bound), met when value >= bound
        f"new path >= {TARGET_RATE:,} samples/s on one core": (med["new"]["samples_per_s"], TARGET_RATE),
        f"new path >= {TARGET_SPEEDUP:.0f}x the old path's end-to-end rate (same file, both end to end)":
            (ratios["new_over_old_end_to_end"], TARGET_SPEEDUP),
        f"new path's peak RSS growth on {a.big_factor}x data < 100 MB ({TARGET_GROWTH_MIB:.1f} MiB) over 1x":
            (-growth, -TARGET_GROWTH_MIB),
        f"new path's first batch < {TARGET_FIRST_S:.0f} s on 1x": (-med["new"]["first_batch_s"], -TARGET_FIRST_S),
        f"new path's first batch < {TARGET_FIRST_S:.0f} s on {a.big_factor}x":
            (-med["new_big"]["first_batch_s"], -TARGET_FIRST_S),
    }
    missed = [name for name, (value, bound) in targets.items() if not value >= bound]
    report(a, result, pair, ratios, growth, targets, missed)
    if a.profile:
        job = {"mode": "profile", "data": str(small), "rows_per_table": a.rows_per_table,
               "batch_size": a.batch_size, "batches": small_batches, "window": a.window}
        subprocess.run([sys.executable, __file__, "--child", json.dumps(job), "--core", str(a.core)],
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
    out = Path(a.out or ROOT / f"bench/results/data_bench_cpu_{datetime.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "core": a.core, "python": sys.version.split()[0]}, "code": code,
        "settings": {k: v for k, v in vars(a).items() if k != "child"}, "group_rows": GROUP_ROWS,
        "file_mib": small.stat().st_size / MIB, "batches_after_first": {name: b for name, _, _, b in plan},
        "runs": runs, "summary": result, "ratios": ratios, "big_over_small_peak_rss_growth_mib": growth,
        "targets": {name: {"value": abs(v), "bound": abs(b), "met": name not in missed}
                    for name, (v, b) in targets.items()}}, indent=1) + "\n")
    print(f"data_bench: wrote {out}")
    if missed:
        print("data_bench: missed " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0


def report(a: argparse.Namespace, result: dict[str, Any], pair: str, ratios: dict[str, float], growth: float,
           targets: dict[str, tuple[float, float]], missed: list[str]) -> None:
    old_rows = a.old_rows or a.rows
    print(f"\nmedian (min-max) of {a.repeats} runs, each a fresh process on one core; rank 0 of 1, batch "
          f"{a.batch_size:,}; old on {old_rows:,} rows, {pair} on the same file")
    old, new = result["old"], result[pair]
    rows = [("first batch, s", "first_batch_s", 2), ("samples/s after the first", "samples_per_s", 0),
            ("samples/s end to end", "end_to_end_samples_per_s", 0), ("peak RSS growth, MiB", "peak_rss_growth_mib", 0)]
    print(f"{'':28s}{'old':>34s} {'new':>34s}{'new vs old':>14s}")
    for label, key, digits in rows:
        x = new[key]["median"] / old[key]["median"]
        print(f"{label:28s}{show(old, key, digits=digits):>34s} {show(new, key, digits=digits):>34s}{x:>13.3g}x")
    print(f"\nthe new path's variants, {a.rows:,} rows ({a.big_factor}x: {a.big_factor} files of as many)")
    print(f"{'':16s}{'first batch, s':>22s}{'samples/s after it':>36s}{'end to end':>36s}{'peak RSS +MiB':>18s}")
    for name, s in result.items():
        if name != "old":
            print(f"{name:16s}{show(s, 'first_batch_s', digits=2):>22s}{show(s, 'samples_per_s'):>36s}"
                  f"{show(s, 'end_to_end_samples_per_s'):>36s}{show(s, 'peak_rss_growth_mib'):>18s}")
    stages = result["new_stages"]["stages_s"]
    total = sum(v["median"] for v in stages.values())
    print("\nnew path with to_batch inline, after the first batch, s (median, share): " + ", ".join(
        f"{k} {v['median']:.3f} ({100 * v['median'] / total:.0f}%)" for k, v in stages.items()))
    print(f"{pair}/old: end to end {ratios['new_over_old_end_to_end']:,.0f}x, the new steady rate over the old "
          f"end to end {ratios['new_steady_over_old_end_to_end']:,.0f}x, first batch "
          f"{ratios['old_over_new_first_batch']:,.0f}x sooner, peak RSS growth {ratios['old_over_new_peak_rss']:,.1f}x "
          f"smaller; {a.big_factor}x data: the new path's peak RSS growth {growth:+,.0f} MiB")
    for name, (value, _) in targets.items():
        print(f"  {'MISSED' if name in missed else 'met   '}  {name}: {abs(value):,.2f}")


if __name__ == "__main__":
    sys.exit(main())
