"""Minimal line charts as inline SVG, so the demo's picture needs nothing beyond the standard
library (matplotlib stays optional). Only what the demo page draws: lines, dots, dashed
reference lines, axes with round ticks, a legend."""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Callable, Sequence

__all__ = ["Series", "chart", "nice_ticks"]

Point = tuple[float, float]


@dataclasses.dataclass
class Series:
    label: str
    points: Sequence[Point]
    colour: str
    style: str = "line"  # "line", "dots" (with a line through them), "segments" or "hline"
    width: float = 1.5
    opacity: float = 1.0


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"tick range must be finite, got {lo}..{hi}")
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)  # the last tick is at or beyond hi: nothing is cut off
    return [round(i * step, 10) for i in range(first, last + 1)]


def _fmt(v: float) -> str:
    if abs(v) >= 10_000:
        return f"{v / 1000:.0f}k"
    return f"{v:g}"


def chart(series: Sequence[Series], *, title: str, xlabel: str, ylabel: str,
          width: int = 760, height: int = 360, ylim: tuple[float, float] | None = None) -> str:
    """One chart as an <svg> element (a string). Series with no points are left out."""
    shown = [s for s in series if s.points]
    xs = [p[0] for s in shown if s.style != "hline" for p in s.points] or [0.0, 1.0]
    ys = [p[1] for s in shown for p in s.points] or [0.0, 1.0]
    left, right, top, bottom = 64, 200, 34, 46
    pw, ph = width - left - right, height - top - bottom
    # x spans the data exactly (steps have no round end); y gets round ends for reading values.
    x0, x1 = min(xs), max(xs)
    xt = [t for t in nice_ticks(x0, x1) if x0 <= t <= x1]
    yt = nice_ticks(*(ylim or (min(ys), max(ys))))
    y0, y1 = yt[0], yt[-1]

    def px(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * pw

    def py(y: float) -> float:
        y = min(max(y, y0), y1)  # a spike off the scale is drawn at its edge
        return top + (1 - (y - y0) / ((y1 - y0) or 1.0)) * ph

    esc = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14" font-weight="bold">{esc(title)}</text>']
    for t in xt:
        out.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{top + ph}" '
                   'stroke="#eee"/>')
        out.append(f'<text x="{px(t):.1f}" y="{top + ph + 16}" text-anchor="middle">'
                   f'{_fmt(t)}</text>')
    for t in yt:
        out.append(f'<line x1="{left}" y1="{py(t):.1f}" x2="{left + pw}" y2="{py(t):.1f}" '
                   'stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               'stroke="#888"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">'
               f'{esc(xlabel)}</text>')
    out.append(f'<text transform="translate(16 {top + ph / 2}) rotate(-90)" '
               f'text-anchor="middle">{esc(ylabel)}</text>')
    for i, s in enumerate(shown):
        out.extend(_draw(s, px, py, left, left + pw))
        ly = top + 8 + 20 * i
        lx = left + pw + 14
        dash = ' stroke-dasharray="6 4"' if s.style == "hline" else ""
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 22}" y2="{ly}" stroke="{s.colour}" '
                   f'stroke-width="{max(2.0, s.width)}"{dash}/>')
        out.append(f'<text x="{lx + 28}" y="{ly + 4}">{esc(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _draw(s: Series, fx: Callable[[float], float], fy: Callable[[float], float], xa: float,
          xb: float) -> list[str]:
    col, op = s.colour, f' stroke-opacity="{s.opacity}"'
    if s.style == "hline":
        y = fy(s.points[0][1])
        return [f'<line x1="{xa}" y1="{y:.1f}" x2="{xb}" y2="{y:.1f}" stroke="{col}" '
                f'stroke-width="{s.width}" stroke-dasharray="6 4"/>']
    pts = list(s.points)
    if s.style == "segments":  # points in pairs: (start, end) of one separate segment each
        segs = [f"M{fx(a[0]):.1f},{fy(a[1]):.1f}L{fx(b[0]):.1f},{fy(b[1]):.1f}"
                for a, b in zip(pts[::2], pts[1::2], strict=False)]
        return [f'<path d="{" ".join(segs)}" fill="none" stroke="{col}" '
                f'stroke-width="{s.width}"{op}/>']
    path = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in pts)
    out = [f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="{s.width}"'
           f'{op} stroke-linejoin="round"/>']
    if s.style == "dots":
        out += [f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3.5" fill="{col}"/>'
                for x, y in pts]
    return out
