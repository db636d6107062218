"""The report's charts: plain functions that return SVG markup (inline in the HTML page,
rendered to images for the PDF). Every text inside is escaped here; the templates mark the
returned markup safe.

Each chart is a standalone ``<svg>`` with ``xmlns``, a white background and explicit width
and height, so that the same markup renders in a browser and in Qt's SVG renderer.
"""

from __future__ import annotations

import html
from typing import Any

SOURCE_COLORS = {"measured": "#1b7f3b", "simulated": "#8a5a00", "estimated": "#2f5da8",
                 "imported": "#6b3fa0"}
SERIES = ["#2f5da8", "#c0392b", "#1b7f3b", "#8a5a00", "#6b3fa0", "#117a8b"]
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'


def _e(x: Any) -> str:
    return html.escape(str(x))


def _open(width: int, height: int, label: str) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(label)}" {FONT}>',
            f'<rect width="{width}" height="{height}" fill="white"/>']


def _nice(v: float) -> str:
    return f"{v:.3g}"


def svg_lines(series: dict[str, list[float]], ylabel: str, width: int = 640,
              height: int = 240, xlabels: tuple[str, str] | None = None) -> str:
    """A small line chart; one polyline per series, shared axes (``xlabels``: what the first
    and last points are; steps by default). Empty string when there is nothing to draw."""
    pts = [v for s in series.values() for v in s]
    if not pts:
        return ""
    left, right, top, bottom = 56, 12, 24, 30
    ymax = max(pts) * 1.1 or 1.0
    n = max(len(s) for s in series.values())
    sx = (width - left - right) / max(1, n - 1)
    sy = (height - top - bottom) / ymax
    parts = _open(width, height, ylabel)
    parts += [f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" '
              f'y2="{height - bottom}" stroke="#888"/>',
              f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>']
    for i in range(5):
        y = ymax * i / 4
        py = height - bottom - y * sy
        parts.append(f'<text x="{left - 4}" y="{py + 4:.1f}" font-size="10" text-anchor="end">'
                     f"{_nice(y)}</text>")
    first, last = xlabels or ("step 1", f"step {n}")
    parts.append(f'<text x="{left}" y="{height - 8}" font-size="10">{_e(first)}</text>')
    parts.append(f'<text x="{width - right}" y="{height - 8}" font-size="10" '
                 f'text-anchor="end">{_e(last)}</text>')
    parts.append(f'<text x="4" y="12" font-size="10">{_e(ylabel)}</text>')
    for k, (name, vals) in enumerate(series.items()):
        color = SERIES[k % len(SERIES)]
        poly = " ".join(f"{left + i * sx:.1f},{height - bottom - v * sy:.1f}"
                        for i, v in enumerate(vals))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{poly}"/>')
        parts.append(f'<text x="{width - right - 4}" y="{top + 12 + 12 * k}" font-size="10" '
                     f'text-anchor="end" fill="{color}">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_bars(values: dict[str, float], unit: str, width: int = 640, color: str = SERIES[0],
             label_w: int = 170, sort: bool = True) -> str:
    """Horizontal bars, largest first (``sort``), each with its value; a negative value is
    drawn leftwards from the zero line in grey. Empty string when there is nothing."""
    if not values:
        return ""
    items = sorted(values.items(), key=lambda kv: -kv[1]) if sort else list(values.items())
    row = 18
    height = row * len(items) + 10
    vmax = max((v for _, v in items), default=0.0)
    vmin = min((v for _, v in items), default=0.0)
    span = (max(vmax, 0.0) - min(vmin, 0.0)) or 1.0
    texts = [f"{v + 0.0:.4g} {unit}".strip() for _, v in items]  # + 0.0: no "-0"
    plot_w = width - label_w - 12 - 6 * max(len(t) for t in texts)
    zero = label_w + plot_w * (-min(vmin, 0.0)) / span
    parts = _open(width, height, unit)
    for i, ((name, v), text) in enumerate(zip(items, texts, strict=True)):
        w = plot_w * abs(v) / span
        y = 4 + i * row
        x = zero if v >= 0 else zero - w
        fill = color if v >= 0 else "#9aa0a6"
        parts.append(f'<text x="{label_w - 6}" y="{y + 12}" font-size="11" '
                     f'text-anchor="end">{_e(name)}</text>')
        parts.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{row - 4}" '
                     f'fill="{fill}"/>')
        tx = max(zero, x + w) + 4
        parts.append(f'<text x="{tx:.1f}" y="{y + 12}" font-size="10">{_e(text)}</text>')
    if vmin < 0:
        parts.append(f'<line x1="{zero:.1f}" y1="0" x2="{zero:.1f}" y2="{height}" '
                     'stroke="#666"/>')
    parts.append("</svg>")
    return "".join(parts)


def svg_grouped_bars(labels: list[str], series: dict[str, tuple[list[float], str]],
                     unit: str, width: int = 900, height: int = 260) -> str:
    """Vertical bars, one group per label, one bar per series (name -> (values, colour))."""
    if not labels or not series:
        return ""
    vmax = max((v for vals, _ in series.values() for v in vals), default=1.0) or 1.0
    left, bottom, top = 50, 46, 34
    plot_h = height - bottom - top
    gw = (width - left - 10) / len(labels)
    bw = gw * 0.8 / len(series)
    parts = _open(width, height, unit)
    parts.append(f'<text x="4" y="14" font-size="11">{_e(unit)}</text>')
    for j, (name, (_, color)) in enumerate(series.items()):
        lx = left + 90 + 260 * j
        parts.append(f'<rect x="{lx}" y="4" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="13" font-size="11">{_e(name)}</text>')
    for i, lab in enumerate(labels):
        x0 = left + i * gw + gw * 0.1
        for j, (vals, color) in enumerate(series.values()):
            v = vals[i]
            h = plot_h * v / vmax
            x = x0 + j * bw
            y = top + plot_h - h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
                         f'fill="{color}"/><text x="{x + bw / 2:.1f}" y="{y - 3:.1f}" '
                         f'font-size="10" text-anchor="middle">{v:.0f}</text>')
        for k, line in enumerate(lab.split("\n")):
            parts.append(f'<text x="{left + i * gw + gw / 2:.1f}" '
                         f'y="{top + plot_h + 14 + 13 * k}" font-size="11" '
                         f'text-anchor="middle">{_e(line)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_paired_bars(rows: list[tuple[str, float | None, float | None]], names: tuple[str, str],
                    width: int = 700) -> str:
    """Two bars per row (the previous run, this run) scaled per row, each with its value:
    the run comparison. ``rows``: (label, previous, this)."""
    rows = [r for r in rows if r[1] is not None or r[2] is not None]
    if not rows:
        return ""
    label_w, row = 250, 30
    height = row * len(rows) + 30
    plot_w = width - label_w - 90
    colors = ("#9aa0a6", SERIES[0])
    parts = _open(width, height, "run comparison")
    for j, name in enumerate(names):
        lx = label_w + 180 * j
        parts.append(f'<rect x="{lx}" y="4" width="10" height="10" fill="{colors[j]}"/>'
                     f'<text x="{lx + 14}" y="13" font-size="11">{_e(name)}</text>')
    for i, (label, a, b) in enumerate(rows):
        y = 24 + i * row
        vmax = max(abs(v) for v in (a, b) if v is not None) or 1.0
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" font-size="11" '
                     f'text-anchor="end">{_e(label)}</text>')
        for j, v in enumerate((a, b)):
            yy = y + 2 + j * 12
            if v is None:
                parts.append(f'<text x="{label_w + 2}" y="{yy + 9}" font-size="9" '
                             'fill="#888">not in this run</text>')
                continue
            w = plot_w * abs(v) / vmax
            parts.append(f'<rect x="{label_w}" y="{yy}" width="{max(w, 0.5):.1f}" height="10" '
                         f'fill="{colors[j]}"/><text x="{label_w + w + 4:.1f}" y="{yy + 9}" '
                         f'font-size="9">{v:.4g}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_pareto(points: list[dict[str, Any]], x_title: str, y_title: str, width: int = 640,
               height: int = 340) -> str:
    """Accuracy (y) against size (x, MiB); the Pareto front joined, the best point ringed,
    a point whose gate failed hollow. ``points``: {label, x, y, front, best, passed}."""
    pts = [p for p in points if p.get("x") is not None and p.get("y") is not None]
    if not pts:
        return ""
    pad_l, pad_r, pad_t, pad_b = 78, 20, 20, 45
    xs, ys = [p["x"] for p in pts], [p["y"] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 - x0 < 1e-9:
        x0, x1 = x0 * 0.95, x1 * 1.05 + 1e-6
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 1e-4, y1 + 1e-4
    xm, ym = (x1 - x0) * 0.08, (y1 - y0) * 0.1
    x0, x1, y0, y1 = x0 - xm, x1 + xm, y0 - ym, y1 + ym

    def px(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * (width - pad_l - pad_r)

    def py(y: float) -> float:
        return height - pad_b - (y - y0) / (y1 - y0) * (height - pad_t - pad_b)

    out = _open(width, height, y_title)
    out += [f'<line x1="{pad_l}" y1="{height - pad_b}" x2="{width - pad_r}" '
            f'y2="{height - pad_b}" stroke="#444"/>',
            f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{height - pad_b}" stroke="#444"/>']
    for k in range(5):
        xv, yv = x0 + (x1 - x0) * k / 4, y0 + (y1 - y0) * k / 4
        out.append(f'<text x="{px(xv):.1f}" y="{height - pad_b + 15}" font-size="11" '
                   f'text-anchor="middle">{xv:.2f}</text>')
        out.append(f'<text x="{pad_l - 6}" y="{py(yv) + 4:.1f}" font-size="11" '
                   f'text-anchor="end">{yv:.5f}</text>')
    out.append(f'<text x="{(width + pad_l) / 2:.0f}" y="{height - 8}" font-size="11" '
               f'text-anchor="middle">{_e(x_title)} →</text>')
    mid = (height - pad_b) / 2
    out.append(f'<text x="14" y="{mid:.0f}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 14 {mid:.0f})">{_e(y_title)} →</text>')
    front = sorted((p for p in pts if p.get("front")), key=lambda p: p["x"])
    if len(front) > 1:
        line = " ".join(f"{px(p['x']):.1f},{py(p['y']):.1f}" for p in front)
        out.append(f'<polyline points="{line}" fill="none" stroke="#d9480f" '
                   'stroke-dasharray="4 3"/>')
    # points drawn (nearly) on top of each other share one label, at the first of them
    groups: list[tuple[float, float, list[str]]] = []
    for p in pts:
        x, y = px(p["x"]), py(p["y"])
        near = next((g for g in groups if abs(g[0] - x) < 12 and abs(g[1] - y) < 12), None)
        if near is None:
            groups.append((x, y, [p["label"]]))
        else:
            near[2].append(p["label"])
    for p in pts:
        x, y = px(p["x"]), py(p["y"])
        color = "#d9480f" if p.get("front") else "#868e96"
        fill = color if p.get("passed") else "white"
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{fill}" stroke="{color}" '
                   'stroke-width="2"/>')
        if p.get("best"):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="10" fill="none" '
                       'stroke="#2b8a3e" stroke-width="2"/>')
    for x, y, labels in groups:
        anchor, tx = ("end", x - 13) if x > width * 0.7 else ("start", x + 13)
        out.append(f'<text x="{tx:.1f}" y="{y + 4:.1f}" font-size="11" '
                   f'text-anchor="{anchor}">{_e(", ".join(labels))}</text>')
    out.append("</svg>")
    return "".join(out)
