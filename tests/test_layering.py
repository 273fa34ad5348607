"""The layers (docs/architecture.md): ``rec`` is the library and imports no tasks, flows, Prefect, Ray or
MLflow; ``tasks`` adapt it and import no flows; ``rec``'s folders import each other without a cycle,
lazily imported modules included."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.paths import ROOT

ORCHESTRATION = ("prefect", "ray", "mlflow")


def _imports(package: str) -> dict[Path, set[str]]:
    """Every module each file of ``package`` imports, at the top or inside a function."""
    found: dict[Path, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        found[path] = names
    return found


def _room(module: str) -> str | None:
    """A module's room in ``rec``: its folder (``rec.cost``), or the top-level module (``rec.units``)."""
    parts = module.split(".")
    if parts[0] != "rec" or len(parts) < 2:
        return None
    if (ROOT / "rec" / parts[1]).is_dir() or (ROOT / "rec" / f"{parts[1]}.py").is_file():
        return parts[1]
    return None


def test_the_library_imports_no_adapter_flow_or_orchestration():
    bad = sorted(f"{path.relative_to(ROOT)} imports {name}" for path, names in _imports("rec").items()
                 for name in names if name.split(".")[0] in ("tasks", "flows", *ORCHESTRATION))
    assert not bad, "\n".join(bad)
    bad = sorted(f"{path.relative_to(ROOT)} imports {name}" for path, names in _imports("tasks").items()
                 for name in names if name.split(".")[0] == "flows")
    assert not bad, "\n".join(bad)


def test_rec_rooms_import_each_other_without_a_cycle():
    edges: dict[str, set[str]] = defaultdict(set)
    for path, names in _imports("rec").items():
        me = _room(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for name in names:
            other = _room(name)
            if me and other and other != me:
                edges[me].add(other)
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(room: str, trail: list[str]) -> None:
        if state.get(room) == 2:
            return
        assert state.get(room) != 1, "import cycle between rec's rooms: " + " -> ".join([*trail, room])
        state[room] = 1
        for other in sorted(edges[room]):
            visit(other, [*trail, room])
        state[room] = 2
        order.append(room)

    for room in sorted(edges):
        visit(room, [])
    assert "cost" in order and "plan" in order  # the graph was read
