"""shardflow's training model for specs of several embedding modules (EmbeddingBagCollections and
EmbeddingCollections at any paths), its batches, the user-model protocol (``--model TARGET``) and
resuming by table key — in one process (gloo, world size 1); the torchrun runs are in tests/flows."""

from __future__ import annotations

import numpy as np
import pytest

from rec.errors import InputError
from rec.planning import plan_spec
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict
from rec.train.config import ModelKind, PipelineKind, TrainConfig

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from rec.train.batch import ModuleBatch  # noqa: E402
from rec.train.tables import one_default_ebc  # noqa: E402

USER, ITEM, SEQUENCE = "towers.user.ebc", "towers.items.0.ebc", "history.encoder.ec"
ROWS = [
    dict(name="id", num_embeddings=400, embedding_dim=16, module=USER),
    dict(name="geo", num_embeddings=50, embedding_dim=16, pooling="MEAN", module=USER,
         feature_names=["country", "city"], pooling_factor=2.0, data_type="INT8"),
    dict(name="id", num_embeddings=300, embedding_dim=16, module=ITEM),
    # The same table name and feature name as the item tower's, in an EmbeddingCollection.
    dict(name="id", num_embeddings=300, embedding_dim=16, pooling="NONE", module=SEQUENCE, pooling_factor=12.0),
    dict(name="query", num_embeddings=90, embedding_dim=16, pooling="NONE", module=SEQUENCE, pooling_factor=3.0,
         data_type="BF16"),
]
TOPOLOGY = topology_from_dict(dict(world_size=1, compute_device="cpu", ddr_cap="4GiB", batch_size=16))


@pytest.fixture(scope="module")
def spec():
    return spec_from_rows(ROWS)


def shard_and_train(plan, spec, config: TrainConfig, steps: int):
    """What the job does on a rank: build, shard with the plan (the tables' optimizer fused), train."""
    from rec.train.job import model_and_feed, shard_with_plan
    from rec.train.loop import pipeline_step

    device = torch.device("cpu")
    model, feed = model_and_feed(plan, spec, config, device, 1, plan.topology.batch_size)
    dmp, optimizer = shard_with_plan(model, plan, config, device)
    step = pipeline_step(dmp, optimizer, device, feed.batches(0, 1, device, 2), config.pipeline)
    return dmp, [float(step.run()) for _ in range(steps)]


@pytest.mark.parametrize("kind", [ModelKind.AUTO, ModelKind.CONCAT, ModelKind.DLRM_DCN])
def test_every_module_sits_at_its_path_is_sharded_as_planned_and_trains_pipelined(single_process_group, spec, kind):
    from torchrec.distributed.types import ShardedModule

    from rec.train.applied import applied_sharding, applied_tables, differences

    plan = plan_spec(spec, TOPOLOGY)
    dmp, losses = shard_and_train(plan, spec, TrainConfig(model=kind, pipeline=PipelineKind.SPARSE_DIST), steps=6)
    assert all(np.isfinite(losses)) and len(set(losses)) > 1
    assert differences(plan, applied_tables(dmp)) == []
    assert set(applied_sharding(dmp)) == {f"{USER}.id", f"{USER}.geo", f"{ITEM}.id", f"{SEQUENCE}.id",
                                          f"{SEQUENCE}.query"}
    sharded = {name: type(m).__name__ for name, m in dmp.module.named_modules() if isinstance(m, ShardedModule)}
    assert sharded == {USER: "ShardedEmbeddingBagCollection", ITEM: "ShardedEmbeddingBagCollection",
                       SEQUENCE: "ShardedEmbeddingCollection"}
    # TrainPipelineSparseDist found every module's input in the batch: all are pipelined.
    assert all(m.is_pipelined for m in dmp.modules() if isinstance(m, ShardedModule))
    # INT8 and BF16 tables train as float16: the 2 bytes per weight they were planned with.
    weights = dmp.state_dict()
    assert weights[f"{USER}.embedding_bags.geo.weight"].dtype == torch.float16
    assert weights[f"{SEQUENCE}.embeddings.query.weight"].dtype == torch.float16
    assert weights[f"{USER}.embedding_bags.id.weight"].dtype == torch.float32


def test_a_quantized_table_in_the_default_module_trains_as_float16(single_process_group):
    """A spec without ``module`` (TorchRec's DLRM around one EmbeddingBagCollection) of INT8 and BF16 tables."""
    one = spec_from_rows([dict(name="a", num_embeddings=60, embedding_dim=8, data_type="INT8"),
                          dict(name="b", num_embeddings=40, embedding_dim=8, data_type="BF16")])
    assert one_default_ebc(one)
    config = TrainConfig(model=ModelKind.DLRM, pipeline=PipelineKind.SPARSE_DIST)
    dmp, losses = shard_and_train(plan_spec(one, TOPOLOGY), one, config, steps=2)
    weights = {k.rsplit(".", 2)[-2]: v for k, v in dmp.state_dict().items() if k.endswith((".a.weight", ".b.weight"))}
    assert all(np.isfinite(losses)) and {t: w.dtype for t, w in weights.items()} == {"a": torch.float16,
                                                                                      "b": torch.float16}


def test_the_planned_and_the_trained_modules_give_torchrec_the_same_bytes_per_weight():
    """TorchRec's estimators size a table by its unsharded weight's element size: the trained
    modules keep it for every data type, and hand the sharded kernel only FP32 and FP16."""
    from rec.sharding import DataType
    from rec.spec.torchrec_modules import embedding_modules, spec_model

    typed = spec_from_rows([dict(name=t.value, num_embeddings=10, embedding_dim=4, data_type=t.value, module=m,
                                 pooling="NONE" if m == SEQUENCE else "SUM")
                            for t in DataType for m in (USER, SEQUENCE)])
    planned = dict(spec_model(typed).named_parameters())
    for path, module in embedding_modules(typed, trained=True).items():
        configs = module.embedding_bag_configs() if path == USER else module.embedding_configs()
        assert {c.name: c.data_type.value for c in configs} == {t.value: "FP32" if t is DataType.FP32 else "FP16"
                                                                for t in DataType}
        for name, weight in module.named_parameters():
            table = DataType(name.split(".")[-2])
            assert weight.element_size() == planned[f"{path}.{name}"].element_size() == table.bytes_per_element


def test_dlrm_needs_one_dim_and_auto_picks_concat_for_several(spec):
    from rec.train.config import resolve_model_kind
    from rec.train.model import build_model

    wide = spec_from_rows([*ROWS, dict(name="wide", num_embeddings=10, embedding_dim=32, module=ITEM)])
    assert resolve_model_kind(spec, ModelKind.AUTO) is ModelKind.DLRM
    assert resolve_model_kind(wide, ModelKind.AUTO) is ModelKind.CONCAT
    with pytest.raises(InputError, match="one embedding_dim"):
        build_model(wide, TrainConfig(model=ModelKind.DLRM), torch.device("cpu"))


def test_a_spec_without_modules_still_trains_torchrecs_dlrm_on_torchrecs_batch():
    from torchrec.datasets.utils import Batch
    from torchrec.models.dlrm import DLRMTrain

    from rec.train.model import EBC_PATH, build_model

    legacy = spec_from_rows([dict(name="a", num_embeddings=100, embedding_dim=8),
                             dict(name="b", num_embeddings=10, embedding_dim=8, feature_names=["b1", "b2"])])
    assert one_default_ebc(legacy)
    model = build_model(legacy, TrainConfig(), torch.device("cpu"))
    assert isinstance(model, DLRMTrain) and type(model.get_submodule(EBC_PATH)).__name__ == "EmbeddingBagCollection"
    batch = synthetic_batch(legacy, 4, 13, seed=0)
    assert isinstance(batch, Batch) and batch.sparse_features.keys() == ["a", "b1", "b2"]


def test_each_module_gets_its_own_features_and_sequences_as_long_as_the_pooling_factor(spec):
    assert not one_default_ebc(spec)
    batch = synthetic_batch(spec, 2000, 5, seed=1)
    assert isinstance(batch, ModuleBatch) and batch.dense_features.shape == (2000, 5)
    assert {p: k.keys() for p, k in batch.sparse_features.items()} == {
        USER: ["id", "country", "city"], ITEM: ["id"], SEQUENCE: ["id", "query"]}
    sequences = batch.sparse_features[SEQUENCE].to_dict()
    assert sequences["id"].lengths().float().mean() == pytest.approx(12.0, rel=0.05)
    assert sequences["query"].lengths().float().mean() == pytest.approx(3.0, rel=0.1)
    assert int(sequences["query"].values().max()) < 90  # ids within the table's rows


def test_parquet_data_feeds_a_feature_to_every_module_that_uses_it(spec, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rec.data.layout import DataLayout
    from rec.data.order import Position
    from rec.data.source import Reading, open_source
    from rec.train.input import to_batch

    ids = {"id": [[1, 2], [3]], "country": [[4], []], "city": [[5], [6]], "query": [[7, 8, 9], [10]]}
    pq.write_table(pa.table({"label": [0, 1], "dense": [[0.5, 0.5], [1.0, 0.0]], **ids}), tmp_path / "d.parquet")
    source = open_source(str(tmp_path / "d.parquet"), spec, DataLayout.of_spec(spec, 2), Reading(shuffle=False))
    batch = to_batch(next(source.batches(Position(1), 0, 2)), source.layout, one_module=False)
    assert isinstance(batch, ModuleBatch) and batch.labels.tolist() == [0.0, 1.0]
    features = {p: {k: v.values().tolist() for k, v in kjt.to_dict().items()}
                for p, kjt in batch.sparse_features.items()}
    assert features == {USER: {"id": [1, 2, 3], "country": [4], "city": [5, 6]}, ITEM: {"id": [1, 2, 3]},
                        SEQUENCE: {"id": [1, 2, 3], "query": [7, 8, 9, 10]}}


def synthetic_batch(spec, batch_size, dense_in_features, seed):
    """The first synthetic batch of rank 0, as the job's input pipeline makes it."""
    from rec.data.order import Position
    from rec.data.synthetic import SyntheticSource
    from rec.train.input import to_batch

    source = SyntheticSource(spec, dense_in_features, seed, distinct=1)
    return to_batch(next(source.batches(Position(1), 0, batch_size)), source.layout, one_default_ebc(spec))


def test_sequence_mean_averages_each_samples_ids_and_gives_zeros_for_an_empty_sequence():
    from torchrec.sparse.jagged_tensor import JaggedTensor

    from rec.train.model import sequence_mean

    values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 10.0]])
    out = sequence_mean(JaggedTensor(values=values, lengths=torch.tensor([2, 0, 1])))
    assert torch.equal(out, torch.tensor([[2.0, 3.0], [0.0, 0.0], [10.0, 10.0]]))


# ---------------------------------------------------------------- --model TARGET


def test_model_target_is_told_from_shardflows_models_and_checked():
    assert TrainConfig(model="concat").model_target is None
    assert TrainConfig(model="my_models:build").model_target == "my_models:build"
    assert [p.where for p in TrainConfig(model="bogus").problems()] == ["--model"]
    assert [p.where for p in TrainConfig(model="x.py:f", data="d.parquet").problems()] == ["--data"]


def test_a_user_model_that_differs_from_the_plan_is_named_difference_by_difference(spec):
    from torch import nn
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rec.spec.torchrec_modules import embedding_modules, place
    from rec.train.user_model import model_problems

    modules = embedding_modules(spec)
    assert model_problems(place(nn.Module(), modules), spec, "t") == []
    del modules[ITEM]  # missing
    modules[USER] = EmbeddingBagCollection([  # id has other rows, geo is gone
        EmbeddingBagConfig(name="id", num_embeddings=401, embedding_dim=16, feature_names=["id"])],
        device=torch.device("meta"))
    modules["extra.ebc"] = EmbeddingBagCollection([EmbeddingBagConfig(
        name="x", num_embeddings=5, embedding_dim=8, feature_names=["x"])], device=torch.device("meta"))
    class MyEBC(EmbeddingBagCollection):  # no sharder takes a subclass: it once trained whole on every rank
        pass

    modules["side.ebc"] = MyEBC([EmbeddingBagConfig(name="s", num_embeddings=5, embedding_dim=8, feature_names=["s"])],
                                device=torch.device("meta"))
    problems = {p.where: p.reason for p in model_problems(place(nn.Module(), modules), spec, "t")}
    assert set(problems) == {f"module {ITEM}", "module extra.ebc", f"table {USER}.geo", f"table {USER}.id",
                             "module side.ebc"}
    assert "num_embeddings 401 (planned 400)" in problems[f"table {USER}.id"]
    assert problems["module side.ebc"].startswith("MyEBC: a subclass of a TorchRec embedding module")
    assert problems["module side.ebc"].endswith("DMP would leave it unsharded, whole on every rank")


def test_a_table_of_a_width_the_plan_put_on_data_parallel_is_the_users_model_as_planned():
    """A width-6 table plans only as data_parallel; the user's model was checked without the plan's
    allow-list, and `train --model` refused the very plan, advising what it already did."""
    import torch
    from torch import nn
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rec.train.user_model import model_problems

    model = nn.Module()
    model.ebc = EmbeddingBagCollection([
        EmbeddingBagConfig(name="odd", num_embeddings=100, embedding_dim=6, feature_names=["odd"]),
        EmbeddingBagConfig(name="even", num_embeddings=100, embedding_dim=8, feature_names=["even"])],
        device=torch.device("meta"))
    rows = [dict(name="odd", num_embeddings=100, embedding_dim=6, feature_names=["odd"], module="ebc",
                 sharding_types=["data_parallel"]),
            dict(name="even", num_embeddings=100, embedding_dim=8, feature_names=["even"], module="ebc")]
    assert model_problems(model, spec_from_rows(rows), "m.py:f") == []
    model.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="odd", num_embeddings=100, embedding_dim=6,
                                                           feature_names=["odd"])], device=torch.device("meta"))
    (problem,) = model_problems(model, spec_from_rows([rows[1]]), "m.py:f")  # not planned: refused for its width
    assert "embedding_dim 6 is not a multiple of 4" in problem.reason


def test_a_factory_that_returns_no_model_and_batches_is_refused_in_one_line(tmp_path, monkeypatch):
    from rec.train.user_model import load_user_model

    (tmp_path / "factories.py").write_text("import torch\n"
                                           "def model_only():\n    return torch.nn.Linear(2, 2)\n"
                                           "def no_batches():\n    return torch.nn.Linear(2, 2), None\n"
                                           "def broken():\n    raise ValueError('no data\\nhere')\n"
                                           "def one_argument():\n    return torch.nn.Linear(2, 2), lambda rank: []\n"
                                           "def with_start():\n"
                                           "    return torch.nn.Linear(2, 2), lambda r, w, b, d, start=0, *more: []\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"not a pair \(model, batches\)"):
        load_user_model("factories.py:model_only")
    with pytest.raises(InputError, match=r"returned a pair \(model, batches\), but its second item is None"):
        load_user_model("factories.py:no_batches")
    with pytest.raises(InputError, match=r"raised ValueError: no data$"):
        load_user_model("factories.py:broken")
    # the ranks failed at launch with a TypeError (exit 1, retried)
    with pytest.raises(InputError, match=r"cannot be called as batches\(rank, world_size, batch_size, device\): too "
                                         r"many positional arguments \(its signature: \(rank\)\)$"):
        load_user_model("factories.py:one_argument")
    assert load_user_model("factories.py:with_start").target == "factories.py:with_start"


# ---------------------------------------------------------------- resuming by table key


def test_tables_of_one_name_in_two_modules_are_matched_by_key_when_resuming(spec, tmp_path):
    from rec.plan import read_plan, write_plan
    from rec.train.reshard import is_table_tensor, table_tensor_names
    from rec.train.resume import table_changes

    grown = spec_from_rows([{**r, "num_embeddings": 600} if r["module"] == SEQUENCE and r["name"] == "id" else r
                            for r in ROWS])
    old, new = (read_plan(write_plan(plan_spec(s, TOPOLOGY), tmp_path / n)) for s, n in ((spec, "a"), (grown, "b")))
    changes = table_changes(old, new)
    assert changes.resized == {f"{SEQUENCE}.id": (300, 600)}
    assert f"{ITEM}.id" in changes.restored and f"{USER}.id" in changes.restored
    weights, momenta = table_tensor_names(f"{SEQUENCE}.id")
    assert f"model.{SEQUENCE}.embeddings.id.weight".endswith(weights)
    assert f"optim.state.{SEQUENCE}.embeddings.id.weight.id.momentum1".endswith(momenta)
    assert not f"model.{ITEM}.embedding_bags.id.weight".endswith(weights)
    assert is_table_tensor("model.model.sparse_arch.embedding_bag_collection.embedding_bags.t.weight", ["t"])
    assert not is_table_tensor("model.dense.over_arch.model.1.weight", [f"{SEQUENCE}.id", "t"])


def test_meta_parameters_dmp_leaves_uninitialized_and_meta_buffers_it_zeroes_get_a_note(spec):
    """The model trained from uninitialized memory (a scale of -1.7e6) or a zero temperature, silently."""
    from torch import nn

    from rec.spec.torchrec_modules import embedding_modules, place
    from rec.train.user_model import uninitialized

    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8, device="meta"))
            self.register_buffer("temperature", torch.full((1,), 2.0, device="meta"))

    model = place(nn.Module(), embedding_modules(spec))
    model.head = nn.Linear(8, 1, device="meta")  # reset_parameters initializes it
    assert uninitialized(model) == []
    model.gate = Gate()
    assert uninitialized(model) == [
        "note      module gate: scale on the meta device without a reset_parameters: DMP leaves them uninitialized",
        "note      module gate: buffer temperature on the meta device: DMP makes it zero"]
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    built = nn.Module()  # pretrained weights in a cpu EmbeddingBagCollection: DMP once dropped them silently
    built.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=4,
                                                           feature_names=["t"])])
    assert uninitialized(built) == ["note      module ebc: an EmbeddingBagCollection built with its weights: DMP "
                                    "re-initializes its tables; load pretrained ones after sharding"]


# ---------------------------------------------------------------- --model TARGET's mistakes in the ranks

FACTORIES = """
import itertools
import sys
sys.path.insert(0, EXAMPLES_DIR)
from train_own_model import ShopModel, batches, build_model


def user_tables_replicated():
    from torchrec.distributed.planner.types import ParameterConstraints

    model, constraints = build_model()
    for table in ("user_id_table", "user_country_table"):
        constraints[table] = ParameterConstraints(sharding_types=["data_parallel"])
    return model, constraints


def three_batches():
    return ShopModel(), lambda *args: itertools.islice(batches(*args), 3)


def dict_batches():
    return ShopModel(), lambda *args: ({"features": b} for b in batches(*args))


class Detached(ShopModel):
    def forward(self, batch):
        loss, output = super().forward(batch)
        return loss.detach(), output


def detached_loss():
    return Detached(), batches


def adam_and_adamw_on_the_tables():
    import torch
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    model = ShopModel()
    apply_optimizer_in_backward(torch.optim.Adam, model.user.ebc.parameters(), {"lr": 0.01})
    apply_optimizer_in_backward(torch.optim.AdamW, model.sequence[0].ec.parameters(), {"lr": 0.01})
    for optimizer in (torch.optim.SGD, torch.optim.Adam):
        apply_optimizer_in_backward(optimizer, [model.head.weight], {"lr": 0.01})
    return model, batches


def adam_on_the_dense_layers():
    import torch
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    model = ShopModel()  # its head on the meta device, the user tower's layer on cpu
    model.user.mlp = torch.nn.Linear(model.user.mlp.in_features, model.user.mlp.out_features)
    apply_optimizer_in_backward(torch.optim.Adam, [*model.head.parameters(), *model.user.mlp.parameters()],
                                {"lr": 0.01})
    apply_optimizer_in_backward(torch.optim.SGD, model.user.ebc.parameters(), {"lr": 0.1})
    return model, batches
"""


@pytest.fixture(scope="module")
def own_plan_path(tmp_path_factory):
    """examples/train_own_model.py's model planned on one cpu rank (``plan``; ``replicated``: its user
    tower's tables data_parallel), and a file of factories using it."""
    from rec.plan import write_plan
    from rec.spec.from_model import spec_from_model
    from tests.paths import EXAMPLES

    folder = tmp_path_factory.mktemp("own")
    (folder / "factories.py").write_text(FACTORIES.replace("EXAMPLES_DIR", repr(str(EXAMPLES))))
    spec = spec_from_model(f"{EXAMPLES / 'train_own_model.py'}:build_model").spec
    write_plan(plan_spec(spec, TOPOLOGY), folder / "plan")
    replicated = spec_from_model(f"{folder / 'factories.py'}:user_tables_replicated").spec
    write_plan(plan_spec(replicated, TOPOLOGY), folder / "replicated")
    return folder


@pytest.mark.parametrize(("factory", "pipeline", "expected"), [
    ("three_batches", PipelineKind.NAIVE, "its batches ended after 3 batches; the training needs 5 (--iterations 5)"),
    ("three_batches", PipelineKind.SPARSE_DIST, "its batches ended after 3 batches; the training needs 5"),
    ("detached_loss", PipelineKind.NAIVE, "its forward returned a loss that needs no gradient (requires_grad False"),
    # an AttributeError in the pipeline failed the rank (exit 1, retried), naming nothing
    ("dict_batches", PipelineKind.SPARSE_DIST, "its batches gave a dict, which has no to, record_stream, pin_memory"),
])
def test_a_users_batches_that_end_early_or_a_loss_without_gradient_stop_the_rank_as_bad_input(
        single_process_group, own_plan_path, tmp_path, factory, pipeline, expected):
    """A bare StopIteration or backward's RuntimeError failed the rank (exit 1, a traceback); an
    InputError is the rank's exit 2, with its one line as the training's cause."""
    from rec.plan import read_plan
    from rec.train.job import train
    from rec.train.rank_log import one_line
    from tests.rec.test_training_data import Output

    target = f"{own_plan_path / 'factories.py'}:{factory}"
    config = TrainConfig(model=target, iterations=5, warmup=1, batch_size=8, pipeline=pipeline)
    with pytest.raises(InputError) as stopped:
        train(read_plan(own_plan_path / "plan"), config, str(tmp_path), Output())
    assert f"{target}: {expected}" in one_line(stopped.value)
    assert not (tmp_path / "train_metrics.json").exists()


def test_a_tables_optimizer_the_sharded_kernels_cannot_run_is_refused_before_launch(own_plan_path):
    """FBGEMM asserted Adam away on cpu, and TorchRec refused AdamW, in the ranks after launch (exit 1);
    a data_parallel table's optimizer is torch's own, Adam there trains."""
    from rec.plan import read_plan
    from tasks.train import TrainSettings, preflight

    plan = read_plan(own_plan_path / "plan")
    target = f"{own_plan_path / 'factories.py'}:adam_and_adamw_on_the_tables"
    settings = TrainSettings(job=TrainConfig(model=target))
    with pytest.raises(InputError) as refused:
        preflight(settings, plan.topology, plan.spec, plan=plan)
    problems = {p.where: p.reason for p in refused.value.problems}
    assert set(problems) == {"table user.ebc.user_id_table", "table user.ebc.user_country_table",
                             "table sequence.0.ec.viewed_items_table", "table sequence.0.ec.searches_table",
                             "parameter head.weight"}
    assert problems["parameter head.weight"].startswith("the model applies 2 optimizers to it in backward")
    assert problems["table user.ebc.user_id_table"].startswith(
        "the model applies Adam to it in backward; FBGEMM's kernels on cpu (the plan's compute_device) run only "
        "SGD, Adagrad and RowWiseAdagrad")
    assert problems["table sequence.0.ec.searches_table"].startswith(
        "the model applies AdamW to it in backward, which TorchRec fuses into no sharded table")
    assert "or plan for cuda" in refused.value.render() and "(shardflow's row-wise Adagrad)" in refused.value.render()
    replicated = read_plan(own_plan_path / "replicated")
    with pytest.raises(InputError) as refused:
        preflight(settings, replicated.topology, replicated.spec, plan=replicated)
    assert {p.where for p in refused.value.problems} == {"table sequence.0.ec.viewed_items_table",
                                                         "table sequence.0.ec.searches_table", "parameter head.weight"}


def test_the_optimizers_fbgemms_fused_kernels_run_on_cpu_are_the_ones_the_launcher_lets_through():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType  # type: ignore[import-untyped]
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (  # type: ignore[import-untyped]
        EmbeddingLocation,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # type: ignore[import-untyped]
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    from rec.train.user_model import CPU_FUSED_OPTIMIZERS

    runs = set()
    for kind in EmbOptimType:
        try:
            SplitTableBatchedEmbeddingBagsCodegen([(4, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)], optimizer=kind)
        except AssertionError:  # "Optimizer adam is not supported in CPU mode."
            continue
        runs.add(kind.value)
    assert runs == CPU_FUSED_OPTIMIZERS


def test_the_optimizer_a_users_model_applies_to_a_dense_parameter_trains_it_and_resumes_with_its_state(
        single_process_group, own_plan_path, tmp_path):
    """DMP allocates a dense parameter on the meta device anew, without the optimizer its model's code
    applied in backward, and replaces a data_parallel table's: they trained with shardflow's Adagrad
    instead, silently; on a parameter on cpu, DDP ran it in backward, which failed the rank (exit 1)."""
    from dataclasses import replace

    from torch.distributed.checkpoint import FileSystemReader

    from tests.rec.test_training_data import train

    plan = str(own_plan_path / "replicated" / "plan.json")  # the user tower's tables data_parallel
    config = TrainConfig(model=f"{own_plan_path / 'factories.py'}:adam_on_the_dense_layers", iterations=3,
                         warmup=1, batch_size=8)
    _, straight, _ = train(plan, str(tmp_path / "a"), config)
    train(plan, str(tmp_path / "b"), replace(config, iterations=2, checkpoint_every=2))
    _, resumed, _ = train(plan, str(tmp_path / "b"), replace(config, resume=True))
    assert np.array_equal(resumed, straight)  # Adam's moments and steps carried over
    saved = FileSystemReader(str(tmp_path / "b/checkpoints/step_00000002")).read_metadata().state_dict_metadata
    assert {"optim.state.head.weight.exp_avg", "optim.state.user.mlp.bias.exp_avg_sq"} <= set(saved)  # Adam's
    assert not any(key.endswith(".sum") for key in saved if key.startswith("optim.state."))  # no dense Adagrad
    assert "optim.state.user.ebc.embedding_bags.user_id_table.weight.step" not in saved  # SGD, stepped by step
    # a checkpoint without Adam's state (as earlier shardflows wrote, Adagrad in its place): named, not
    # a bare "Missing key" of the ranks (exit 1)
    train(plan, str(tmp_path / "c"), replace(config, model=f"{own_plan_path / 'factories.py'}:three_batches",
                                             iterations=2, checkpoint_every=2))
    (tmp_path / "c/checkpoints/model.json").unlink()  # the model it records is another: refused before loading
    with pytest.raises(InputError, match="Cannot resume from the checkpoint") as refused:
        train(plan, str(tmp_path / "c"), replace(config, resume=True))
    (problem,) = refused.value.problems
    assert problem.reason.startswith("holds no optim.state.user.mlp.weight.exp_avg, the state of an optimizer")


def test_a_forward_that_returns_other_than_loss_and_output_is_named_by_what_it_returned():
    """A triple (loss, logits, labels) read "returned tuple; return (loss, output)": which tuple?"""
    from rec.train.loop import _losses

    loss = torch.tensor(0.5)
    assert _losses((loss, torch.zeros(3))) is loss
    for returned, named in (((loss, loss, loss), "returned a tuple of 3 items"), (loss, "returned Tensor"),
                            ([loss], "returned a list of 1 item")):
        with pytest.raises(InputError) as e:
            _losses(returned)
        assert named in e.value.render() and "return (loss, output)" in e.value.render()
