"""What a plan run logs to MLflow as its prediction: the parts add up to the one predicted time."""

from __future__ import annotations

import pytest

from rec.config.cost import CostConfig
from rec.planning import plan_spec
from rec.profile import profile_from_dict
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict
from tasks.records import PREDICTED, plan_metrics

ONE_GPU = topology_from_dict({"world_size": 1, "local_world_size": 1, "compute_device": "cuda", "hbm_cap": "80GB",
                              "ddr_cap": "128GB", "batch_size": 512}, source="test")
TABLES = spec_from_rows([{"name": "narrow", "num_embeddings": 100_000, "embedding_dim": 16, "pooling_factor": 8.0,
                          "sharding_types": ["table_wise"]},
                         {"name": "wide", "num_embeddings": 100_000, "embedding_dim": 256,
                          "sharding_types": ["table_wise"]}], source="test")


def test_a_profile_pricing_the_widest_rows_logs_them_and_the_parts_add_up_to_the_prediction():
    profile = profile_from_dict({"extensions": {"widest_dim_multiplier": 0.5, "iteration_ms": 1.0}})
    metrics = plan_metrics(plan_spec(TABLES, ONE_GPU, CostConfig(profile=profile)))
    assert metrics["widest_ms"] > 0
    assert metrics[PREDICTED] == pytest.approx(metrics["critical_path_ms"] + metrics["widest_ms"]
                                               + metrics["plan_level_ms"], rel=1e-12)


def test_under_torchrecs_defaults_there_is_no_widest_rows_metric():
    metrics = plan_metrics(plan_spec(TABLES, ONE_GPU))
    assert "widest_ms" not in metrics and metrics[PREDICTED] == metrics["critical_path_ms"]
