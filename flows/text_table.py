"""Aligned plain-text tables for the CLI's reports."""

from __future__ import annotations

from collections.abc import Sequence


def render_table(header: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[str] = ()) -> str:
    """Columns padded to their widest cell; columns named in ``right`` (numbers) are right-aligned."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    aligned = [
        "  ".join(cell.rjust(w) if name in right else cell.ljust(w)
                  for cell, w, name in zip(row, widths, header, strict=True))
        for row in cells
    ]
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([aligned[0].rstrip(), rule, *(line.rstrip() for line in aligned[1:])])
