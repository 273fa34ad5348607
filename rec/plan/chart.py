"""``rank_load.png``: estimated time and memory per rank, readable from 2 to 1,024+ ranks.

Drawn with Pillow (tens of milliseconds; matplotlib would triple the time of a whole ``shardflow
plan``). One panel for the estimated time per rank, with the critical rank in red and the lower
bound; one panel per memory tier the plan uses (HBM on cuda, DDR), each with its capacity. Panels
keep their scale to what is used, so a small usage does not vanish under a large capacity; a
capacity off the scale is written out instead of drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rec.plan.metrics import shown_gap
from rec.plan.types import Plan
from rec.units import format_bytes

if TYPE_CHECKING:
    from PIL.ImageDraw import ImageDraw
    from PIL.ImageFont import FreeTypeFont, ImageFont

CHART_FILE = "rank_load.png"
WIDTH, PANEL_HEIGHT, HEADER, MARGIN_LEFT, MARGIN_RIGHT = 1200, 230, 64, 78, 24
BLUE, RED, GREEN, ORANGE, GRAY, INK = "#3b6fb6", "#d62728", "#2ca02c", "#ff7f0e", "#7f7f7f", "#222222"
SMALL_USE = 0.25  # below this share of the capacity, the panel scales to the usage instead


@dataclass(frozen=True)
class _Panel:
    title: str
    values: np.ndarray
    unit: str  # "ms" or "bytes"
    color: str
    lines: tuple[tuple[float, str, str], ...]  # (value, label, color) drawn across the panel
    highlight: int | None = None  # the bar drawn in red


def rank_load_chart(plan: Plan, path: str | Path) -> Path:
    """Write the chart of ``plan`` to ``path`` (PNG); returns the path."""
    from PIL import Image, ImageDraw, ImageFont

    panels = _panels(plan)
    height = HEADER + PANEL_HEIGHT * len(panels) + 30
    image = Image.new("RGB", (WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    font, bold = ImageFont.load_default(size=13), ImageFont.load_default(size=16)
    m = plan.metrics
    world = len(m.rank_perf)
    hosts = world // plan.topology.local_world_size
    draw.text((MARGIN_LEFT, 10), f"plan {plan.plan_id}: {len(plan.tables):,} tables on {world:,} "
              f"{plan.topology.compute_device.value} ranks ({hosts} host{'s' if hosts > 1 else ''})",
              fill=INK, font=bold)
    critical = int(np.argmax(m.rank_perf)) if world else 0
    draw.text((MARGIN_LEFT, 34), f"critical path {m.critical_path:.4g} ms on rank {critical}  |  "
              f"lower bound {m.lower_bound:.4g} ms  |  gap {100 * shown_gap(m.gap):.2f}%", fill=INK, font=font)
    for i, panel in enumerate(panels):
        top = HEADER + i * PANEL_HEIGHT
        _draw_panel(draw, font, panel, top, world, plan.topology.local_world_size,
                    last=i == len(panels) - 1)
    path = Path(path)
    image.save(path, format="PNG", compress_level=3)  # level 6 (the default) costs 0.1 s more
    return path


def _panels(plan: Plan) -> list[_Panel]:
    m = plan.metrics
    perf = np.asarray(m.rank_perf, dtype=float)
    critical = int(np.argmax(perf)) if len(perf) else None
    panels = [_Panel("estimated ms per iteration", perf, "ms", BLUE,
                     ((m.critical_path, f"critical path {m.critical_path:.4g} ms", RED),
                      (m.lower_bound, f"lower bound {m.lower_bound:.4g} ms", GRAY)), critical)]
    for name, used, cap, color in (("HBM", m.rank_hbm, m.rank_hbm_cap, GREEN),
                                   ("DDR", m.rank_ddr, m.rank_ddr_cap, ORANGE)):
        used_a, cap_a = np.asarray(used, dtype=float), np.asarray(cap, dtype=float)
        if not used_a.any():
            continue  # e.g. HBM on a cpu topology, DDR when every table is in HBM
        top = float(cap_a.max()) if len(cap_a) else 0.0
        share = float(used_a.max()) / top if top else 0.0
        shown = "<0.1%" if 0 < share < 0.001 else f"{share:.1%}"
        panels.append(_Panel(f"{name} per rank (max {format_bytes(used_a.max())}, "
                             f"{shown} of the usable {format_bytes(top)})", used_a, "bytes", color,
                             ((top, f"usable {name} {format_bytes(top)}", INK),)))
    return panels


def _draw_panel(draw: ImageDraw, font: FreeTypeFont | ImageFont, panel: _Panel, top: int, world: int,
                local: int, last: bool) -> None:
    left, right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    plot_top, plot_bottom = top + 30, top + PANEL_HEIGHT - 30
    draw.text((left, top + 4), panel.title, fill=INK, font=font)
    used_max = float(panel.values.max()) if len(panel.values) else 0.0
    line_max = max((v for v, _, _ in panel.lines), default=0.0)
    # Scale to the lines too, unless the usage is small against them (then say so in the legend).
    wanted = max(used_max, line_max) if used_max >= SMALL_USE * line_max else used_max
    ticks = _ticks(wanted * 1.04 or 1.0, panel.unit)
    scale = ticks[-1]
    height = plot_bottom - plot_top

    def y(value: float) -> float:
        return plot_bottom - height * min(value, scale) / scale

    for value in ticks:
        draw.line([(left, y(value)), (right, y(value))], fill="#eeeeee")
        label = _short(value, panel.unit)
        draw.text((left - 6 - draw.textlength(label, font=font), y(value) - 7), label, fill=GRAY, font=font)
    width = (right - left) / max(world, 1)
    if world <= 64 and world > local:  # host boundaries, when there are few enough to see
        for h in range(1, world // local):
            x = left + h * local * width
            draw.line([(x, plot_top), (x, plot_bottom)], fill="#cccccc")
    gap = max(1.0, 0.15 * width) if width >= 4 else 0.0
    for r, value in enumerate(panel.values):
        x0 = left + r * width + gap / 2
        x1 = max(x0 + width - gap, x0 + 1)
        color = RED if r == panel.highlight else panel.color
        draw.rectangle([x0, y(float(value)), x1, plot_bottom], fill=color)
    if panel.highlight is not None and len(panel.values):  # a marker: one bar of 1,024 is 1 px wide
        x = left + (panel.highlight + 0.5) * width
        ty = y(float(panel.values[panel.highlight])) - 3
        draw.polygon([(x - 5, ty - 8), (x + 5, ty - 8), (x, ty)], fill=RED)
    # The lines' legend goes in the title row, right-aligned, never over the bars.
    x = right
    for value, label, color in reversed(panel.lines):
        text = label + (" (off scale)" if value > scale else "")
        x -= draw.textlength(text, font=font)
        draw.text((x, top + 4), text, fill=color, font=font)
        x -= 26
        _legend_sample(draw, x, top + 12, color, dashed=color != RED)
        x -= 18
        if value <= scale:
            _line(draw, left, right, y(value), color, dashed=color != RED)
    draw.line([(left, plot_bottom), (right, plot_bottom)], fill=INK)
    step = max(1, int(np.ceil(world / 16)))
    for r in range(0, world, step):
        label = str(r)
        x = left + (r + 0.5) * width - draw.textlength(label, font=font) / 2
        draw.text((x, plot_bottom + 4), label, fill=GRAY, font=font)
    if last:
        draw.text((right - 40, plot_bottom + 4), "rank", fill=INK, font=font)


def _ticks(top: float, unit: str) -> list[float]:
    """0 and 3 to 6 round steps up to at least ``top`` (steps of 1, 2, 2.5 or 5 x 10^k; bytes in
    the unit format_bytes shows)."""
    from rec.tolerance import TIME_NOISE  # here: importing rec.search loads the whole search

    base = 1.0
    if unit == "bytes":
        while top >= 1024 * base and base < 1024**5:
            base *= 1024
    raw = top / base / 4
    magnitude = 10 ** np.floor(np.log10(raw)) if raw > 0 else 1.0
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw) * base
    count = int(np.ceil(top / step - TIME_NOISE))  # a ratio whole up to float noise: no extra tick
    return [k * step for k in range(count + 1)]


def _legend_sample(draw: ImageDraw, x: float, y: float, color: str, dashed: bool) -> None:
    if dashed:
        for start in (x, x + 11):
            draw.line([(start, y), (start + 7, y)], fill=color, width=2)
    else:
        draw.line([(x, y), (x + 18, y)], fill=color, width=2)


def _line(draw: ImageDraw, left: float, right: float, y: float, color: str, dashed: bool) -> None:
    if not dashed:
        draw.line([(left, y), (right, y)], fill=color, width=1)
        return
    _dashed(draw, left, right, y, color)


def _dashed(draw: ImageDraw, left: float, right: float, y: float, color: str) -> None:
    x = left
    while x < right:
        draw.line([(x, y), (min(x + 8, right), y)], fill=color, width=2)
        x += 13


def _short(value: float, unit: str) -> str:
    if unit == "bytes":
        return format_bytes(value).replace(".0 ", " ")
    return f"{value:g}"
