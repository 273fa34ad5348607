"""The calibration section's out-of-family workloads (``bench.gpu_check.families``): reserved seeds,
chosen apart from the model, valid specs of shapes the calibration bench's generator cannot make."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from bench.gpu_check import families
from bench.gpu_check.compare import _beside
from bench.gpu_check.families import CACHE_FRACTIONS, OOF_SEEDS, Family
from bench.gpu_check.workloads import CALIBRATION_SPECS, GIB, Ranks, Workload
from rec.sharding import ComputeDevice, ComputeKernel, Pooling
from rec.spec import spec_from_rows
from rec.spec.synthetic import RANDOM_DIMS, random_table_rows
from tests.paths import ROOT

CPU = Ranks(ComputeDevice.CPU, 2, 4 * GIB, 16 * GIB)
H100 = Ranks(ComputeDevice.CUDA, 1, 80 * GIB, 200 * GIB)
H200_X8 = Ranks(ComputeDevice.CUDA, 8, 141 * GIB, 250 * GIB)


def drawn(ranks: Ranks) -> dict[str, Workload]:
    return {w.family or "": w for w in families.out_of_family(ranks).workloads if w.name.endswith("0")}


def in_family_specs() -> list[list[dict[str, object]]]:
    return [random_table_rows(seed, tables, share, 0.25 * 80 * GIB) for seed, tables, _, share in CALIBRATION_SPECS]


def test_the_out_of_family_seeds_are_reserved_apart_from_every_seed_the_model_was_chosen_on():
    from bench.calibration_bench import SPECS
    from rec.calibrate.probes import MIXED

    chosen_on = {s[0] for s in (*CALIBRATION_SPECS, *SPECS, *MIXED)}
    assert not chosen_on & set(OOF_SEEDS)
    used = [int(m.group(1)) for ranks in (CPU, H100) for w in families.out_of_family(ranks).workloads
            if (m := re.fullmatch(r"oof_[a-z_]+_s(\d+)", w.name))]
    assert used and all(seed in OOF_SEEDS for seed in used)
    with pytest.raises(ValueError, match="out-of-family range"):
        families.generate(Family.CRITEO, CPU, 12)


def test_only_the_calibration_section_reads_the_out_of_family_generators():
    """A model term or probe chosen looking at these shapes would make them in-family: nothing
    under rec/ (rec/calibrate included), tasks/ or flows/ imports them, nor any bench but the
    calibration section's."""
    imports = re.compile(r"^\s*(?:from\s+bench\.gpu_check(?:\.families)?\s+import\s+[^\n]*\bfamilies\b"
                         r"|from\s+bench\.gpu_check\.families\s+import|import\s+bench\.gpu_check\.families)", re.M)
    readers = [path.relative_to(ROOT).as_posix() for top in ("rec", "tasks", "flows", "bench")
               for path in (ROOT / top).rglob("*.py") if imports.search(path.read_text())]
    assert readers == ["bench/gpu_check/compare.py"]
    from_bench = re.compile(r"^\s*(from|import)\s+bench\b", re.M)
    assert not [p for p in (ROOT / "rec").rglob("*.py") if from_bench.search(p.read_text())]


@pytest.mark.parametrize("ranks", [CPU, H100, H200_X8], ids=["cpu", "h100", "h200x8"])
def test_every_family_draws_valid_specs_named_by_family_and_seed(ranks):
    oof = families.out_of_family(ranks)
    expected = [f for f in Family if ranks.cuda or f is not Family.MEMORY_TIGHT]
    assert Counter(w.family for w in oof.workloads) == {f.value: families.PER_FAMILY[ranks.cuda] for f in expected}
    assert [w.family for w in oof.workloads[:len(expected)]] == [f.value for f in expected]  # round by round
    assert set(oof.skipped) == ({"memory_tight"} if not ranks.cuda else set())
    for w in oof.workloads:
        spec = spec_from_rows(w.rows, source=w.name)
        assert w.name == f"oof_{w.family}_s{int(w.name.rsplit('_s', 1)[1])}" and w.group == "out_of_family"
        assert all(t.embedding_dim % 4 == 0 for t in spec.tables)
        budget = 0.25 * ranks.hbm_bytes * ranks.world_size if ranks.cuda else families.CPU_TABLE_BYTES
        if w.family != "memory_tight":
            assert sum(t.bytes for t in spec.tables) <= budget


def test_the_families_have_shapes_the_calibration_bench_generator_cannot_make():
    in_family = [row for rows in in_family_specs() for row in rows]
    assert all("pooling" not in r and "module" not in r and "hit_rate_curve" not in r for r in in_family)
    assert all(r["embedding_dim"] in RANDOM_DIMS and int(r["num_embeddings"]) <= 10**7 for r in in_family)
    assert max(float(r["pooling_factor"]) for r in in_family) <= 50

    cuda, cpu = drawn(H100), drawn(CPU)
    for w in (cuda["criteo"], cpu["criteo"]):
        spec = spec_from_rows(w.rows)
        assert len(spec) == 26 and {t.pooling_factor for t in spec.tables} == {1.0}
        assert {t.embedding_dim for t in spec.tables} <= {64, 128}
    for w in (cuda["two_tower"], cpu["two_tower"]):
        sequences = [t for t in spec_from_rows(w.rows).tables if t.pooling is Pooling.NONE]
        assert len(sequences) >= 2 and all(20 <= t.pooling_factor <= 200 for t in sequences)
        assert len({t.module for t in spec_from_rows(w.rows).tables}) == 3  # the history, the user and item towers
    for w in (cuda["power_law"], cpu["power_law"]):
        dims = {int(r["embedding_dim"]) for r in w.rows}
        assert dims - set(RANDOM_DIMS) and all(16 <= d <= 256 for d in dims)
    rows = [int(r["num_embeddings"]) for r in cuda["power_law"].rows]
    assert max(rows) > 10**7 and min(rows) < 10**4  # a range the bench's 1e3-1e7 cannot draw
    tight = spec_from_rows(cuda["memory_tight"].rows)
    assert all(t.hit_rate_curve and [f for f, _ in t.hit_rate_curve] == list(CACHE_FRACTIONS) for t in tight.tables)
    skews = {t.hit_rate_curve[0][1] for t in tight.tables if t.hit_rate_curve}
    assert len(skews) == len(tight) and max(skews) > 2 * min(skews)  # each table skewed its own way


@pytest.mark.parametrize("ranks", [H100, H200_X8], ids=["h100", "h200x8"])
def test_memory_tight_tables_outgrow_the_hbm_cap_and_plan_onto_uvm(ranks):
    from rec.config.cost import CostConfig
    from rec.config.search import SearchConfig
    from rec.planning import plan_spec
    from rec.profile.types import DEFAULT_PROFILE
    from rec.topology import topology_from_dict

    for w in families.out_of_family(ranks).workloads:
        if w.family != "memory_tight":
            continue
        spec = spec_from_rows(w.rows)
        assert w.hbm_bytes is not None
        assert 2 <= sum(t.bytes for t in spec.tables) / (w.hbm_bytes * ranks.world_size) <= 10
        # the heuristic's plan: whether a table must leave the HBM does not wait on the exact stage
        plan = plan_spec(spec, topology_from_dict(ranks.topology(w.batch_size, w.hbm_bytes)),
                         CostConfig(profile=DEFAULT_PROFILE), SearchConfig(time_limit_s=0.0))
        assert {t.compute_kernel for t in plan.tables} & {ComputeKernel.FUSED_UVM, ComputeKernel.FUSED_UVM_CACHING}


def test_the_memory_tight_family_is_refused_on_cpu_ranks():
    with pytest.raises(ValueError, match="cuda"):
        families.generate(Family.MEMORY_TIGHT, CPU, 1300)


def test_the_first_round_of_the_out_of_family_set_sits_between_the_builtin_workloads():
    builtin = [Workload(f"spec{i}", [], 1) for i in range(1, 5)]
    oof = list(families.out_of_family(H100).workloads)
    order = [w.name for w in _beside(builtin, oof)]
    first, second = [w.name for w in oof[:4]], [w.name for w in oof[4:]]
    assert order == ["spec1", first[0], "spec2", first[1], "spec3", first[2], "spec4", first[3], *second]
    short = [w.name for w in _beside(builtin[:2], oof[:3])]
    assert short == ["spec1", oof[0].name, "spec2", oof[1].name, oof[2].name]
