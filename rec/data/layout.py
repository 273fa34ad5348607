"""The columns training data must have for a spec, and how they feed the model's embedding modules.

One row per sample: ``label`` (0 or 1), ``dense`` (``dense_in_features`` floats) and one column per
feature name of the spec's tables, holding the sample's ids (docs/training.md, "Training data").
A feature column that tables of several sizes read (two modules may share a feature name) is one
``IdSlot`` per size: its ids are checked, or mapped, against each table's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from rec.spec.types import Spec, TableSpec

LABEL = "label"
DENSE = "dense"


@dataclass(frozen=True)
class IdSlot:
    """The ids of one feature column as one table size sees them."""

    column: str  # the feature name: the data's column
    rows: int  # the table's num_embeddings: ids must fall in [0, rows)
    tables: tuple[str, ...]  # the tables of that size reading it (for messages)


@dataclass(frozen=True)
class ModuleInput:
    """What one embedding module is fed: its features, in the order of its KJT's keys."""

    path: str
    keys: tuple[str, ...]  # feature names
    slots: tuple[int, ...]  # for each key, its ``DataLayout.slots`` index


@dataclass(frozen=True)
class DataLayout:
    slots: tuple[IdSlot, ...]  # in spec order
    modules: tuple[ModuleInput, ...]  # in the spec's module order
    dense_in_features: int
    labelled: bool = True  # prediction reads data without labels

    @classmethod
    def of_spec(cls, spec: Spec, dense_in_features: int) -> DataLayout:
        slots: dict[tuple[str, int], list[str]] = {}
        for t in spec.tables:
            for f in t.feature_names:
                slots.setdefault((f, t.num_embeddings), []).append(t.name)
        index = {key: i for i, key in enumerate(slots)}
        modules = []
        for path in spec.modules:
            tables: list[TableSpec] = [t for t in spec.tables if t.module == path]
            keys = tuple(f for t in tables for f in t.feature_names)
            modules.append(ModuleInput(path, keys, tuple(index[(f, t.num_embeddings)]
                                                          for t in tables for f in t.feature_names)))
        return cls(tuple(IdSlot(f, rows, tuple(names)) for (f, rows), names in slots.items()),
                   tuple(modules), dense_in_features)

    @classmethod
    def per_feature(cls, spec: Spec, dense_in_features: int) -> DataLayout:
        """A slot for every feature of every table, module by module (synthetic data draws each
        feature of each module with its own table's pooling factor)."""
        slots: list[IdSlot] = []
        modules: list[ModuleInput] = []
        for path in spec.modules:
            tables = [t for t in spec.tables if t.module == path]
            first = len(slots)
            slots += [IdSlot(f, t.num_embeddings, (t.name,)) for t in tables for f in t.feature_names]
            modules.append(ModuleInput(path, tuple(s.column for s in slots[first:]), tuple(range(first, len(slots)))))
        return cls(tuple(slots), tuple(modules), dense_in_features)

    @property
    def id_columns(self) -> tuple[str, ...]:
        """The feature columns, each once, in spec order."""
        return tuple(dict.fromkeys(s.column for s in self.slots))

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column read: label (when ``labelled``), dense and the feature columns."""
        return (*((LABEL,) if self.labelled else ()), DENSE, *self.id_columns)

