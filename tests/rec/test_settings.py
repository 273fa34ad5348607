"""Settings dataclasses as flags and JSON: every default written once, every value round-trips."""

from __future__ import annotations

import argparse

import pytest

from rec.errors import InputError
from rec.settings import add_flags, check, from_dict, from_flags, to_dict, to_flags
from rec.train.config import ModelKind, PipelineKind, TrainConfig


def parse(cls, argv: list[str]):
    parser = argparse.ArgumentParser()
    add_flags(parser, cls)
    return from_flags(cls, parser.parse_args(argv))


def test_flags_default_to_the_dataclass_defaults():
    assert parse(TrainConfig, []) == TrainConfig()


def test_to_flags_round_trips_every_kind_of_field():
    config = TrainConfig(iterations=7, warmup=2, batch_size=33, model=ModelKind.CONCAT,
                         pipeline=PipelineKind.NAIVE, data="x.parquet", dense_arch_layer_sizes=(8, 4),
                         dense_lr=0.5, checkpoint_every=3, resume=True)
    assert parse(TrainConfig, to_flags(config)) == config
    assert to_flags(TrainConfig()) == []


def test_to_dict_round_trips_and_unknown_keys_are_named():
    config = TrainConfig(model=ModelKind.DLRM, over_arch_layer_sizes=(16, 1))
    assert from_dict(TrainConfig, to_dict(config)) == config
    with pytest.raises(InputError) as e:
        from_dict(TrainConfig, {"iterations": "many", "colour": "red"}, source="train")
    text = e.value.render()
    assert "train.colour" in text and "train.iterations" in text


def test_check_names_every_value_out_of_bounds_and_the_warmup_rule():
    with pytest.raises(InputError) as e:
        check(TrainConfig(iterations=0, warmup=5, batch_size=-1), "Bad settings:")
    text = e.value.render()
    assert "--iterations: must be at least 1, got 0" in text
    assert "--batch-size: must be at least 1, got -1" in text
    assert "--warmup" in text and "no measured iteration" in text
    for seed in (-1, 2**64):  # numpy's and torch's seeds: once refused only inside the ranks, exit 1
        with pytest.raises(InputError, match="--seed: must be"):
            check(TrainConfig(seed=seed), "Bad settings:")
