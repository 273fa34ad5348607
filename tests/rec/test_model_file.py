"""What a checkpoint keeps beside its weights, read back as any file shardflow did not just write:
``model.json`` (the model's settings) and ``data_position.json`` (where the ranks were reading)."""

from __future__ import annotations

import itertools
import json

import pytest

from rec.data.ids import IdsPolicy
from rec.errors import InputError
from rec.spec import spec_from_rows
from rec.train.config import ModelKind, TrainConfig
from rec.train.model_file import dense_part_problems, read_model, record_model

SPEC = spec_from_rows([dict(name="a", num_embeddings=100, embedding_dim=8, feature_names=["f", "g"]),
                       dict(name="b", num_embeddings=7, embedding_dim=16)])


def test_the_model_settings_read_back_as_written_and_build_the_same_model(tmp_path):
    config = TrainConfig(model="auto", dense_in_features=5, dense_arch_layer_sizes=(8, 4), ids=IdsPolicy.HASH)
    record_model(tmp_path, SPEC, config)
    settings, record = read_model(tmp_path)
    assert settings.kind is ModelKind.CONCAT  # auto resolved: two dims
    assert settings.spec == SPEC and settings.ids is IdsPolicy.HASH and settings.dense_in_features == 5
    assert [f["column"] for f in record["features"]] == ["f", "g", "b"]
    built = settings.config()
    assert (built.model, built.dense_arch_layer_sizes, built.ids) == ("concat", (8, 4), IdsPolicy.HASH)


def test_a_resume_with_another_dense_part_is_named_flag_by_flag_and_the_same_one_passes(tmp_path):
    """The ranks once failed to load such weights after launch (exit 1, which Prefect retries)."""
    config = TrainConfig(dense_in_features=5, dense_arch_layer_sizes=(8, 4))
    record_model(tmp_path, SPEC, config)
    assert dense_part_problems(tmp_path, SPEC, TrainConfig(model="concat", dense_in_features=5,
                                                           dense_arch_layer_sizes=(8, 4), ids=IdsPolicy.HASH)) == []
    changed = TrainConfig(dense_in_features=6, dense_arch_layer_sizes=(8, 2), over_arch_layer_sizes=(9, 1))
    problems = {p.where: p.reason for p in dense_part_problems(tmp_path, SPEC, changed)}
    assert set(problems) == {"--dense-in-features", "--dense-arch-layer-sizes", "--over-arch-layer-sizes"}
    assert problems["--over-arch-layer-sizes"].startswith("9 1, but the checkpoint's model was trained with 64 1")
    assert "shardflow's model, not of --model's" in dense_part_problems(
        tmp_path, SPEC, TrainConfig(model="my.py:model")).pop().reason
    assert dense_part_problems(tmp_path / "elsewhere", SPEC, changed) == []  # no model.json: the user's model


@pytest.mark.parametrize(("edit", "reason"), [
    (lambda r: r.update(features=list(reversed(r["features"]))), "features: does not match the tables"),
    (lambda r: r.update(model="auto"), "must be a resolved model kind"),
    (lambda r: r.update(format="shardflow.model/v9"), "not a model shardflow wrote"),
    (lambda r: r.update(dense_in_features=0), "dense_in_features"),
    (lambda r: r.update(ids="truncate"), "ids"),
    (lambda r: r.update(surprise=1), "surprise"),
    (lambda r: r["tables"][0].update(embedding_dim=3), "embedding_dim"),
])
def test_an_edited_or_foreign_model_file_is_refused_naming_the_key(tmp_path, edit, reason):
    record_model(tmp_path, SPEC, TrainConfig())
    path = tmp_path / "model.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(InputError, match="Cannot read the model settings") as refused:
        read_model(tmp_path)
    assert reason in refused.value.render()


def test_a_data_position_shardflow_did_not_write_is_refused(tmp_path):
    pytest.importorskip("torch")
    from rec.train.feed import POSITION_FILE, read_position

    assert read_position(tmp_path) is None  # a checkpoint without one
    (tmp_path / POSITION_FILE).write_text(json.dumps({"format": "shardflow.data_position/v1", "epoch": -1,
                                                      "rows": 3, "world_size": 2, "splits": [[2]]}))
    with pytest.raises(InputError) as refused:
        read_position(tmp_path)
    text = refused.value.render()
    assert "epoch" in text and "splits" in text
    (tmp_path / POSITION_FILE).write_text("not json")
    with pytest.raises(InputError, match="unreadable"):
        read_position(tmp_path)


def test_a_resumed_users_model_reads_on_where_an_unbroken_run_would():
    """Its batches() once started at the first batch again: the resumed iterations trained on what the
    first ones had read. Passed over, or started at ``start=`` where batches() takes it."""
    pytest.importorskip("torch")
    import torch

    from rec.data.layout import DataLayout
    from rec.data.order import Position
    from rec.train.feed import Feed
    from rec.train.user_model import UserModel

    made = []

    class Numbered(int):  # a batch as the pipelines take it: numbered to tell which was read
        def to(self, device, non_blocking=False):
            return self

        def record_stream(self, stream):
            pass

        def pin_memory(self):
            return self

    def plain(rank, world_size, batch_size, device):
        made.append("plain")
        return map(Numbered, range(100))

    def with_start(rank, world_size, batch_size, device, start=0):
        made.append(start)
        return map(Numbered, range(start, 100))

    for batches in (plain, with_start):
        feed = Feed(None, DataLayout.of_spec(SPEC, 5), True, 8, Position(2), user=UserModel(None, batches, "m.py:f"))
        note = feed.resume_at(30, None, 2)
        assert list(itertools.islice(feed.batches(0, 2, torch.device("cpu"), 2), 3)) == [30, 31, 32]
        assert (note is None) == (batches is with_start)
    assert made == ["plain", 30]  # with start=, nothing made and passed over
    fresh = Feed(None, DataLayout.of_spec(SPEC, 5), True, 8, Position(2), user=UserModel(None, plain, "m.py:f"))
    assert "passing over the first 30 batches of m.py:f's batches" in (fresh.resume_at(30, None, 2) or "")


def test_a_rank_resuming_on_synthetic_batches_a_checkpoint_of_a_dataset_refuses():
    """The ranks' own check (a restart, or a launch past shardflow's checks): a checkpoint whose
    training read files is not continued on synthetic batches; one of synthetic batches is."""
    from rec.train.feed import Feed

    def saved(dataset):
        return {"format": "shardflow.data_position/v2", "epoch": 0, "rows": 0, "world_size": 2, "splits": [],
                "seed": 0, "shuffle": True, "window": 65536, "dataset": dataset, "stamp": "s"}

    feed = Feed.of(SPEC, TrainConfig(dense_in_features=5), 2, 8)
    with pytest.raises(InputError, match="without its data") as refused:
        feed.resume_at(30, saved("3f2a0c"), 2)
    assert refused.value.problems[0].where == "--data"
    assert feed.resume_at(30, {**saved("synthetic"), "shuffle": None, "window": None}, 2) is None


def test_checkpoints_of_a_users_model_say_so_and_need_its_model_to_resume(tmp_path):
    """A training of one's own model left shardflow's earlier model.json in place (its own resume was
    refused, eval and export misread its checkpoints), and its checkpoints resumed with shardflow's model
    failed after launch (exit 1, retried)."""
    from rec.train.model_file import record_target, target_of

    record_model(tmp_path, SPEC, TrainConfig())
    record_target(tmp_path, "m/models.py:two_tower")  # the next training's, in the same folder
    assert target_of(tmp_path) == "m/models.py:two_tower"
    assert dense_part_problems(tmp_path, SPEC, TrainConfig(model="m/models.py:two_tower")) == []
    (problem,) = dense_part_problems(tmp_path, SPEC, TrainConfig())
    assert problem.where == "--model" and "resume with --model m/models.py:two_tower" in problem.reason
    with pytest.raises(InputError, match="Cannot read the model settings") as refused:
        read_model(tmp_path)  # eval and export
    assert "of a model of your own (m/models.py:two_tower)" in refused.value.render()
    record_model(tmp_path, SPEC, TrainConfig())  # shardflow's model trained there again
    assert target_of(tmp_path) is None and read_model(tmp_path)[0].spec == SPEC
