"""Weighted features (TorchRec's id-score lists, ``is_weighted``) from data to trained model: the
``<feature>_weights`` column is read, checked and fed to the weighted modules' KeyedJaggedTensors
only; a model trained on data whose label only the weights carry learns it; synthetic batches and the
measuring job's draw weights too. In one process (gloo, world size 1)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.data.ids import IdsPolicy
from rec.data.layout import DataLayout
from rec.errors import InputError
from rec.planning import plan_spec
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict
from rec.train.config import ModelKind, TrainConfig
from tests.rec.test_training_data import Output

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

WEIGHTED, PLAIN = "ads.weighted", "user.ebc"
ROWS = [
    dict(name="topic", num_embeddings=8, embedding_dim=8, module=WEIGHTED, is_weighted=True),
    dict(name="kw", num_embeddings=50, embedding_dim=8, module=WEIGHTED, is_weighted=True, pooling_factor=2.0),
    dict(name="user", num_embeddings=100, embedding_dim=8, module=PLAIN),
    # The weighted module's feature ``kw`` read by an unweighted module too: its weights are not fed there.
    dict(name="kw", num_embeddings=50, embedding_dim=8, module=PLAIN),
]
SPEC = spec_from_rows(ROWS)
LAYOUT = DataLayout.of_spec(SPEC, 2)
TOPOLOGY = topology_from_dict(dict(world_size=1, compute_device="cpu", ddr_cap="4GiB", batch_size=64))


def unweighted_spec():
    return spec_from_rows([{k: v for k, v in r.items() if k != "is_weighted"} for r in ROWS])


def rows(n: int, seed: int) -> pa.Table:
    """Samples whose label is 1 exactly when the weight of their one ``topic`` id is above 0.5; the ids
    themselves, ``kw``, ``user`` and dense say nothing of it. Only a model that reads weights can tell."""
    rng = np.random.default_rng(seed)
    topic_weight = 1 - rng.random(n)
    kw_count = rng.integers(0, 4, n)
    kw = [rng.integers(0, 50, k).tolist() for k in kw_count]
    return pa.table({
        "label": (topic_weight > 0.5).astype(np.float32),
        "dense": pa.array(rng.random((n, 2)).tolist(), pa.list_(pa.float32())),
        "topic": pa.array(rng.integers(0, 8, (n, 1)).tolist(), pa.list_(pa.int64())),
        "topic_weights": pa.array(topic_weight[:, None].tolist(), pa.list_(pa.float64())),
        "kw": pa.array(kw, pa.list_(pa.int64())),
        "kw_weights": pa.array([rng.random(k).tolist() for k in kw_count], pa.list_(pa.float32())),
        "user": pa.array(rng.integers(0, 100, (n, 1)).tolist(), pa.list_(pa.int64())),
    })


def test_a_weighted_modules_batch_carries_the_files_weights_and_only_it(tmp_path):
    from rec.data.order import Position
    from rec.data.source import Reading, open_source
    from rec.train.batch import ModuleBatch
    from rec.train.input import to_batch

    table = rows(5, seed=0)
    pq.write_table(table, tmp_path / "d.parquet")
    assert set(LAYOUT.columns) == set(table.column_names)  # the weights columns are read, and nothing else
    source = open_source(str(tmp_path / "d.parquet"), SPEC, LAYOUT, Reading(shuffle=False))
    batch = to_batch(next(source.batches(Position(1), 0, 5)), source.layout, one_module=False)
    assert isinstance(batch, ModuleBatch)
    weighted, plain = batch.sparse_features[WEIGHTED], batch.sparse_features[PLAIN]
    assert weighted.weights().dtype == torch.float32
    features = weighted.to_dict()
    for feature in ("topic", "kw"):
        expected = np.concatenate(table.column(f"{feature}_weights").to_pylist()).astype(np.float32)
        assert np.array_equal(features[feature].weights().numpy(), expected), feature
        assert features[feature].values().tolist() == [i for ids in table.column(feature).to_pylist() for i in ids]
    assert plain.weights_or_none() is None and plain.keys() == ["user", "kw"]


def test_every_bad_weights_column_is_named_with_its_count_and_first_row(tmp_path):
    from rec.data.columns import from_arrow
    from rec.data.schema import data_problems

    table = rows(12, seed=1)
    kw, kw_weights = table.column("kw").to_pylist(), table.column("kw_weights").to_pylist()
    kw[3], kw_weights[3] = [1, 2], [0.5]  # one weight for two ids
    kw[7], kw_weights[7] = [4], [float("nan")]
    kw[9], kw_weights[9] = None, None  # an empty bag: no weights needed
    topic_weights = table.column("topic_weights").to_pylist()
    topic_weights[5] = None  # a row with an id and no weights
    bad = replaced(table, kw=pa.array(kw, pa.list_(pa.int64())),
                   kw_weights=pa.array(kw_weights, pa.list_(pa.float32())),
                   topic_weights=pa.array(topic_weights, pa.list_(pa.float64())))
    pq.write_table(bad, tmp_path / "bad.parquet")
    problems = [(p.where, p.reason) for p in data_problems(str(tmp_path / "bad.parquet"), LAYOUT, IdsPolicy.ERROR)]
    assert [where for where, _ in problems] == ["--data column 'topic_weights'", "--data column 'kw_weights'",
                                                "--data column 'kw_weights'"]
    assert problems[0][1].startswith("1 null list for rows with ids in 12 rows read, first at row 5 of ")
    assert problems[1][1].startswith("1 of 12 rows read do not hold one weight per id of 'kw', first 1 weight "
                                     "for 2 ids at row 3 of ")
    assert problems[2][1].startswith("1 weight not finite as float32 (NaN, infinite, or beyond +-3.4e38) in 12 "
                                     "rows read, first nan at row 7 of ")
    # A missing or mistyped weights column is named before any row is read ...
    no_topic_weights = table.drop(["topic_weights"])
    pq.write_table(replaced(no_topic_weights, kw_weights=pa.array([["x"]] * 12)), tmp_path / "t.parquet")
    problems = [(p.where, p.reason) for p in data_problems(str(tmp_path / "t.parquet"), LAYOUT, IdsPolicy.ERROR)]
    assert problems[0] == ("--data", "has no column 'topic_weights' (the data needs label, dense and one column of "
                                     "ids per feature name, and one column <feature>_weights per feature of a "
                                     "weighted table: docs/training.md)")
    assert problems[1][0] == "--data column 'kw_weights'" and problems[1][1].startswith("is list<element: string>;")
    # ... and a rank reading rows without one says so too.
    with pytest.raises(InputError, match=r"column 'topic_weights': is missing: weighted feature 'topic' needs"):
        from_arrow(no_topic_weights, LAYOUT, IdsPolicy.ERROR, lambda row: f"row {row}")


def replaced(table: pa.Table, **columns: pa.Array) -> pa.Table:
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, values)
    return table


def test_a_feature_named_as_a_weighted_features_weights_column_is_refused(tmp_path):
    from rec.data.schema import data_problems

    clash = spec_from_rows([*ROWS, dict(name="extra", num_embeddings=10, embedding_dim=8, feature_names=["kw_weights"],
                                        module=PLAIN)])
    pq.write_table(rows(4, seed=2), tmp_path / "d.parquet")
    (problem,) = data_problems(str(tmp_path / "d.parquet"), DataLayout.of_spec(clash, 2), IdsPolicy.ERROR)
    assert str(problem) == ("--data column 'kw_weights': would hold both the ids of feature 'kw_weights' (table "
                            "extra) and the weights of weighted feature 'kw' (table kw); rename one of these "
                            "features in the spec")


def trained_on_files(tmp_path, spec, samples, **settings):
    """``spec``'s model trained in this process on ``rows`` files (training, evaluation: ``samples``
    rows each, seeds 3 and 4) under ``tmp_path``: its metrics."""
    from rec.plan import read_plan, write_plan
    from rec.train.job import train

    pq.write_table(rows(samples[0], seed=3), tmp_path / "train.parquet", row_group_size=500)
    pq.write_table(rows(samples[1], seed=4), tmp_path / "eval.parquet")
    write_plan(plan_spec(spec, TOPOLOGY), tmp_path / "plan")
    plan_path = str(tmp_path / "plan" / "plan.json")
    config = TrainConfig(model=ModelKind.CONCAT, data=str(tmp_path / "train.parquet"),
                         eval_data=str(tmp_path / "eval.parquet"), dense_in_features=2, embedding_lr=0.1,
                         dense_lr=0.05, **settings)
    metrics = train(read_plan(plan_path), config, str(tmp_path / "out"), Output(), plan_path)
    assert metrics is not None and metrics.eval is not None
    return metrics


def test_a_model_trained_on_weights_that_alone_carry_the_label_learns_them(single_process_group, tmp_path):
    """The label is the weight of the sample's ``topic`` id above 0.5: a model blind to weights
    cannot beat an AUC of 0.5 (the same training of the spec without ``is_weighted``: 0.51)."""
    metrics = trained_on_files(tmp_path, SPEC, (2000, 1000), iterations=30, warmup=2, shuffle_window=256)
    assert metrics.eval["auc"] > 0.9, metrics.eval
    assert metrics.eval["samples"] == 1000 and np.isfinite(metrics.loss.last)
    assert set(metrics.applied_sharding) == {f"{WEIGHTED}.topic", f"{WEIGHTED}.kw", f"{PLAIN}.user", f"{PLAIN}.kw"}


def test_the_sparse_dist_pipeline_feeds_the_sharded_weighted_module_its_weights(single_process_group):
    """Synthetic batches (weights in (0, 1]) through TorchRec's pipelined training of the sharded model."""
    from torchrec.distributed.types import ShardedModule

    from rec.train.config import PipelineKind
    from rec.train.job import model_and_feed, shard_with_plan
    from rec.train.loop import pipeline_step

    device, plan = torch.device("cpu"), plan_spec(SPEC, TOPOLOGY)
    config = TrainConfig(dense_in_features=2, pipeline=PipelineKind.SPARSE_DIST)
    model, feed = model_and_feed(plan, SPEC, config, device, 1, 64)
    dmp, optimizer = shard_with_plan(model, plan, config, device)
    step = pipeline_step(dmp, optimizer, device, feed.batches(0, 1, device, 2), config.pipeline)
    losses = [float(step.run()) for _ in range(4)]
    assert all(np.isfinite(losses)) and len(set(losses)) > 1
    sharded = {name: m for name, m in dmp.module.named_modules() if isinstance(m, ShardedModule)}
    assert set(sharded) == {WEIGHTED, PLAIN} and all(m.is_pipelined for m in sharded.values())


def test_one_weighted_default_bag_collection_pools_each_id_times_its_weight():
    """A spec without modules (TorchRec's DLRM, fed TorchRec's ``Batch``), weighted: synthetic batches
    carry weights in (0, 1], and a SUM bag is the weighted sum of its rows."""
    from torchrec.datasets.utils import Batch

    from rec.data.order import Position
    from rec.data.synthetic import SyntheticSource
    from rec.train.input import to_batch
    from rec.train.model import EBC_PATH, build_model

    spec = spec_from_rows([dict(name="a", num_embeddings=30, embedding_dim=4, is_weighted=True, pooling_factor=3.0),
                           dict(name="b", num_embeddings=20, embedding_dim=4, is_weighted=True,
                                feature_names=["b1", "b2"])])
    model = build_model(spec, TrainConfig(dense_in_features=3), torch.device("cpu"), "cpu")
    ebc = model.get_submodule(EBC_PATH)
    assert ebc.is_weighted()
    source = SyntheticSource(spec, 3, seed=0, distinct=1)
    batch = to_batch(next(source.batches(Position(1), 0, 16)), source.layout, one_module=True)
    assert isinstance(batch, Batch)
    kjt = batch.sparse_features
    weights = kjt.weights()
    assert weights.dtype == torch.float32 and weights.shape == kjt.values().shape
    assert bool(((weights > 0) & (weights <= 1)).all())
    loss, _ = model(batch)
    assert torch.isfinite(loss)
    pooled = ebc(kjt).to_dict()
    table = ebc.embedding_bags["a"].weight.detach()
    a = kjt.to_dict()["a"]
    expected = torch.stack([(table[ids] * w[:, None]).sum(0) for ids, w in
                            zip(a.values().split(a.lengths().tolist()), a.weights().split(a.lengths().tolist()),
                                strict=True)])
    assert torch.allclose(pooled["a"].detach(), expected, atol=1e-6)


def test_the_measuring_jobs_weighted_modules_get_a_weight_per_id(single_process_group):
    from rec.train import measure_job
    from rec.train.collectives import Group
    from rec.train.measure_config import MeasureConfig
    from rec.train.synthetic_pool import batch_bytes
    from rec.train.timings import Status

    made = measure_job.synthetic_features(SPEC, 32, seed=0, distinct=2, device=torch.device("cpu"))
    for _ in range(2):
        batch = next(made)
        weighted, plain = batch[WEIGHTED], batch[PLAIN]
        assert weighted.weights().dtype == torch.float32 and weighted.weights().shape == weighted.values().shape
        assert bool(((weighted.weights() > 0) & (weighted.weights() <= 1)).all())
        assert weighted.stride() == 32 and sum(weighted.length_per_key()) == len(weighted.values())
        assert plain.weights_or_none() is None
    plan = plan_spec(SPEC, TOPOLOGY)
    unweighted = plan_spec(unweighted_spec(), TOPOLOGY)
    # 4 bytes per weighted id: topic's 1 and kw's 2 per sample
    assert batch_bytes(plan) - batch_bytes(unweighted) == pytest.approx(64 * 4 * (1 + 2))
    config = MeasureConfig(iterations=2, warmup=1, blocks=1, synthetic_batches=2)
    (measured,) = measure_job.measure_plans(["p"], [plan], config, Output(), Group.current())
    assert measured.status is Status.MEASURED and measured.iterations == 2


def test_model_json_names_the_weights_and_a_user_model_must_be_weighted_as_planned(tmp_path):
    from torch import nn

    from rec.spec.torchrec_modules import embedding_modules, place
    from rec.train.model_file import read_model, record_model
    from rec.train.user_model import model_problems

    config = TrainConfig(dense_in_features=2)
    record_model(tmp_path, SPEC, config)
    settings, record = read_model(tmp_path)
    assert settings.spec == SPEC and settings.layout == LAYOUT
    assert [m.get("weighted", False) for m in record["modules"]] == [True, False]
    assert {f["column"]: f.get("weights") for f in record["features"]} == {
        "topic": "topic_weights", "kw": "kw_weights", "user": None}
    problems = model_problems(place(nn.Module(), embedding_modules(unweighted_spec())), SPEC, "t")
    assert [str(p) for p in problems] == [f"table {WEIGHTED}.{name}: has is_weighted false (planned true) in t"
                                          for name in ("kw", "topic")]


def test_an_exported_model_of_float16_and_mean_weighted_tables_predicts_what_training_evaluated(
        single_process_group, tmp_path):
    """Weighted tables trained as float16, one of them pooled MEAN (FBGEMM: the weighted sum over the
    bag's length): the exported model's predictions on the evaluation rows give the training's own
    evaluation logloss and AUC; TorchRec's unsharded bags take neither as they are."""
    from rec.evaluation.auc import auc
    from rec.evaluation.logloss import logloss
    from rec.train.export import export
    from rec.train.predict import predict

    spec = spec_from_rows([{**r, "data_type": "FP16", **({"pooling": "MEAN"} if r["name"] == "kw" else {})}
                           if r.get("is_weighted") else r for r in ROWS])
    metrics = trained_on_files(tmp_path, spec, (1000, 500), iterations=10, warmup=1, checkpoint_every=10)
    export(tmp_path / "out" / "checkpoints", tmp_path / "model")
    predict(tmp_path / "model", str(tmp_path / "eval.parquet"), tmp_path / "p.parquet", torch.device("cpu"))
    p = pq.read_table(tmp_path / "p.parquet").column("prediction").to_numpy().astype(np.float64)
    labels = pq.read_table(tmp_path / "eval.parquet").column("label").to_numpy()
    assert logloss(np.log(p) - np.log1p(-p), labels) == pytest.approx(metrics.eval["logloss"], rel=1e-5)
    assert auc(p, labels) == pytest.approx(metrics.eval["auc"], abs=1e-6)


def test_a_checkpoint_holding_another_trainings_step_or_plan_is_refused_by_export_naming_why(
        single_process_group, tmp_path):
    """A step directory copied from another model's training (its tables of other sizes), or the
    plan.json of another spec beside the checkpoint: export names the mismatch (exit 2 on the command
    line), where DCP's error once escaped as a traceback and another plan's id labelled the model."""
    import shutil

    from rec.train.export import export

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    trained_on_files(tmp_path / "a", SPEC, (200, 100), iterations=2, warmup=1, checkpoint_every=2)
    other = spec_from_rows([{**r, "num_embeddings": 2 * r["num_embeddings"]} if r["name"] == "user" else r
                            for r in ROWS])
    trained_on_files(tmp_path / "b", other, (200, 100), iterations=2, warmup=1, checkpoint_every=2)
    a, b = (tmp_path / name / "out" / "checkpoints" for name in ("a", "b"))
    (step,) = [p.name for p in a.iterdir() if p.name.startswith("step_")]
    stepped = tmp_path / "stepped"
    shutil.copytree(a, stepped)
    shutil.rmtree(stepped / step)
    shutil.copytree(b / step, stepped / step)
    with pytest.raises(InputError, match=r"table 'user' is 200 x 8 here, 100 x 8 in the model"):
        export(stepped, tmp_path / "m1")
    from tasks.evaluate import evaluate_checkpoint  # named before any rank is launched: exit 2, no retry

    with pytest.raises(InputError, match=r"table 'user' is 200 x 8 here"):
        evaluate_checkpoint(str(stepped), str(tmp_path / "a" / "eval.parquet"), str(tmp_path / "evaluated"))
    planned = tmp_path / "planned"
    shutil.copytree(a, planned)
    shutil.copyfile(b / "plan.json", planned / "plan.json")
    with pytest.raises(InputError, match=r"plans other tables than model\.json records"):
        export(planned, tmp_path / "m2")
    with pytest.raises(InputError, match=r"plans other tables than model\.json records"):
        evaluate_checkpoint(str(planned), str(tmp_path / "a" / "eval.parquet"), str(tmp_path / "evaluated"))
    assert not (tmp_path / "m1").exists() and not (tmp_path / "m2").exists()
    assert export(a, tmp_path / "m3").plan_id
    modes = {p.name: p.stat().st_mode for p in (tmp_path / "m3").iterdir()}  # readable alike
    assert modes["model.safetensors"] == modes["model.json"]


@pytest.mark.parametrize("planted", ["model.json", "LATEST", "step", "step/.metadata", "fifo"])
def test_a_link_or_fifo_inside_a_checkpoint_directory_is_named_before_anything_is_read(
        single_process_group, tmp_path, planted):
    """shardflow follows no link out of a checkpoint directory and opens no FIFO there (a FIFO in place
    of the index once hung export for good): each is named, exit 2 on the command line."""
    import os
    import shutil

    from rec.train.export import export

    (tmp_path / "a").mkdir()
    trained_on_files(tmp_path / "a", SPEC, (200, 100), iterations=2, warmup=1, checkpoint_every=2)
    a = tmp_path / "a" / "out" / "checkpoints"
    (step,) = [p.name for p in a.iterdir() if p.name.startswith("step_")]
    copy, outside = tmp_path / "copy", tmp_path / "outside"
    shutil.copytree(a, copy)
    name = {"step": step, "step/.metadata": f"{step}/.metadata", "fifo": f"{step}/.metadata"}.get(planted, planted)
    shutil.move(copy / name, outside)
    if planted == "fifo":
        os.mkfifo(copy / name)
    else:
        (copy / name).symlink_to(outside)
    with pytest.raises(InputError) as e:
        export(copy, tmp_path / "model")
    assert [p.where for p in e.value.problems] == [str(copy / name)]
    assert ("a FIFO" if planted == "fifo" else "a symbolic link") in e.value.render()
    assert not (tmp_path / "model").exists()
