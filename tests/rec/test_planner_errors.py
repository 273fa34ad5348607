"""``ShardflowPlanner``'s errors and edge cases (issue 40): every table's own problem is named, the
output directory is checked before planning, each message blames what is wrong (the table by its
module path, the topology's hbm_cap or ddr_cap), and a model without tables gets TorchRec's empty plan.
"""

from __future__ import annotations

import pytest

from rec.errors import InputError
from rec.planning import plan_spec
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from torch import nn  # noqa: E402
from torchrec.distributed.embedding import EmbeddingCollectionSharder  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner  # noqa: E402
from torchrec.distributed.planner.types import ParameterConstraints, Topology  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection  # noqa: E402

from rec.torchrec import ShardflowPlanner  # noqa: E402

META = torch.device("meta")
SHARDERS = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
MAX_LINES = 25  # one screen
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # TorchRec's planner, the oracle here


def model(*tables: tuple[str, int, int]) -> nn.Module:
    m = nn.Module()
    m.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=n, num_embeddings=rows, embedding_dim=dim,
                                                       feature_names=[f"{n}_f"]) for n, rows, dim in tables],
                                   device=META)
    return m


def topology(device: str = "cuda", **caps: int) -> Topology:
    return Topology(world_size=2, local_world_size=2, compute_device=device, **caps)


def refused(planner_kwargs: dict, module: nn.Module | None = None) -> str:
    """The rendered InputError of planning ``module`` (constructing the planner, when none)."""
    with pytest.raises(InputError) as e:
        planner = ShardflowPlanner(debug=False, **planner_kwargs)
        if module is not None:
            planner.plan(module, SHARDERS)
    text = e.value.render()
    assert len(text.splitlines()) <= MAX_LINES and "Traceback" not in text
    return text


def test_every_tables_own_problem_is_named_not_an_empty_spec():
    text = refused({"topology": topology()}, model(("odd", 100, 3), ("empty", 100, 0), ("huge", 10**12, 8),
                                                  ("fine", 100, 8)))
    assert "the spec has no tables" not in text
    assert "table odd in module ebc: embedding_dim 3 is not a multiple of 4" in text
    assert "table empty in module ebc: embedding_dim: must be > 0, got 0" in text
    assert "table huge in module ebc: num_embeddings x embedding_dim is 8,000,000,000,000 weights" in text
    assert "which this would overflow" in text and "fine" not in text


def test_a_dim_3_table_limited_to_data_parallel_plans_dense_on_cpu_as_torchrec_plans_it():
    m, constraints = model(("odd", 100, 3), ("fine", 100, 8)), {"odd": ParameterConstraints(
        sharding_types=["data_parallel"])}
    ours = ShardflowPlanner(topology=topology("cpu"), constraints=constraints, debug=False).plan(m, SHARDERS)
    theirs = EmbeddingShardingPlanner(topology=topology("cpu"), constraints=constraints, debug=False).plan(m, SHARDERS)
    for plan in (ours, theirs):
        assert (plan.plan["ebc"]["odd"].sharding_type, plan.plan["ebc"]["odd"].compute_kernel) == (
            "data_parallel", "dense")
    # On cuda FBGEMM's dense kernel refuses the dim when training: the table's dim is named, not "no option".
    text = refused({"topology": topology(), "constraints": constraints}, m)
    assert "table odd in module ebc: embedding_dim 3 is not a multiple of 4" in text and "dense kernel" in text


def test_a_model_with_no_tables_gets_the_empty_plan_torchrec_returns():
    bare = nn.Linear(4, 4, device=META)
    no_tables = model()
    for m in (bare, no_tables):
        planner = ShardflowPlanner(topology=topology(), debug=True)
        plan = planner.plan(m, SHARDERS)
        assert plan == EmbeddingShardingPlanner(topology=topology()).plan(m, SHARDERS)
        assert plan.plan == {} and planner.last_plan is None


def test_collective_plan_of_a_model_without_tables_is_empty_on_every_rank(single_process_group):
    import torch.distributed as dist

    plan = ShardflowPlanner(topology=Topology(world_size=1, compute_device="cpu"), debug=False).collective_plan(
        nn.Linear(4, 4, device=META), SHARDERS, dist.GroupMember.WORLD)
    assert plan.plan == {}


def test_cost_settings_made_in_code_or_by_the_topology_are_held_to_a_profile_files_bounds():
    """A Profile built in code, and the multipliers and bandwidth a TorchRec Topology sets, were taken
    as they were: a negative bandwidth planned a critical path of -943 ms, and in collective_plan rank 0
    returned that plan while the others refused it (a hang in DMP). Refused now as a profile file with
    the same numbers is, named where they were set."""
    from dataclasses import replace

    from rec.profile import DEFAULT_PROFILE

    negative = replace(DEFAULT_PROFILE, bandwidths=replace(DEFAULT_PROFILE.bandwidths, hbm_mem_bw=-1e9))
    assert "profile.bandwidths.hbm_mem_bw: must be > 0 bytes/s" in refused({"topology": topology(),
                                                                            "profile": negative})
    assert "topology.bwd_compute_multiplier: must be between 0 and 1e+06" in refused(
        {"topology": Topology(world_size=2, compute_device="cuda", bwd_compute_multiplier=2e6)})
    assert "profile: expected a Profile or a profile file's path, got dict" in refused({"profile": {"name": "x"}})
    # TorchRec's own planner fails reading the first device of a topology of no rank
    with pytest.raises(IndexError):
        EmbeddingShardingPlanner(topology=Topology(world_size=0, compute_device="cuda")).plan(
            model(("a", 100, 8)), SHARDERS)
    assert "topology.world_size: 0: a topology needs a rank at least" in refused(
        {"topology": Topology(world_size=0, compute_device="cuda")})


def test_without_a_topology_the_planner_takes_torchrecs_default_for_the_group_without_its_warning(
        single_process_group, caplog):
    """TorchRec 1.8 warns that a Topology built directly "will fail": the planner's default is built
    through TorchRec's factory, the same topology its own planner makes."""
    planner = ShardflowPlanner(debug=False)
    planner.plan(model(("a", 100, 8)), SHARDERS)
    assert planner.last_plan is not None and planner.last_plan.world_size == 1
    assert not [r for r in caplog.records if "constructed directly" in r.getMessage()]


def test_collective_plan_refuses_on_rank_0_a_plan_the_other_ranks_would_refuse(single_process_group):
    """A cost setting that reached the planner unchecked (made here by hand) is refused on rank 0 before
    it plans, where rank 0 returned the plan the others then refused; rank 0 also reads its plan back as
    they read what it sends, so a plan they would refuse is refused there too."""
    from dataclasses import replace

    import torch.distributed as dist

    from rec.profile import DEFAULT_PROFILE

    planner = ShardflowPlanner(topology=Topology(world_size=1, compute_device="cpu"), debug=False)
    planner._profile = replace(DEFAULT_PROFILE, bandwidths=replace(DEFAULT_PROFILE.bandwidths, ddr_mem_bw=-1e9))
    with pytest.raises(InputError, match=r"profile\.bandwidths\.ddr_mem_bw: must be > 0 bytes/s"):
        planner.collective_plan(model(("a", 100, 8)), SHARDERS, dist.GroupMember.WORLD)


@pytest.mark.parametrize("where", ["file", "below_a_file"])
def test_a_plan_dir_that_cannot_be_a_directory_is_refused_before_planning(tmp_path, where):
    file = tmp_path / "passwd"
    file.write_text("root:x:0:0\n")
    plan_dir = file if where == "file" else file / "plans"
    text = refused({"topology": topology(), "plan_dir": plan_dir})
    assert f"plan_dir {plan_dir}:" in text and len(text.splitlines()) == 2
    assert ("exists and is not a directory" if where == "file" else f"{file} is a file, not a directory") in text
    assert file.read_text() == "root:x:0:0\n"


def test_an_embedding_collections_tables_are_named_by_their_real_module_path():
    ec = EmbeddingCollection([EmbeddingConfig(name="s", num_embeddings=10**9, embedding_dim=128,
                                              feature_names=["f"])], device=META)
    small = topology(hbm_cap=2 * 1024**3, ddr_cap=2 * 1024**3)
    text = refused({"topology": small}, ec)  # the model is the module: its path is "", tables by name
    assert "table s: does not fit" in text and "model.sparse_arch" not in text
    nested = nn.Module()
    nested.seq = nn.Module()
    nested.seq.ec = ec
    text = refused({"topology": small}, nested)
    assert "table s in module seq.ec: does not fit" in text and "model.sparse_arch" not in text


def test_a_cuda_topology_without_hbm_is_named_as_its_hbm_cap_not_the_dense_parameters():
    text = refused({"topology": topology(hbm_cap=0)})
    assert "topology hbm_cap: 0 B" in text and "dense parameters" not in text
    text = refused({"topology": topology(hbm_cap=1)}, model(("t", 100, 8)))  # nothing left after the 15%
    assert "topology hbm_cap: 1 B less the storage reservation's 15%" in text and "dense parameters" not in text


def test_a_cpu_topology_short_of_ddr_is_named_as_its_ddr_cap_not_hbm():
    text = refused({"topology": topology("cpu", ddr_cap=1)}, model(("t", 100, 8)))
    assert "topology ddr_cap: 1 B per rank" in text and "each rank has -80.0 KiB DDR" in text
    assert "HBM" not in text
    # The same on shardflow's own topology, as `shardflow plan` reads it.
    spec = spec_from_rows([{"name": "t", "num_embeddings": 100, "embedding_dim": 8}])
    cpu = topology_from_dict({"world_size": 2, "compute_device": "cpu", "ddr_cap": 1})
    with pytest.raises(InputError) as e:
        plan_spec(spec, cpu)
    assert "topology ddr_cap" in e.value.render() and "HBM" not in e.value.render()


def test_shardflow_plan_exits_2_with_the_ddr_cap_named(tmp_path, capsys):
    from flows.cli import main

    spec, topo = tmp_path / "s.yaml", tmp_path / "t.yaml"
    spec.write_text("- {name: t, num_embeddings: 100, embedding_dim: 8}\n")
    topo.write_text("world_size: 2\ncompute_device: cpu\nddr_cap: 1\n")
    assert main(["plan", "--no-track", str(spec), "--topology", str(topo), "--out", str(tmp_path / "plan")]) == 2
    err = capsys.readouterr().err
    assert "topology ddr_cap: 1 B per rank" in err and "HBM" not in err and "Traceback" not in err
