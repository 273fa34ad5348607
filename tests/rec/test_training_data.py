"""The training job on Parquet data in one process (gloo, world size 1): the data position a
checkpoint keeps makes a resumed training the same model as an unbroken one, evaluation does not
change what is trained, and the model learns a planted signal. Multi-rank runs: tests/flows."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.errors import InputError
from rec.planning import plan_spec
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict
from rec.train.config import PipelineKind, TrainConfig

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

SPEC = spec_from_rows([dict(name="user", num_embeddings=300, embedding_dim=8),
                       dict(name="item", num_embeddings=200, embedding_dim=8, feature_names=["item", "seen"],
                            pooling_factor=2.0)])
TOPOLOGY = topology_from_dict(dict(world_size=1, compute_device="cpu", ddr_cap="4GiB", batch_size=64))


WEIGHTS = {"user": np.random.default_rng(1).normal(0, 1.5, 300), "item": np.random.default_rng(2).normal(0, 1.5, 200)}


class Output:
    """What the job reports, kept (the job's RankOutput writes to the launcher's pipe)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def progress(self, message: str, done: int | None = None, total: int | None = None, force: bool = True) -> None:
        self.lines.append(message)

    def due(self, done: int, total: int) -> bool:
        return False


def planted(n: int, seed: int) -> pa.Table:
    """Rows whose click probability is a sum of per-id weights: a signal a model can learn."""
    rng = np.random.default_rng(seed)
    weights = WEIGHTS
    columns, logit = {}, np.full(n, -1.0)
    for feature, table in (("user", "user"), ("item", "item"), ("seen", "item")):
        ids = (len(weights[table]) * rng.random(n) ** 2).astype(np.int64)
        columns[feature] = pa.array([[int(i)] for i in ids], pa.list_(pa.int64()))
        logit += weights[table][ids]
    labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    dense = rng.random((n, 4), np.float32)
    return pa.table({"label": labels, "dense": [list(map(float, r)) for r in dense], **columns})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    pq.write_table(planted(3000, 0), root / "train.parquet", row_group_size=500)
    pq.write_table(planted(1000, 1), root / "eval.parquet", row_group_size=500)
    return root


@pytest.fixture
def plan_path(tmp_path):
    from rec.plan import write_plan

    write_plan(plan_spec(SPEC, TOPOLOGY), tmp_path / "plan")
    return str(tmp_path / "plan" / "plan.json")


def train(plan_path: str, out: str, config: TrainConfig):
    from rec.plan import read_plan
    from rec.train.job import train as train_job

    output = Output()
    metrics = train_job(read_plan(plan_path), config, out, output, plan_path)  # type: ignore[arg-type]
    losses = pq.read_table(f"{out}/iterations.parquet").column("loss").to_numpy()
    return metrics, losses, output


def config(data, **changes) -> TrainConfig:
    base = TrainConfig(iterations=40, warmup=2, data=str(data / "train.parquet"), dense_in_features=4,
                       embedding_lr=0.1, dense_lr=0.05, shuffle_window=256, eval_data=str(data / "eval.parquet"))
    return replace(base, **changes)


def test_a_resumed_training_is_the_same_model_as_an_unbroken_one(single_process_group, data, plan_path, tmp_path,
                                                                  monkeypatch):
    from rec.train.config import FAIL_AT_ENV

    straight, straight_losses, _ = train(plan_path, str(tmp_path / "a"), config(data, eval_every=10))
    monkeypatch.setenv(FAIL_AT_ENV, "25:0:raise")  # stopped after the checkpoint of iteration 20
    with pytest.raises(RuntimeError, match="injected failure"):
        train(plan_path, str(tmp_path / "b"), config(data, checkpoint_every=10, eval_every=10))
    monkeypatch.delenv(FAIL_AT_ENV)
    resumed, resumed_losses, output = train(plan_path, str(tmp_path / "b"),
                                            config(data, checkpoint_every=10, resume=True, eval_every=10))
    assert resumed.resumed_from == 20 and "resuming from the checkpoint of iteration 20" in output.lines
    assert np.array_equal(resumed_losses, straight_losses)  # every iteration's loss, the ones after the resume too
    assert resumed.eval["logloss"] == pytest.approx(straight.eval["logloss"], rel=1e-5)
    assert resumed.eval["auc"] == straight.eval["auc"]
    # the evaluations before the resume are the training's too (the one of the checkpoint's iteration
    # included): they were dropped, and with them the summary's best evaluation
    assert [e["iteration"] for e in resumed.evaluations] == [e["iteration"] for e in straight.evaluations] == [
        10, 20, 30, 40]
    assert [e["auc"] for e in resumed.evaluations] == [e["auc"] for e in straight.evaluations]
    kept = pq.read_table(tmp_path / "b/iterations.parquet").to_pydict()
    assert [(i + 1, auc) for i, auc in zip(kept["iteration"], kept["eval_auc"], strict=True) if auc is not None] == [
        (e["iteration"], e["auc"]) for e in straight.evaluations]
    position = json.loads((tmp_path / "b/checkpoints/step_00000020/data_position.json").read_text())
    assert (position["epoch"], position["rows"]) == divmod(20 * 64, 3000)  # 20 batches of 64 read
    assert (tmp_path / "b/checkpoints/model.json").is_file()
    assert resumed.data.resumed is None
    (tmp_path / "b/train_metrics.json").unlink()  # as if stopped after its last checkpoint, before its outputs
    finished, finished_losses, _ = train(plan_path, str(tmp_path / "b"),
                                         config(data, checkpoint_every=10, resume=True, eval_every=10))
    assert finished.resumed_from == 40 and np.array_equal(finished_losses, straight_losses)  # finished, not refused
    assert [e["auc"] for e in finished.evaluations] == [e["auc"] for e in straight.evaluations]  # the last one made
    assert finished.iteration_latency_ms == resumed.iteration_latency_ms  # of the iterations it kept
    # as an earlier version wrote it: no eval_* columns, the evaluations only in train_metrics.json
    older = pq.read_table(tmp_path / "b/iterations.parquet")
    pq.write_table(older.select([c for c in older.column_names if not c.startswith("eval_")]),
                   tmp_path / "b/iterations.parquet")
    reordered, _, _ = train(plan_path, str(tmp_path / "b"), config(data, iterations=50, checkpoint_every=10,
                                                                   resume=True, seed=7))
    assert [e["iteration"] for e in reordered.evaluations] == [10, 20, 30, 40, 50]  # the older file's kept too
    assert [e["auc"] for e in reordered.evaluations[:4]] == [e["auc"] for e in straight.evaluations]
    assert reordered.data.resumed == ("the data or its order changed since the checkpoint (seed): reading starts "
                                      "at epoch 1")  # the run says where it read, not only its progress line
    saved = tmp_path / "b/checkpoints/step_00000050/data_position.json"
    edited = json.loads(saved.read_text())
    saved.write_text(json.dumps({**edited, "rows": 10**12}))  # once read on as "50000001 epochs"
    with pytest.raises(InputError, match="data position") as refused:
        train(plan_path, str(tmp_path / "b"), config(data, iterations=60, resume=True, seed=7))
    assert "beyond their share of" in refused.value.render()
    saved.write_text(json.dumps(edited))
    # as the first versions wrote it: no loss, resumed or data_wait_ms column; the rows are kept all the same
    first = pq.read_table(tmp_path / "b/iterations.parquet")
    pq.write_table(first.select(["iteration", "latency_ms", "warmup"]), tmp_path / "b/iterations.parquet")
    longer, longer_losses, output = train(plan_path, str(tmp_path / "b"), config(data, iterations=60, resume=True,
                                                                                  seed=7))
    assert longer.resumed_from == 50 and not [line for line in output.lines if "lost" in line]
    assert len(longer_losses) == 60 and np.isnan(longer_losses[:50]).all() and np.isfinite(longer_losses[50:]).all()
    assert longer.loss.first == longer_losses[50] and longer.loss.mean == pytest.approx(np.mean(longer_losses[50:]))
    (tmp_path / "b/train_metrics.json").unlink()  # stopped before its outputs, finished now: no iteration with a loss
    pq.write_table(first.select(["iteration", "latency_ms", "warmup"]), tmp_path / "b/iterations.parquet")
    with pytest.raises(InputError, match="Cannot summarize") as refused:
        train(plan_path, str(tmp_path / "b"), config(data, iterations=50, resume=True, seed=7))
    assert "give more --iterations" in refused.value.render()
    (tmp_path / "b/iterations.parquet").write_bytes(b"damaged")  # its rows lost: none to summarize either
    with pytest.raises(InputError, match="Cannot summarize") as refused:
        train(plan_path, str(tmp_path / "b"), config(data, iterations=50, resume=True, seed=7))
    assert "the rows before the checkpoint were lost" in refused.value.render()


@pytest.mark.parametrize("pipeline", [PipelineKind.NAIVE, PipelineKind.SPARSE_DIST])
def test_evaluating_during_training_changes_nothing_trained(single_process_group, data, plan_path, tmp_path,
                                                            pipeline):
    quiet, quiet_losses, _ = train(plan_path, str(tmp_path / "a"), config(data, pipeline=pipeline))
    often, often_losses, _ = train(plan_path, str(tmp_path / "b"), config(
        data, pipeline=pipeline, eval_every=15))
    assert np.array_equal(often_losses, quiet_losses)
    assert [e["iteration"] for e in often.evaluations] == [15, 30, 40]
    assert often.eval == {k: v for k, v in often.evaluations[-1].items() if k != "iteration"}
    assert often.eval["samples"] == 1000 and quiet.eval == often.eval


def test_the_model_learns_the_planted_signal_and_the_run_says_what_it_read(single_process_group, data,
                                                                            plan_path, tmp_path):
    metrics, _, _ = train(plan_path, str(tmp_path / "a"), config(data, iterations=150))
    held_out = pq.read_table(data / "eval.parquet")
    best = _bayes_auc(held_out)
    assert metrics.eval["auc"] > 0.9 * best, (metrics.eval, best)
    assert metrics.eval["ne"] < 1.0
    assert metrics.data.rows == 3000 and metrics.data.files == 1
    assert metrics.data.epochs == pytest.approx(150 * 64 / 3000)
    assert metrics.data_wait_ms is not None and metrics.data_wait_ms.p50 >= 0


def _bayes_auc(rows: pa.Table) -> float:
    """The AUC of the true click probabilities on these rows: what no model beats in expectation."""
    from rec.evaluation.auc import auc

    weights = WEIGHTS
    logit = np.full(rows.num_rows, -1.0)
    for feature, table in (("user", "user"), ("item", "item"), ("seen", "item")):
        logit += weights[table][np.array([i[0] for i in rows.column(feature).to_pylist()])]
    result = auc(logit, rows.column("label").to_numpy())
    assert result is not None
    return result


def test_a_training_whose_loss_is_not_finite_stops_saying_so_and_names_no_checkpoint(single_process_group,
                                                                                      data, plan_path, tmp_path):
    """Dense values finite in float32 but too large for the model: the loss and the logits are NaN.
    The run once trained on, wrote NaN into train_metrics.json and then refused its own file, and
    an evaluation reported an AUC of NaN scores."""
    from rec.train.resume import LATEST

    rows = planted(256, 5)
    huge = rows.set_column(rows.schema.get_field_index("dense"), "dense", pa.array([[3e38] * 4] * 256))
    pq.write_table(huge, tmp_path / "huge.parquet")
    with pytest.raises(InputError, match="The training diverged") as stopped:
        train(plan_path, str(tmp_path / "a"), replace(config(data, iterations=4, checkpoint_every=2),
                                                      data=str(tmp_path / "huge.parquet")))
    assert "first at iteration 1:" in stopped.value.render()  # counted as progress counts, from 1
    assert not (tmp_path / "a" / "train_metrics.json").exists() and not (tmp_path / "a/checkpoints" / LATEST).exists()
    with pytest.raises(InputError, match="The model's outputs cannot be evaluated") as refused:
        train(plan_path, str(tmp_path / "b"), config(data, eval_data=str(tmp_path / "huge.parquet"), iterations=4))
    assert "not finite (NaN or infinite) for 256 of 256 samples after iteration 4" in refused.value.render()
    with pytest.raises(InputError, match="The training diverged"):  # not "the outputs cannot be evaluated"
        train(plan_path, str(tmp_path / "c"), replace(config(data, iterations=4, eval_every=2),
                                                      data=str(tmp_path / "huge.parquet")))
