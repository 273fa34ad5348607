"""``shardflow spec from-model``: a user's model becomes a spec of its embedding modules, the spec
plans, and the plan shards that same model (read back from the sharded modules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main
from rec.sharding import ModuleKind, Pooling
from rec.spec import read_spec

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

FACTORIES = Path(__file__).with_name("model_factories.py")


def test_a_weighted_bag_collection_becomes_weighted_rows_and_says_so(tmp_path, capsys):
    out = tmp_path / "sparse_nn.csv"
    assert main(["spec", "from-model", "model_factories:sparse_nn", "--out", str(out)]) == 0
    spec = read_spec(out)
    assert {t.key: t.is_weighted for t in spec.tables} == {
        "sparse.ebc.t0": False, "sparse.ebc.t1": False, "sparse.ebc.t2": False,
        "sparse.weighted_ebc.w0": True, "sparse.weighted_ebc.w1": True}
    printed = capsys.readouterr().out
    assert "module sparse.weighted_ebc: EmbeddingBagCollection (weighted), 2 tables" in printed
    assert "module sparse.ebc: EmbeddingBagCollection, 3 tables" in printed and "left out" not in printed


def test_every_embedding_module_becomes_rows_with_its_module(tmp_path, capsys):
    out = tmp_path / "model.yaml"
    assert main(["spec", "from-model", "model_factories:rec_model", "--out", str(out)]) == 0
    spec = read_spec(out)
    assert spec.modules == {"towers.0.ebc": ModuleKind.EMBEDDING_BAG_COLLECTION,
                            "towers.1.ebc": ModuleKind.EMBEDDING_BAG_COLLECTION,
                            "sequence.history": ModuleKind.EMBEDDING_COLLECTION,
                            "sequence.context.0": ModuleKind.EMBEDDING_COLLECTION}
    by_key = {t.key: t for t in spec.tables}
    assert by_key["towers.0.ebc.user_id"].pooling_factor == 3.0
    user_id = by_key["towers.0.ebc.user_id"]
    assert [s.value for s in user_id.sharding_types] == ["table_wise", "row_wise"]  # declaration order
    # TorchRec keys constraints by table name: both item_id tables take them.
    assert by_key["towers.1.ebc.item_id"].pooling_factor == by_key["sequence.history.item_id"].pooling_factor == 20
    assert by_key["towers.1.ebc.item_cat"].pooling is Pooling.MEAN
    query = by_key["sequence.history.query"]
    assert query.pooling is Pooling.NONE and query.embedding_dim == 32
    printed = capsys.readouterr().out
    assert f"wrote {out}: 7 tables in 4 modules" in printed
    left_out = printed.split("left out:")[1].strip().splitlines()
    assert len(left_out) == 3
    assert "module positions: FeatureProcessedEmbeddingBagCollection: sharded by TorchRec's " \
           "FeatureProcessedEmbeddingBagCollectionSharder, which shardflow does not plan" in left_out[0]
    assert "constraints 'nowhere': names no table" in left_out[1]
    assert "constraints 'query': enforce_hbm not modelled by shardflow: ignored" in left_out[2]


def test_a_file_target_and_a_model_without_constraints(tmp_path, capsys):
    out = tmp_path / "model.parquet"
    assert main(["spec", "from-model", f"{FACTORIES}:model_only", "--out", str(out)]) == 0
    spec = read_spec(out)
    assert len(spec) == 7 and {t.pooling_factor for t in spec.tables} == {1.0}
    # train --model's factory, (model, batches): one function for both (it was "constraints as a function")
    again = tmp_path / "again.parquet"
    assert main(["spec", "from-model", f"{FACTORIES}:with_batches", "--out", str(again)]) == 0
    assert read_spec(again).spec_hash == spec.spec_hash


@pytest.mark.parametrize(("target", "reason"), [
    ("no_such_package.models:build", "cannot import no_such_package.models: ModuleNotFoundError: No module named"),
    ("model_factories:missing", "model_factories has no attribute 'missing'"),
    ("model_factories:no_model", "model_factories:no_model() returned None, not a torch.nn.Module"),
    ("model_factories:fails", "raised RuntimeError: the checkpoint path is not set"),
    ("model_factories", "expected package.module:function or path/to/file.py:function"),
    ("model_factories:nothing_to_plan", "holds no EmbeddingBagCollection or EmbeddingCollection"),
    ("nowhere/model.py:build", "no such file: nowhere/model.py"),
])
def test_a_target_that_gives_no_model_exits_2_with_one_line(tmp_path, capsys, target, reason):
    out = tmp_path / "model.yaml"
    assert main(["spec", "from-model", target, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert reason in err and "Traceback" not in err and "second line" not in err
    assert not out.exists()


def test_a_file_that_fails_to_import_is_reported_in_one_line(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\ndef build(:\n    pass\n")
    assert main(["spec", "from-model", f"{broken}:build", "--out", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"cannot import {broken}: SyntaxError" in err and len(err.strip().splitlines()) == 2


def test_a_keyboard_interrupt_in_the_users_function_stays_an_interrupt(tmp_path, capsys):
    interrupted = tmp_path / "interrupted.py"
    interrupted.write_text("def build():\n    raise KeyboardInterrupt\n")
    assert main(["spec", "from-model", f"{interrupted}:build", "--out", str(tmp_path / "s.yaml")]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_from_model_plan_and_shard_the_same_model(tmp_path, single_process_group):
    """The round trip a user makes: spec from the model, plan it, shard the model with the plan."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from rec.plan import read_plan, write_plan
    from rec.plan.torchrec_plan import sharders_for, to_sharding_plan
    from rec.planning import plan_spec
    from rec.topology import topology_from_dict
    from tests.rec.model_factories import rec_model
    from tests.rec.test_torchrec_plan_modules import applied, planned

    spec_path = tmp_path / "model.parquet"
    assert main(["spec", "from-model", "model_factories:rec_model", "--out", str(spec_path)]) == 0
    topology = topology_from_dict(dict(world_size=1, compute_device="cpu", ddr_cap="8GiB"))
    write_plan(plan_spec(read_spec(spec_path), topology), tmp_path / "plan")
    plan = read_plan(tmp_path / "plan")

    model, _ = rec_model()
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=to_sharding_plan(plan),
                                   sharders=sharders_for(plan))
    expected = planned(plan)
    assert applied(dmp) == expected
    assert len(expected) == 7


def test_min_partition_of_the_constraints_reaches_the_spec():
    import torch
    from torch import nn
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rec.spec.from_model import model_spec

    model = nn.Module()
    model.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="wide", num_embeddings=100, embedding_dim=512,
                                                           feature_names=["w"])], device=torch.device("meta"))
    found = model_spec(model, {"wide": ParameterConstraints(min_partition=256)})
    assert found.spec.tables[0].min_partition == 256 and found.left_out == ()


def test_each_tables_optimizer_reaches_the_spec_as_torchrecs_estimator_reads_it():
    """apply_optimizer_in_backward marks a table's weight with its optimizer: Adam's state is twice
    the weight, which a spec without it would size as row-wise Adagrad's (one float per row)."""
    import torch
    from torch import nn
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from rec.spec.from_model import model_spec

    model = nn.Module()
    model.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=n, num_embeddings=100, embedding_dim=8,
                                                           feature_names=[n]) for n in ("a", "b", "c")],
                                       device=torch.device("meta"))
    apply_optimizer_in_backward(torch.optim.Adam, [model.ebc.embedding_bags["a"].weight], {"lr": 0.1})
    apply_optimizer_in_backward(torch.optim.SGD, [model.ebc.embedding_bags["b"].weight], {"lr": 0.1})
    found = model_spec(model)
    assert [t.optimizer for t in found.spec.tables] == ["adam", "sgd", None]  # c: the planner's --optimizer
