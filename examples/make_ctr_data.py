"""Write a click dataset drawn from one planted model, so that the best possible AUC is known.

    python examples/make_ctr_data.py --out data/ctr
    shardflow run data/ctr/spec.yaml --topology examples/topologies/cpu_2proc.yaml \\
        --data data/ctr/train.parquet --iterations 400 --checkpoint-every 400 --out out/ctr
    shardflow eval --checkpoint out/ctr/train --data data/ctr/eval.parquet

and compare the eval AUC and logloss with ``bayes_auc_empirical`` and ``bayes_logloss`` in
data/ctr/truth.json. (400 iterations of 2 x 512 samples: two passes over the default 200,000 rows;
many more passes fit the rare ids' noise and lose eval AUC.)

The planted model: every table row (id) has a weight ``w ~ Normal(0, sigma)``, every dense feature a
weight ``v ~ Normal(0, dense_sigma)``; each table's weights are then scaled so that the weight of an
id drawn from it has mean square exactly ``sigma ** 2``, and the dense weights so that their mean
square is ``dense_sigma ** 2`` (a few hot rows take most draws: unscaled, the signal's strength, and
the best AUC with it, would swing with the seed). A sample's true click probability is

    p = sigmoid(bias + sum over features of the SUM of its ids' row weights + dense . v)

The sum (not the mean) matches the spec's default ``pooling: SUM``: the logit is linear in what the
model's embedding bags compute, so a trained model can represent it. Bags hold
Poisson(``pooling``) ids (empty bags happen and add 0); a table's row of popularity rank ``k`` is
drawn with probability proportional to ``(k + 1) ** -zipf``, and a seeded permutation per table
spreads the hot rows over the id range as hashed ids are. ``bias`` is solved so that the mean of
``p`` is ``base_rate``. Labels are Bernoulli(p).

``--out DIR`` receives (replacing this script's own earlier files there): ``train.parquet`` (or
``train/part-NNNNN.parquet`` with ``--files N``), ``eval.parquet``, ``spec.yaml`` and
``truth.json``: the settings, the bias, the base rates, and what no model can beat on this data in
expectation: the AUC and logloss of the true ``p`` on the eval rows (``bayes_auc_empirical``,
``bayes_logloss``) and the AUC expected given those ``p`` (``bayes_auc_expected``, ``expected_auc``).

Rows come in fixed chunks, each from its own seeded stream: the same settings give the same rows
whatever ``--files`` and ``--rows-per-group``, and a longer split starts with the rows of a shorter
one. The eval rows do not depend on ``--train-rows``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rec.errors import InputError, Problem
from rec.evaluation.auc import auc as exact_auc
from rec.exit_codes import ExitCode
from rec.spec import Spec, spec_from_rows, write_spec

TRUTH_FORMAT = "shardflow.ctr_truth/v1"
CHUNK_ROWS = 1 << 16  # rows per random stream: fixed, so that the file layout never changes the rows
CALIBRATION_ROWS = 1 << 18  # rows on which the bias is solved for the base rate
DENSE_DISTRIBUTIONS = ("normal", "uniform")

# The spawn keys of the random streams (numpy SeedSequence): each part of the data has its own.
_TABLE, _DENSE, _CALIBRATION, _TRAIN, _EVAL = range(5)


@dataclass(frozen=True)
class CtrSettings:
    """Everything the data depends on: the planted model's shape and the sizes written."""

    tables: int = 8
    rows: int = 10_000  # num_embeddings of every table
    dim: int = 16  # embedding_dim written to the spec (the planted model has one weight per row)
    pooling: float = 2.0  # mean ids per bag (Poisson), the spec's pooling_factor
    features_per_table: int = 1
    dense_in_features: int = 13
    dense_dist: str = "normal"  # normal: N(0, 1); uniform: U[0, 1)
    zipf: float = 1.7  # id skew: a row of popularity rank k is drawn with weight (k + 1) ** -zipf; 0: uniform
    sigma: float = 0.31  # std of a row's weight
    dense_sigma: float = 0.17  # std of a dense feature's weight
    base_rate: float = 0.25  # the mean click probability the bias is solved for
    seed: int = 0
    train_rows: int = 200_000
    eval_rows: int = 50_000
    files: int = 1  # train files: 1 writes train.parquet, more write train/part-NNNNN.parquet
    rows_per_group: int = 32_768  # Parquet row group size of every file

    @property
    def features(self) -> int:
        return self.tables * self.features_per_table


def settings_problems(s: CtrSettings) -> list[Problem]:
    """Every setting out of its range, at once."""
    checks = [
        ("--tables", s.tables >= 1, "at least 1"),
        ("--rows", s.rows >= 1, "at least 1"),
        ("--dim", s.dim >= 4 and s.dim % 4 == 0, "a positive multiple of 4"),
        ("--pooling", math.isfinite(s.pooling) and s.pooling > 0, "a number above 0"),
        ("--features-per-table", s.features_per_table >= 1, "at least 1"),
        ("--dense-in-features", s.dense_in_features >= 1, "at least 1"),
        ("--dense-dist", s.dense_dist in DENSE_DISTRIBUTIONS, f"one of {', '.join(DENSE_DISTRIBUTIONS)}"),
        ("--zipf", math.isfinite(s.zipf) and 0 <= s.zipf <= 10, "between 0 and 10"),
        ("--sigma", math.isfinite(s.sigma) and s.sigma >= 0, "a number of at least 0"),
        ("--dense-sigma", math.isfinite(s.dense_sigma) and s.dense_sigma >= 0, "a number of at least 0"),
        ("--base-rate", 0.001 <= s.base_rate <= 0.999, "between 0.001 and 0.999"),
        ("--seed", s.seed >= 0, "at least 0"),
        ("--train-rows", s.train_rows >= 1, "at least 1"),
        ("--eval-rows", s.eval_rows >= 2, "at least 2"),
        ("--files", 1 <= s.files <= s.train_rows, "between 1 and --train-rows"),
        ("--rows-per-group", s.rows_per_group >= 1, "at least 1"),
    ]
    return [Problem(flag, f"must be {what}") for flag, ok, what in checks if not ok]


@dataclass(frozen=True, eq=False)
class PlantedModel:
    """The model the labels are drawn from: one weight per table row and per dense feature."""

    weights: tuple[np.ndarray, ...]  # per table: float64 (rows,), what each id adds to the logit
    ranked_ids: tuple[np.ndarray, ...]  # per table: int64 (rows,), the id of popularity rank k
    cdf: np.ndarray  # float64 (rows,): cumulative draw probability of the popularity ranks
    feature_tables: tuple[int, ...]  # per feature: its table
    dense_weights: np.ndarray  # float64 (dense_in_features,)
    bias: float


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def planted_model(s: CtrSettings) -> PlantedModel:
    """The planted model of ``s``: its weights from the seed, its bias solved for ``s.base_rate``."""
    popularity = np.arange(1, s.rows + 1, dtype=np.float64) ** -s.zipf
    popularity /= popularity.sum()
    weights, ranked = [], []
    for t in range(s.tables):
        rng = _rng(s.seed, _TABLE, t)
        w = rng.standard_normal(s.rows)
        ids = rng.permutation(s.rows).astype(np.int64)
        # The hot rows' few draws would set the signal's strength: scale it to sigma for every seed.
        w *= s.sigma / max(math.sqrt(float(popularity @ w[ids] ** 2)), 1e-12)
        weights.append(w)
        ranked.append(ids)
    v = _rng(s.seed, _DENSE).standard_normal(s.dense_in_features)
    dense_weights = v * (s.dense_sigma / max(math.sqrt(float(np.mean(v**2))), 1e-12))
    unbiased = PlantedModel(tuple(weights), tuple(ranked), np.cumsum(popularity),
                            tuple(f // s.features_per_table for f in range(s.features)), dense_weights, 0.0)
    _, _, z = draw_rows(unbiased, s, _rng(s.seed, _CALIBRATION), CALIBRATION_ROWS)
    bias = solve_bias(z, s.base_rate)
    return PlantedModel(unbiased.weights, unbiased.ranked_ids, unbiased.cdf, unbiased.feature_tables,
                        dense_weights, bias)


def solve_bias(logits: np.ndarray, rate: float) -> float:
    """The ``b`` with ``mean(sigmoid(logits + b)) == rate`` (bisection: the mean rises with ``b``)."""
    lo, hi = -60.0, 60.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sigmoid(logits + mid).mean() < rate else (lo, mid)
    return (lo + hi) / 2


def sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


Bag = tuple[np.ndarray, np.ndarray]  # one feature's bags: offsets int (n + 1,), ids int64


def logits(model: PlantedModel, dense: np.ndarray, bags: Sequence[Bag]) -> np.ndarray:
    """Each row's true logit: the bias, its ids' row weights summed over every bag, ``dense . v``."""
    z = dense.astype(np.float64) @ model.dense_weights + model.bias
    n = len(z)
    for table, (offsets, ids) in zip(model.feature_tables, bags, strict=True):
        row = np.repeat(np.arange(n), np.diff(offsets))
        z += np.bincount(row, weights=model.weights[table][ids], minlength=n)
    return z


def draw_rows(model: PlantedModel, s: CtrSettings, rng: np.random.Generator,
              n: int) -> tuple[np.ndarray, list[Bag], np.ndarray]:
    """``n`` rows of features from ``rng``: dense float32 (n, D), each feature's bags, the logits."""
    bags: list[Bag] = []
    for table in model.feature_tables:
        lengths = rng.poisson(s.pooling, n)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ranks = np.searchsorted(model.cdf, rng.random(int(offsets[-1])), side="right")
        bags.append((offsets, model.ranked_ids[table][np.minimum(ranks, s.rows - 1)]))
    shape = (n, s.dense_in_features)
    dense = (rng.standard_normal(shape, np.float32) if s.dense_dist == "normal"
             else rng.random(shape, np.float32))
    return dense, bags, logits(model, dense, bags)


def draw_chunk(model: PlantedModel, s: CtrSettings, rng: np.random.Generator, n: int) -> tuple[pa.Table, np.ndarray]:
    """``n`` labelled rows as an Arrow table in the training layout, and their true ``p``."""
    dense, bags, z = draw_rows(model, s, rng, n)
    p = sigmoid(z)
    labels = (rng.random(n) < p).astype(np.float32)
    columns = {"label": pa.array(labels),
               "dense": pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), s.dense_in_features)}
    for name, (offsets, ids) in zip(feature_names(s), bags, strict=True):
        columns[name] = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids))
    return pa.table(columns), p


def table_probabilities(model: PlantedModel, s: CtrSettings, table: pa.Table) -> np.ndarray:
    """The true ``p`` of rows read back from the written files (``table`` holds their columns)."""
    dense_column = table.column("dense").combine_chunks()
    dense = dense_column.flatten().to_numpy().reshape(-1, s.dense_in_features)
    bags: list[Bag] = []
    for name in feature_names(s):
        column = table.column(name).combine_chunks()
        offsets = column.offsets.to_numpy().astype(np.int64)
        bags.append((offsets - offsets[0], column.flatten().to_numpy()))
    return sigmoid(logits(model, dense, bags))


def feature_names(s: CtrSettings) -> list[str]:
    return [f"cat_{f}" for f in range(s.features)]


def table_spec(s: CtrSettings) -> Spec:
    """The tables the data's ids index: ``table_T`` read by features ``cat_F``."""
    names = feature_names(s)
    k = s.features_per_table
    return spec_from_rows([
        {"name": f"table_{t}", "num_embeddings": s.rows, "embedding_dim": s.dim,
         "feature_names": names[t * k:(t + 1) * k], "pooling_factor": s.pooling}
        for t in range(s.tables)
    ], source="make_ctr_data")


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC AUC (``rec.evaluation.auc``: ties count 1/2); ValueError without both labels or with a NaN."""
    value = None if np.isnan(np.asarray(scores, np.float64)).any() else exact_auc(scores, labels)
    if value is None:
        raise ValueError("AUC needs both labels present and no NaN score")
    return value


def expected_auc(p: np.ndarray) -> float:
    """The AUC that ``p`` as a score is expected to reach when each label is Bernoulli(``p_i``).

    With ``q = 1 - p`` and pairs ``i != j`` (``i`` the positive, ``j`` the negative):

        E[AUC] ~= sum p_i q_j ([p_i > p_j] + [p_i == p_j] / 2) / (sum_i p_i * sum_j q_j - sum_i p_i q_i)

    the expected count of correctly ordered positive-negative pairs over the expected count of such
    pairs (a ratio of expectations: it differs from the expected ratio by O(1/n)). Sorting by ``p``
    makes each ``i``'s sum over ``j`` a prefix sum of ``q``: O(n log n).
    """
    p = np.asarray(p, np.float64)
    q = 1.0 - p
    order = np.argsort(p, kind="stable")
    ps, qs = p[order], q[order]
    first = np.r_[True, ps[1:] != ps[:-1]]
    group = np.cumsum(first) - 1
    tied = np.bincount(group, weights=qs)  # sum of q over each run of equal p
    below = np.cumsum(tied) - tied  # sum of q over strictly smaller p
    pairs = float(ps @ (below[group] + (tied[group] - qs) / 2))
    return pairs / (float(p.sum()) * float(q.sum()) - float(p @ q))


def auc_stderr(value: float, n_pos: int, n_neg: int) -> float:
    """Hanley and McNeil's standard error of an AUC of ``value`` on ``n_pos`` and ``n_neg`` rows."""
    q1, q2 = value / (2 - value), 2 * value**2 / (1 + value)
    variance = (value * (1 - value) + (n_pos - 1) * (q1 - value**2) + (n_neg - 1) * (q2 - value**2))
    return math.sqrt(max(variance, 0.0) / (n_pos * n_neg))


def logloss(p: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities ``p`` against 0/1 ``labels`` (natural log)."""
    p = np.clip(np.asarray(p, np.float64), 1e-15, 1 - 1e-15)
    y = np.asarray(labels, np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())


def expected_logloss(p: np.ndarray) -> float:
    """The logloss that ``p`` is expected to reach when each label is Bernoulli(``p_i``): its mean entropy."""
    return logloss(p, p)


class RowStream:
    """A split's rows in order, drawn chunk by chunk, handed out in runs of any length."""

    def __init__(self, model: PlantedModel, s: CtrSettings, split: int, n: int, keep: bool = False) -> None:
        self._chunks = self._draw(model, s, split, n)
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self._keep = keep
        self.p: list[np.ndarray] = []  # with ``keep``: every chunk's true p and labels
        self.labels: list[np.ndarray] = []
        self.positives = 0

    @staticmethod
    def _draw(model: PlantedModel, s: CtrSettings, split: int, n: int) -> Iterator[tuple[pa.Table, np.ndarray]]:
        for c, start in enumerate(range(0, n, CHUNK_ROWS)):
            # Whole chunks, the last one cut: a split's first rows never depend on its length.
            table, p = draw_chunk(model, s, _rng(s.seed, split, c), CHUNK_ROWS)
            rows = min(CHUNK_ROWS, n - start)
            yield table.slice(0, rows), p[:rows]

    def take(self, n: int) -> pa.Table:
        while self._buffered < n:
            table, p = next(self._chunks)
            labels = table.column("label").to_numpy()
            self.positives += int(labels.sum())
            if self._keep:
                self.p.append(p)
                self.labels.append(labels)
            self._buffer.append(table)
            self._buffered += len(table)
        rows = pa.concat_tables(self._buffer)
        rest = rows.slice(n)
        self._buffer, self._buffered = ([rest] if len(rest) else []), len(rest)
        return rows.slice(0, n)


def write_split(rows: RowStream, paths: Sequence[Path], n: int, rows_per_group: int) -> None:
    """``n`` rows of ``rows`` into ``paths``, split evenly, in row groups of ``rows_per_group``."""
    bounds = [n * i // len(paths) for i in range(len(paths) + 1)]
    for path, (start, end) in zip(paths, pairwise(bounds), strict=True):
        writer: pq.ParquetWriter | None = None
        for first in range(start, end, rows_per_group):
            group = rows.take(min(rows_per_group, end - first))
            writer = writer or pq.ParquetWriter(path, group.schema, compression="lz4")  # decodes ~2x snappy's speed
            writer.write_table(group, row_group_size=len(group))
        if writer is not None:
            writer.close()


def train_paths(out: Path, files: int) -> list[Path]:
    if files == 1:
        return [out / "train.parquet"]
    return [out / "train" / f"part-{i:05d}.parquet" for i in range(files)]


@dataclass(frozen=True)
class Split:
    """One written split: its rows, its files (relative to ``--out``) and its share of clicks."""

    rows: int
    files: tuple[str, ...]
    base_rate: float


@dataclass(frozen=True)
class Truth:
    """What truth.json holds: the planted model's settings and bias, and the best scores on eval."""

    settings: CtrSettings
    bias: float
    dense_weights: tuple[float, ...]
    feature_tables: dict[str, str]  # feature name -> table name
    train: Split
    eval: Split
    eval_mean_p: float
    bayes_auc_expected: float  # expected_auc of the eval rows' true p
    bayes_auc_empirical: float | None  # auc of the true p on the eval labels (None: one label only)
    bayes_auc_stderr: float  # Hanley-McNeil, at the expected AUC and the eval label counts
    bayes_logloss: float  # logloss of the true p on the eval labels
    bayes_logloss_expected: float  # its expectation given p: the mean entropy of p
    constant_logloss: float  # logloss on eval of the train base rate as every prediction

    def to_json(self) -> dict[str, object]:
        return {"format": TRUTH_FORMAT, "seed": self.settings.seed, "base_rate": self.settings.base_rate,
                "logit": LOGIT, **asdict(self)}


LOGIT = "bias + sum over features of the sum of the row weights of its ids + dense . dense_weights"


def generate(s: CtrSettings, out: Path) -> Truth:
    """Write the train and eval data, spec.yaml and truth.json of ``s`` to ``out``; return the truth."""
    problems = settings_problems(s)
    if problems:
        raise InputError("Invalid settings", problems)
    model = planted_model(s)
    spec = table_spec(s)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [out / "train.parquet", *sorted((out / "train").glob("part-*.parquet"))]:
        stale.unlink(missing_ok=True)
    paths = train_paths(out, s.files)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    train = RowStream(model, s, _TRAIN, s.train_rows)
    write_split(train, paths, s.train_rows, s.rows_per_group)
    held_out = RowStream(model, s, _EVAL, s.eval_rows, keep=True)
    write_split(held_out, [out / "eval.parquet"], s.eval_rows, s.rows_per_group)
    write_spec(spec, out / "spec.yaml")

    p, labels = np.concatenate(held_out.p), np.concatenate(held_out.labels)
    n_pos = held_out.positives
    train_rate = train.positives / s.train_rows
    bayes_auc = expected_auc(p)
    truth = Truth(
        settings=s,
        bias=model.bias,
        dense_weights=tuple(model.dense_weights.tolist()),
        feature_tables={f: spec.tables[t].name for f, t in zip(feature_names(s), model.feature_tables, strict=True)},
        train=Split(s.train_rows, tuple(str(path.relative_to(out)) for path in paths), train_rate),
        eval=Split(s.eval_rows, ("eval.parquet",), n_pos / s.eval_rows),
        eval_mean_p=float(p.mean()),
        bayes_auc_expected=bayes_auc,
        bayes_auc_empirical=auc(p, labels) if 0 < n_pos < s.eval_rows else None,
        bayes_auc_stderr=auc_stderr(bayes_auc, max(n_pos, 1), max(s.eval_rows - n_pos, 1)),
        bayes_logloss=logloss(p, labels),
        bayes_logloss_expected=expected_logloss(p),
        constant_logloss=logloss(np.full(len(labels), train_rate), labels),
    )
    (out / "truth.json").write_text(json.dumps(truth.to_json(), indent=1) + "\n", encoding="utf-8")
    return truth


def parse_settings(argv: Sequence[str] | None) -> tuple[CtrSettings, Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    d = CtrSettings()
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    flags: list[tuple[str, type, str]] = [
        ("tables", int, "embedding tables"), ("rows", int, "rows (num_embeddings) per table"),
        ("dim", int, "embedding_dim in the spec, a multiple of 4"), ("pooling", float, "mean ids per bag"),
        ("features_per_table", int, "features reading each table"),
        ("dense_in_features", int, "dense features"), ("dense_dist", str, "normal or uniform"),
        ("zipf", float, "id skew exponent (0: uniform)"), ("sigma", float, "std of a row's weight"),
        ("dense_sigma", float, "std of a dense feature's weight"),
        ("base_rate", float, "mean click probability"), ("seed", int, "random seed"),
        ("train_rows", int, "train rows"), ("eval_rows", int, "eval rows"),
        ("files", int, "train files (1: train.parquet; more: train/part-NNNNN.parquet)"),
        ("rows_per_group", int, "Parquet row group size"),
    ]
    for name, kind, text in flags:
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=getattr(d, name),
                            help=f"{text} (default: {getattr(d, name)})")
    args = vars(parser.parse_args(argv))
    out = Path(args.pop("out"))
    return CtrSettings(**args), out


def main(argv: Sequence[str] | None = None) -> int:
    settings, out = parse_settings(argv)
    started = time.perf_counter()
    try:
        truth = generate(settings, out)
    except (InputError, OSError) as e:
        print(f"make_ctr_data: {e}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    empirical = "n/a" if truth.bayes_auc_empirical is None else f"{truth.bayes_auc_empirical:.4f}"
    print(f"wrote {settings.train_rows:,} train and {settings.eval_rows:,} eval rows to {out} in "
          f"{time.perf_counter() - started:.1f} s: Bayes AUC {truth.bayes_auc_expected:.4f} expected, "
          f"{empirical} on eval; Bayes logloss {truth.bayes_logloss:.4f}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
