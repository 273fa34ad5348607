"""Aligned plain-text tables for the reports of the CLI and of the drop-in planner."""

from __future__ import annotations

from collections.abc import Sequence

GAP = "  "  # between columns


def render_table(header: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[str] = ()) -> str:
    """Columns padded to their widest cell; columns named in ``right`` (numbers) are right-aligned.
    A column with an empty name (a marker such as ``<- critical path``) gets no rule under it."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = column_widths(cells)
    aligned = [
        GAP.join(cell.rjust(w) if name in right else cell.ljust(w)
                 for cell, w, name in zip(row, widths, header, strict=True))
        for row in cells
    ]
    rule = GAP.join(("-" if name else " ") * w for w, name in zip(widths, header, strict=True))
    return "\n".join([aligned[0].rstrip(), rule.rstrip(), *(line.rstrip() for line in aligned[1:])])


def column_widths(cells: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]


def fit_columns(header: Sequence[str], rows: Sequence[Sequence[object]], priority: Sequence[str],
                width: int) -> list[str]:
    """The columns a table of ``width`` characters has room for: taken in ``priority`` order while
    they fit (the first always; a column left out of ``priority`` never), in the header's order."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = dict(zip(header, column_widths(cells), strict=True))
    chosen: set[str] = set()
    used = -len(GAP)
    for name in priority:
        need = widths[name] + len(GAP)
        if chosen and used + need > width:
            continue  # a narrower column further down may still fit
        chosen.add(name)
        used += need
    return [name for name in header if name in chosen]


def select(header: Sequence[str], rows: Sequence[Sequence[object]],
           columns: Sequence[str]) -> tuple[list[str], list[list[object]]]:
    """``header`` and ``rows`` with only ``columns``."""
    keep = [header.index(name) for name in columns]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]
