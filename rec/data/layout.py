"""The columns training data must have for a spec, and how they feed the model's embedding modules.

One row per sample: ``label`` (0 or 1), ``dense`` (``dense_in_features`` floats) and one column per
feature name of the spec's tables, holding the sample's ids (docs/training.md, "Training data"),
and for a feature that a weighted table reads (``is_weighted``: TorchRec's id-score lists) a column
``<feature>_weights`` with a weight per id. A feature column that tables of several sizes read (two
modules may share a feature name) is one ``IdSlot`` per size: its ids are checked, or mapped, against
each table's rows; its weights are read once and fed only to the weighted modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from rec.errors import Problem
from rec.spec.types import Spec, TableSpec

LABEL = "label"
DENSE = "dense"
WEIGHTS_SUFFIX = "_weights"


def weights_column(feature: str) -> str:
    """The column holding the per-id weights of weighted feature ``feature``."""
    return feature + WEIGHTS_SUFFIX


@dataclass(frozen=True)
class IdSlot:
    """The ids of one feature column as one table size sees them."""

    column: str  # the feature name: the data's column
    rows: int  # the table's num_embeddings: ids must fall in [0, rows)
    tables: tuple[str, ...]  # the tables of that size reading it (for messages)
    weighted: bool = False  # a weighted table reads the column: its ids come with weights (``weights_column``)


@dataclass(frozen=True)
class ModuleInput:
    """What one embedding module is fed: its features, in the order of its KJT's keys."""

    path: str
    keys: tuple[str, ...]  # feature names
    slots: tuple[int, ...]  # for each key, its ``DataLayout.slots`` index
    weighted: bool = False  # a weighted EmbeddingBagCollection: its KJT carries its slots' weights


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
        weighted = {f for t in spec.tables if t.is_weighted for f in t.feature_names}
        index = {key: i for i, key in enumerate(slots)}
        modules = []
        for path in spec.modules:
            tables: list[TableSpec] = [t for t in spec.tables if t.module == path]
            keys = tuple(f for t in tables for f in t.feature_names)
            modules.append(ModuleInput(path, keys, tuple(index[(f, t.num_embeddings)]
                                                          for t in tables for f in t.feature_names),
                                       any(t.is_weighted for t in tables)))
        return cls(tuple(IdSlot(f, rows, tuple(names), f in weighted) for (f, rows), names in slots.items()),
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
            slots += [IdSlot(f, t.num_embeddings, (t.name,), t.is_weighted) for t in tables for f in t.feature_names]
            modules.append(ModuleInput(path, tuple(s.column for s in slots[first:]), tuple(range(first, len(slots))),
                                       any(t.is_weighted for t in tables)))
        return cls(tuple(slots), tuple(modules), dense_in_features)

    @property
    def id_columns(self) -> tuple[str, ...]:
        """The feature columns, each once, in spec order."""
        return tuple(dict.fromkeys(s.column for s in self.slots))

    @property
    def weighted_columns(self) -> tuple[str, ...]:
        """The feature columns whose ids come with weights, each once, in spec order."""
        return tuple(dict.fromkeys(s.column for s in self.slots if s.weighted))

    @property
    def weight_columns(self) -> tuple[str, ...]:
        """The weights columns (``weights_column``) of ``weighted_columns``, in the same order."""
        return tuple(weights_column(c) for c in self.weighted_columns)

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column read, each once: label (when ``labelled``), dense, the feature columns and the
        weights columns."""
        return tuple(dict.fromkeys((*((LABEL,) if self.labelled else ()), DENSE, *self.id_columns,
                                    *self.weight_columns)))

    def clashes(self, what: str = "--data") -> list[Problem]:
        """A feature named as the label or dense column, or as another, weighted, feature's weights
        column: one line per such feature (the data cannot hold both in one column)."""
        ids = set(self.id_columns)
        reserved = {**({LABEL: "the labels"} if self.labelled else {}), DENSE: "the dense features"}
        return [Problem(f"{what} column {name!r}", (
            f"would hold both the ids of feature {name!r} ({self._tables_of(name)}) and {meaning}; rename "
            "the feature in the spec")) for name, meaning in reserved.items() if name in ids] + [
            Problem(f"{what} column {weights_column(f)!r}", (
                f"would hold both the ids of feature {weights_column(f)!r} ({self._tables_of(weights_column(f))}) "
                f"and the weights of weighted feature {f!r} ({self._tables_of(f)}); rename one of these features "
                "in the spec")) for f in self.weighted_columns if weights_column(f) in ids]

    def _tables_of(self, column: str) -> str:
        names = list(dict.fromkeys(name for s in self.slots if s.column == column for name in s.tables))
        return f"table{'s' if len(names) > 1 else ''} {', '.join(names)}"

