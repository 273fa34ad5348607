"""The workloads the GPU check runs, sized for the ranks it found: spec rows (plain dicts, as a spec
file holds them) and a batch size per rank. On cuda they are GPU-sized (tens of GB of tables over
the ranks, iterations of 10 ms and more on an H100); on cpu small enough for 2 gloo ranks in seconds.

No torch here: the check plans in its own process and measures in torchrun's.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rec.sharding import ComputeDevice
from rec.spec.synthetic import CRITEO_1TB_ROWS, random_table_rows

GIB = 1 << 30


@dataclass(frozen=True)
class Ranks:
    """What the check runs on: ``world_size`` ranks of ``device`` on one host, ``hbm_bytes`` each."""

    device: ComputeDevice
    world_size: int
    hbm_bytes: int
    ddr_bytes: int

    @property
    def cuda(self) -> bool:
        return self.device is ComputeDevice.CUDA

    def topology(self, batch_size: int, hbm_bytes: int | None = None) -> dict[str, Any]:
        """The topology of these ranks (a topology file's keys) at ``batch_size`` per rank."""
        return {"world_size": self.world_size, "local_world_size": self.world_size,
                "compute_device": self.device.value, "hbm_cap": int(hbm_bytes or self.hbm_bytes),
                "ddr_cap": self.ddr_bytes, "batch_size": batch_size}


@dataclass(frozen=True)
class Workload:
    name: str
    rows: list[dict[str, Any]]  # spec rows
    batch_size: int  # per rank
    hbm_bytes: int | None = None  # a tighter HBM per rank than the device has (memory-tight shapes)
    given: bool = False  # the user's (--specs): its batch size as given, reported apart from the check's own
    family: str | None = None  # an out-of-family generator's (bench.gpu_check.families), reported apart
    source: str | None = None  # the --specs file of a given workload

    @property
    def group(self) -> str:
        """How the calibration section reports it: ``given``, ``out_of_family`` or ``builtin``."""
        return "given" if self.given else "out_of_family" if self.family else "builtin"


WORKLOAD_KEYS = ("tables", "batch_size", "hbm_cap")  # a YAML/JSON --specs file: a spec, and the two per rank
DEFAULT_BATCH = {True: 8192, False: 256}  # a --specs file without batch_size: cuda, cpu
GIVEN = "given/"  # before the name of a --specs workload whose stem is a built-in workload's


def read_workloads(paths: list[str], ranks: Ranks, reserved: Collection[str] = ()) -> list[Workload]:
    """The workloads of ``--specs`` files: any spec file (docs/spec.md); a YAML or JSON mapping with
    ``tables:`` may set ``batch_size`` and ``hbm_cap`` per rank too (an ``hbm_cap`` above the GPU's
    is the GPU's). Each is named by its file's stem; stems that several files share by their
    directories too (``a/spec``, ``b/spec``), a stem among ``reserved`` (the built-in workloads
    run beside them) as ``given/<stem>``. InputError naming every problem of every file."""
    from rec.errors import InputError, Problem
    from rec.input_files import YAML_EXTENSIONS

    problems: list[Problem] = []
    read: dict[Path, tuple[list[dict[str, Any]], int | None, int | None]] = {}
    given: dict[Path, Path] = {}  # per file, the path it was first given by (links not followed: its name)
    for path in paths:
        try:
            resolved = Path(path).resolve()
        except (OSError, RuntimeError):  # a loop of links (Python 3.11: RuntimeError; 3.13: OSError)
            problems.append(Problem(path, "is a symbolic link loop"))
            continue
        if resolved in read:  # the same file twice: one workload
            continue
        written = Path(path).absolute()
        normal = Path(os.path.normpath(written))  # "a/../b" as "b", unless a link made it another file
        given[resolved] = normal if normal.resolve() == resolved else written
        try:
            if Path(path).suffix.lower() in YAML_EXTENSIONS:
                rows, batch, hbm = _read_document(path)
            else:
                rows, batch, hbm = _spec_rows(path, path), None, None
        except InputError as e:
            problems += [p if p.where.startswith(path) else Problem(f"{path}: {p.where}", p.reason)
                         for p in e.problems]
            continue
        if ranks.cuda and hbm is not None:
            hbm = min(hbm, ranks.hbm_bytes)  # more than the GPU has would only fail when measured
        read[resolved] = rows, batch, hbm
    if problems:
        raise InputError("Cannot read the workloads (--specs):", problems)
    names = _names([given[path] for path in read], reserved)
    named: dict[str, list[Path]] = {}
    for file, workload in names.items():
        named.setdefault(workload, []).append(file)
    clashes = [Problem(str(files[1]), f"its workload would be named {workload!r}, as {files[0]}'s is: rename one")
               for workload, files in named.items() if len(files) > 1]
    if clashes:
        raise InputError("Cannot read the workloads (--specs):", clashes)
    return [Workload(names[given[path]], rows, batch or DEFAULT_BATCH[ranks.cuda], hbm, given=True,
                     source=str(given[path])) for path, (rows, batch, hbm) in read.items()]


def _read_document(path: str) -> tuple[list[dict[str, Any]], int | None, int | None]:
    """(rows, batch_size, hbm_cap) of a YAML or JSON ``--specs`` file: a spec's list of tables, or a
    mapping with ``tables:`` and optional ``batch_size`` and ``hbm_cap``; InputError naming every problem."""
    from rec.errors import InputError, Problem
    from rec.input_files import MAX_SPEC_FILE_BYTES, read_yaml_file
    from rec.validation import Problems, byte_size, integer, known_keys, required

    document = read_yaml_file(path, "workload", MAX_SPEC_FILE_BYTES, "a spec: tables: [...]")
    if isinstance(document, list):
        return _spec_rows(document, path), None, None
    if not isinstance(document, dict):
        raise InputError(path, [Problem(path, "expected a spec: a list of tables, or a mapping with tables: "
                                              "(and batch_size, hbm_cap)")])
    found = Problems(path)
    d = known_keys(document, WORKLOAD_KEYS, found)
    required(d, ["tables"], found)
    batch = found.take_from(d, "batch_size", lambda v: integer(v, minimum=1, maximum=1 << 20))
    hbm = found.take_from(d, "hbm_cap", lambda v: byte_size(v, minimum=1))
    problems = [Problem(f"{path}: {p.where}" if p.where != path else path, p.reason) for p in found.items]
    tables, rows = d.get("tables"), []
    if tables is not None and not isinstance(tables, list):
        problems.append(Problem(f"{path}: tables", "expected a list of tables"))
    elif tables is not None:
        try:
            rows = _spec_rows(tables, path)
        except InputError as e:
            problems += e.problems
    if problems:
        raise InputError(path, problems)
    return rows, batch, hbm


def _spec_rows(source: str | list[Any], path: str) -> list[dict[str, Any]]:
    """The validated spec's rows (a spec file's, or rows as a YAML file holds them), each table as
    ``rec.spec`` writes it; InputError naming every problem."""
    from rec.spec import read_spec, spec_from_rows
    from rec.spec.columns import table_to_short_row

    spec = read_spec(source) if isinstance(source, str) else spec_from_rows(source, source=path)
    return [table_to_short_row(t) for t in spec.tables]


def _names(paths: list[Path], reserved: Collection[str]) -> dict[Path, str]:
    """Each file's workload name: its stem; where several files share a stem, with as many of its
    directories as tell them apart (``a/spec``, ``b/spec``), and its extension where they are in
    one directory (``spec.yaml``, ``spec.json``); ``given/`` before a ``reserved`` name."""
    out: dict[Path, str] = {}
    for path in paths:
        same = [p for p in paths if p.stem == path.stem]
        depth = 0
        while len({_tail(p, depth) for p in same}) < len({p.parent for p in same}):
            depth += 1  # ends: files in different directories differ there
        twins = sum(p.parent == path.parent for p in same) > 1
        name = _tail(path, depth) + (path.suffix if twins else "")
        out[path] = f"{GIVEN}{name}" if name in reserved else name
    return out


def _tail(path: Path, depth: int) -> str:
    """``path``'s stem after its last ``depth`` directories, joined by ``/``."""
    dirs = path.parent.parts[1:]  # not the root
    return "/".join([*dirs[max(0, len(dirs) - depth):], path.stem])


def dlrm(ranks: Ranks, table_bytes: float | None = None, name: str = "dlrm_criteo") -> Workload:
    """A DLRM on Criteo's 26 categorical features, dim 128, one id per feature: the tables scaled
    so that they fill ``table_bytes`` together (default: 40% of the ranks' HBM on cuda, 20 MB on cpu)."""
    budget = table_bytes or (0.4 * ranks.hbm_bytes * ranks.world_size if ranks.cuda else 20e6)
    dim = 128 if ranks.cuda else 32
    scale = min(1.0, budget / (sum(CRITEO_1TB_ROWS) * dim * 4))
    rows = [{"name": f"cat_{i}", "num_embeddings": max(4, int(r * scale)), "embedding_dim": dim,
             "pooling_factor": 1.0} for i, r in enumerate(CRITEO_1TB_ROWS)]
    return Workload(name, rows, 8192 if ranks.cuda else 256)


# (seed, tables, batch per rank on cpu, share of tables allow-listed column-wise): the calibration bench's
CALIBRATION_SPECS = ((1, 5, 512, 0.0), (2, 12, 128, 0.0), (3, 30, 1024, 0.0), (4, 60, 256, 0.2), (5, 100, 512, 0.0),
                     (6, 200, 128, 0.0), (7, 8, 4096, 0.0), (8, 20, 2048, 0.25), (9, 45, 512, 0.0),
                     (10, 150, 256, 0.1), (11, 16, 1024, 0.0), (12, 80, 2048, 0.0))


def calibration_workloads(ranks: Ranks, count: int) -> list[Workload]:
    """The first ``count`` calibration specs. On cuda their batches start 16 times the cpu ones (the
    check then doubles a batch until the plan's iteration is GPU-sized, ``sized_batch``)."""
    memory = 0.25 * ranks.hbm_bytes * ranks.world_size if ranks.cuda else 1e8
    out = []
    for seed, tables, batch, share in CALIBRATION_SPECS[:count]:
        out.append(Workload(f"spec{seed}", random_table_rows(seed, tables, share, memory),
                            batch * 16 if ranks.cuda else batch))
    return out


def torchrec_shapes(ranks: Ranks) -> list[Workload]:
    """The shapes the TorchRec comparison plans: few big tables, many small ones, pooling-heavy,
    memory-tight (the topology's HBM a third of the tables), and EmbeddingBagCollection tables beside
    EmbeddingCollection ones."""
    rng = np.random.default_rng(2282)
    big_rows = int(min(20_000_000, 0.02 * ranks.hbm_bytes / (128 * 4))) if ranks.cuda else 50_000
    batch = 16384 if ranks.cuda else 256
    few_big = [{"name": f"big{i}", "num_embeddings": int(big_rows * (0.3 + 0.7 * rng.random())),
                "embedding_dim": 128 if ranks.cuda else 64, "pooling_factor": float(np.round(rng.uniform(1, 5), 1))}
               for i in range(8)]
    many_small = [{"name": f"small{i}", "num_embeddings": int(rng.integers(2, 1000)),
                   "embedding_dim": int(rng.integers(1, 5)) * 4, "pooling_factor": 1.0} for i in range(60)]
    pooling = [{"name": f"bag{i}", "num_embeddings": int(10 ** rng.uniform(4, 6)), "embedding_dim": 64,
                "pooling_factor": float(np.round(rng.uniform(40, 100)))} for i in range(20)]
    tight_rows = int(0.005 * ranks.hbm_bytes / (64 * 4)) if ranks.cuda else 100_000
    tight: list[dict[str, Any]] = [
        {"name": f"mem{i}", "num_embeddings": int(tight_rows * (0.5 + rng.random())), "embedding_dim": 64,
         "pooling_factor": float(np.round(rng.uniform(1, 10), 1))} for i in range(16)]
    tight_bytes = sum(int(r["num_embeddings"]) * 64 * 4 for r in tight)
    mixed = ([{"name": f"user{i}", "num_embeddings": int(10 ** rng.uniform(3, 6)), "embedding_dim": 64,
               "pooling_factor": float(np.round(rng.uniform(1, 20), 1)), "module": "towers.ebc"} for i in range(10)]
             + [{"name": f"seq{i}", "num_embeddings": int(10 ** rng.uniform(3, 6)), "embedding_dim": 64,
                 "pooling": "NONE", "pooling_factor": float(np.round(rng.uniform(5, 30))), "module": "sequence.ec"}
                for i in range(6)])
    out = [Workload("few_big", few_big, batch), Workload("many_small", many_small, batch * 4),
           Workload("pooling_heavy", pooling, batch // 2),
           Workload("memory_tight", tight, batch,
                    hbm_bytes=max(GIB // 4, tight_bytes // (3 * ranks.world_size)) if ranks.cuda else None),
           Workload("mixed_ebc_ec", mixed, batch)]
    return out
