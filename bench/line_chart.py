"""A line chart as a small SVG file, with nothing but the standard library: the benchmarks'
pictures (for example recovery time against model size) render in the docs as they are."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

WIDTH, PLOT_HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 40, 60
LEGEND_LINE = 20
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _ticks(high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values from 0 to at least ``high``."""
    raw = high / count if high > 0 else 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [step * i for i in range(math.ceil(high / step) + 1)]


def line_chart(
    path: Path,
    title: str,
    x_label: str,
    y_label: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
) -> None:
    """Write ``series`` (name: its ``(x, y)`` points) as lines with markers, both axes from
    0, the legend below."""
    points = [p for line in series.values() for p in line]
    x_ticks = _ticks(max(x for x, _ in points))
    y_ticks = _ticks(max(y for _, y in points))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PLOT_HEIGHT - TOP - BOTTOM
    height = PLOT_HEIGHT + LEGEND_LINE * len(series)

    def at(x: float, y: float) -> tuple[float, float]:
        return LEFT + x / x_ticks[-1] * plot_w, TOP + plot_h - y / y_ticks[-1] * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
    ]
    for tick in x_ticks:
        x, _ = at(tick, 0)
        parts.append(f'<line x1="{x}" y1="{TOP}" x2="{x}" y2="{TOP + plot_h}" stroke="#ddd"/>')
        parts.append(f'<text x="{x}" y="{TOP + plot_h + 18}" text-anchor="middle">{tick:g}</text>')
    for tick in y_ticks:
        _, y = at(0, tick)
        parts.append(f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + plot_w}" y2="{y}" stroke="#ddd"/>')
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4}" text-anchor="end">{tick:g}</text>')
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{PLOT_HEIGHT - 20}" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    parts.append(
        f'<text transform="translate(18 {TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    for index, (name, line) in enumerate(series.items()):
        colour = COLOURS[index % len(COLOURS)]
        placed = [at(x, y) for x, y in sorted(line)]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in placed)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" '
                     'stroke-width="2"/>')  # fmt: skip
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in placed]
        legend_y = PLOT_HEIGHT + LEGEND_LINE * index
        parts.append(f'<line x1="{LEFT}" y1="{legend_y}" x2="{LEFT + 20}" y2="{legend_y}" '
                     f'stroke="{colour}" stroke-width="2"/>')  # fmt: skip
        parts.append(f'<text x="{LEFT + 26}" y="{legend_y + 4}">{escape(name)}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")
