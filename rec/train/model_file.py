"""``model.json``: what defines shardflow's model beside its weights, so that a checkpoint (and an
exported model) can be used outside the job that trained it.

Written into every checkpoint directory (``record_model``, beside the plan copy) and into an
exported model's directory. It holds the model kind, the dense input width and the dense/over arch
sizes, the ``--ids`` policy, the tables (spec rows: rows, dim, features, module) and the features in
the order the model reads them (each feature column with the rows its ids must fall in, and a
weighted feature's weights column). A training of a model of the user's own (``--model TARGET``)
writes in its place the TARGET alone (``record_target``): its checkpoints are judged by what wrote
them, not by a ``model.json`` an earlier training of shardflow's model left. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rec.data.ids import IdsPolicy
from rec.data.layout import DataLayout, weights_column
from rec.documents import DocumentError, load_json
from rec.errors import InputError, Problem
from rec.spec.columns import table_to_row
from rec.spec.types import Spec
from rec.train.config import ModelKind, TrainConfig, resolve_model_kind

MODEL_FILE = "model.json"
MODEL_FORMAT = "shardflow.model/v1"
TARGET_FORMAT = "shardflow.model/target-v1"  # checkpoints of a model of the user's own: {format, target}
MAX_MODEL_FILE_BYTES = 1 << 30


@dataclass(frozen=True)
class ModelSettings:
    kind: ModelKind  # resolved: never auto
    dense_in_features: int
    dense_arch_layer_sizes: tuple[int, ...]
    over_arch_layer_sizes: tuple[int, ...]
    ids: IdsPolicy
    spec: Spec

    def config(self) -> TrainConfig:
        """A TrainConfig that builds this model (``rec.train.model.build_model``)."""
        from dataclasses import replace

        config = TrainConfig(model=self.kind.value, dense_in_features=self.dense_in_features,
                             dense_arch_layer_sizes=self.dense_arch_layer_sizes,
                             over_arch_layer_sizes=self.over_arch_layer_sizes)
        return replace(config, ids=self.ids)

    @property
    def layout(self) -> DataLayout:
        return DataLayout.of_spec(self.spec, self.dense_in_features)


def model_settings(spec: Spec, config: TrainConfig) -> ModelSettings:
    return ModelSettings(resolve_model_kind(spec, config.model_kind), config.dense_in_features,
                         config.dense_arch_layer_sizes, config.over_arch_layer_sizes, config.ids, spec)


def settings_to_dict(settings: ModelSettings, **extra: Any) -> dict[str, Any]:
    layout = settings.layout
    return {
        "format": MODEL_FORMAT, "model": settings.kind.value, "dense_in_features": settings.dense_in_features,
        "dense_arch_layer_sizes": list(settings.dense_arch_layer_sizes),
        "over_arch_layer_sizes": list(settings.over_arch_layer_sizes), "ids": settings.ids.value,
        # A weighted feature's weights column and a weighted module are named only where the spec has
        # them: the records of other models stay what they were.
        "features": [{"column": s.column, "rows": s.rows, "tables": list(s.tables),
                      **({"weights": weights_column(s.column)} if s.weighted else {})} for s in layout.slots],
        "modules": [{"path": m.path, "keys": list(m.keys), **({"weighted": True} if m.weighted else {})}
                    for m in layout.modules],
        "tables": [table_to_row(t) for t in settings.spec.tables],
        **extra,
    }


def record_model(directory: str | Path, spec: Spec, config: TrainConfig) -> None:
    """Write ``directory/model.json`` for the model ``config`` builds from ``spec``."""
    from rec.disk_full import write_whole

    Path(directory).mkdir(parents=True, exist_ok=True)
    text = json.dumps(settings_to_dict(model_settings(spec, config)), indent=1) + "\n"
    write_whole(Path(directory) / MODEL_FILE, text.encode())


def record_target(directory: str | Path, target: str) -> None:
    """Write ``directory/model.json`` saying its checkpoints are of ``target``'s model (``--model``)."""
    from rec.disk_full import write_whole

    Path(directory).mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": TARGET_FORMAT, "target": target}, indent=1) + "\n"
    write_whole(Path(directory) / MODEL_FILE, text.encode())


def target_of(directory: str | Path) -> str | None:
    """The TARGET whose model a checkpoint directory's checkpoints are of (``record_target``); None
    where its ``model.json`` is shardflow's model's, or it has none, or it is not JSON (read_model
    names that)."""
    from rec.input_files import read_text

    path = Path(directory) / MODEL_FILE
    try:
        record = load_json(read_text(path, "model settings", MAX_MODEL_FILE_BYTES)) if path.is_file() else None
    except (InputError, DocumentError):
        return None
    if isinstance(record, dict) and record.get("format") == TARGET_FORMAT and isinstance(record.get("target"), str):
        return str(record["target"])
    return None


def unrecorded(names: list[str]) -> str:
    """Why a checkpoint folder has none of ``names`` (model.json, the plan's copy), and how to get them."""
    return (f"has no {' or '.join(names)}: written for a model of your own (--model TARGET), or by an early "
            "shardflow; resumed for more iterations (`shardflow train --plan PLAN --out OUT --resume "
            "--iterations N`), its training records them")


def read_model(path: str | Path) -> tuple[ModelSettings, dict[str, Any]]:
    """``model.json`` (a path to it or its directory) as ModelSettings, and the whole mapping;
    InputError naming every problem of a file shardflow did not write."""
    from rec.input_files import read_text
    from rec.spec.validate import spec_from_rows
    from rec.validation import Problems, choice, integer, known_keys, required

    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    title = f"Cannot read the model settings {path}:"
    try:
        record: Any = load_json(read_text(path, "model settings", MAX_MODEL_FILE_BYTES))
    except DocumentError as e:
        raise InputError(title, [Problem(str(path), str(e))]) from None
    problems = Problems(str(path))
    if isinstance(record, dict) and record.get("format") == TARGET_FORMAT:
        problems.add("format", f"the checkpoints are of a model of your own ({str(record.get('target'))[:200]}): "
                               "eval, export and predict take shardflow's model")
        problems.raise_if_any(title)
    if not isinstance(record, dict) or record.get("format") != MODEL_FORMAT:
        problems.add("format", f"expected {MODEL_FORMAT}: not a model shardflow wrote")
        problems.raise_if_any(title)
    known = ["format", "model", "dense_in_features", "dense_arch_layer_sizes", "over_arch_layer_sizes", "ids",
             "features", "modules", "tables", "plan_id", "step", "tensors"]
    d = known_keys(record, known, problems)
    required(d, known[:9], problems)
    kind = problems.take_from(d, "model", lambda v: choice(ModelKind, v))
    dense = problems.take_from(d, "dense_in_features", lambda v: integer(v, minimum=1))
    ids = problems.take_from(d, "ids", lambda v: choice(IdsPolicy, v))
    sizes = {key: problems.take_from(d, key, _sizes) for key in ("dense_arch_layer_sizes", "over_arch_layer_sizes")}
    problems.raise_if_any(title)
    if kind is ModelKind.AUTO:
        problems.add("model", "must be a resolved model kind, not auto")
    try:
        spec = spec_from_rows(d["tables"] if isinstance(d["tables"], list) else [], source=f"{path} tables")
    except InputError as e:
        problems.items += list(e.problems)
        problems.raise_if_any(title)
        raise
    problems.raise_if_any(title)
    assert kind is not None and dense is not None and ids is not None
    settings = ModelSettings(kind, dense, tuple(sizes["dense_arch_layer_sizes"] or ()),
                             tuple(sizes["over_arch_layer_sizes"] or ()), ids, spec)
    expected = settings_to_dict(settings)
    for key in ("features", "modules"):
        if d.get(key) != expected[key]:
            problems.add(key, "does not match the tables (the file was edited)")
    problems.raise_if_any(title)
    return settings, record


def dense_part_problems(directory: str | Path, spec: Spec, config: TrainConfig) -> list[Problem]:
    """Where a training with ``config`` would build another dense part than the one whose weights the
    checkpoint directory holds (its ``model.json``): the ranks would fail to load them, after launch.
    Checkpoints of a model of the user's own (``record_target``) need ``--model``; nothing where the
    directory has no ``model.json`` (a model of the user's own, trained before shardflow recorded it)."""
    path = Path(directory) / MODEL_FILE
    if not path.is_file():
        return []
    target = target_of(directory)
    if target is not None:  # checkpoints of a model of the user's own: the ranks would fail to load them
        return [] if config.model_target else [Problem("--model", (
            f"none given, but the checkpoints are of {target}'s model ({path}): resume with --model {target}"))]
    if config.model_target:
        return [Problem(str(path), "the checkpoint is of shardflow's model, not of --model's: resume it without "
                                   "--model, or give this training another --checkpoint-dir")]
    then, now = (_dense_part(s) for s in (read_model(path)[0], model_settings(spec, config)))
    return [Problem(flag, f"{now[flag]}, but the checkpoint's model was trained with {then[flag]} ({path}): give "
                          "the same, or train from scratch elsewhere") for flag in now if now[flag] != then[flag]]


def _dense_part(settings: ModelSettings) -> dict[str, str]:
    """What shapes the dense part's weights, by the flag that sets it."""
    return {"--model": settings.kind.value, "--dense-in-features": str(settings.dense_in_features),
            "--dense-arch-layer-sizes": " ".join(map(str, settings.dense_arch_layer_sizes)),
            "--over-arch-layer-sizes": " ".join(map(str, settings.over_arch_layer_sizes))}


def _sizes(value: object) -> tuple[int, ...]:
    from rec.validation import integer

    if not isinstance(value, list) or not value:
        raise ValueError("expected a list of layer sizes")
    return tuple(integer(v, minimum=1) for v in value)

