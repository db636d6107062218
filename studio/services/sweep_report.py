"""A sweep's report: the table of points and the accuracy-vs-size plot with its Pareto front,
as a self-contained HTML file (inline SVG) and JSON, under the project's ``reports/``."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from studio.core.fsutil import atomic_write_json, atomic_write_text
from studio.core.project import Project
from studio.core.sweep import format_value
from studio.services.sweeps import size_figure


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v / 2**20:.2f} MiB"


def fig(p: dict[str, Any], name: str) -> float | None:
    f = p.get(name)
    return f.get("value") if isinstance(f, dict) else None


def first_speed(p: dict[str, Any]) -> tuple[float | None, str]:
    speed = p.get("tokens_per_s") or {}
    for chip, f in speed.items():
        return f["value"], chip
    return None, ""


def point_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per point for a table: settings, state, figures with their sources."""
    rows = []
    front = set(rec["pareto_front"])
    for i, p in enumerate(rec["points"]):
        tps, chip = first_speed(p)
        rows.append({
            "label": p["label"], "settings": ", ".join(
                f"{k}={format_value(v)}" for k, v in p["settings"].items()),
            "state": p["state"], "reason": p["reason"], "run_id": p["run_id"],
            "accuracy": fig(p, "accuracy"),
            "accuracy_source": (p.get("accuracy") or {}).get("source", ""),
            "perplexity_increase": fig(p, "perplexity_increase"),
            "weight_bytes": fig(p, "weight_bytes"),
            "weight_source": (p.get("weight_bytes") or {}).get("source", ""),
            "size_bytes": (size_figure(p) or {}).get("value"),
            "size_source": (size_figure(p) or {}).get("source", ""),
            "size_title": (size_figure(p) or {}).get("title", ""),
            "context_bytes": fig(p, "context_bytes"),
            "tokens_per_s": tps, "tokens_chip": chip,
            "front": i in front, "best": i == rec["best"],
        })
    return rows


def scatter_svg(rec: dict[str, Any], width: int = 640, height: int = 360) -> str:
    """Accuracy (y) against deployed size (x), the Pareto front joined, the best ringed."""
    rows = [r for r in point_rows(rec) if r["accuracy"] is not None
            and r["size_bytes"] is not None]
    if not rows:
        return "<p>No point has both an accuracy and a size yet.</p>"
    pad_l, pad_r, pad_t, pad_b = 70, 20, 20, 45
    xs = [r["size_bytes"] / 2**20 for r in rows]
    ys = [r["accuracy"] for r in rows]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
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

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<line x1="{pad_l}" y1="{height - pad_b}" x2="{width - pad_r}" '
           f'y2="{height - pad_b}" stroke="#444"/>',
           f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{height - pad_b}" stroke="#444"/>']
    for k in range(5):
        xv = x0 + (x1 - x0) * k / 4
        yv = y0 + (y1 - y0) * k / 4
        out.append(f'<text x="{px(xv):.1f}" y="{height - pad_b + 15}" '
                   f'text-anchor="middle">{xv:.2f}</text>')
        out.append(f'<text x="{pad_l - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">'
                   f'{yv:.5f}</text>')
    title = html.escape(rec.get("accuracy_title", "accuracy"))
    out.append(f'<text x="{(width + pad_l) / 2:.0f}" y="{height - 8}" text-anchor="middle">'
               f'{html.escape(rows[0]["size_title"])} MiB ({rows[0]["size_source"]}) →</text>')
    out.append(f'<text x="14" y="{(height - pad_b) / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {(height - pad_b) / 2:.0f})">{title} '
               '(simulated) →</text>')
    front = sorted((r for r in rows if r["front"]), key=lambda r: r["size_bytes"])
    if len(front) > 1:
        pts = " ".join(f"{px(r['size_bytes'] / 2**20):.1f},{py(r['accuracy']):.1f}"
                       for r in front)
        out.append(f'<polyline points="{pts}" fill="none" stroke="#d9480f" '
                   'stroke-dasharray="4 3"/>')
    labels: dict[tuple[int, int], list[str]] = {}  # points drawn on top of each other
    for r in rows:
        x, y = px(r["size_bytes"] / 2**20), py(r["accuracy"])
        labels.setdefault((round(x / 8), round(y / 8)), []).append(r["label"])
    for r in rows:
        x, y = px(r["size_bytes"] / 2**20), py(r["accuracy"])
        color = "#d9480f" if r["front"] else "#868e96"
        fill = color if r["state"] == "succeeded" else "white"
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{fill}" stroke="{color}" '
                   'stroke-width="2"/>')
        if r["best"]:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="10" fill="none" '
                       'stroke="#2b8a3e" stroke-width="2"/>')
        group = labels.pop((round(x / 8), round(y / 8)), None)
        if group:
            out.append(f'<text x="{x + 8:.1f}" y="{y - 7:.1f}">'
                       f'{html.escape(", ".join(group))}</text>')
    out.append("</svg>")
    return "\n".join(out)


def render_html(project: Project, rec: dict[str, Any]) -> str:
    rows = point_rows(rec)
    best = next((r for r in rows if r["best"]), None)
    cells = []
    for r in rows:
        tps = (f"{r['tokens_per_s']:.1f} <small>(estimated, {html.escape(r['tokens_chip'])})"
               "</small>" if r["tokens_per_s"] is not None else "—")
        acc = (f"{r['accuracy']:.6f} <small>({r['accuracy_source']})</small>"
               if r["accuracy"] is not None else "—")
        ppl = (f"{r['perplexity_increase']:+.2%}" if r["perplexity_increase"] is not None
               else "—")
        mark = ("★ best" if r["best"] else "") + (" · front" if r["front"] else "")
        cells.append(
            f"<tr><td>{html.escape(r['label'])}</td><td>{html.escape(r['settings'])}</td>"
            f"<td>{html.escape(r['state'])}</td><td>{acc}</td><td>{ppl}</td>"
            f"<td>{fmt_bytes(r['weight_bytes'])} <small>({r['weight_source']})</small></td>"
            f"<td>{fmt_bytes(r['context_bytes'])}</td><td>{tps}</td>"
            f"<td>{mark.strip(' ·')}</td><td>{html.escape(r['reason'])}</td>"
            f"<td>{r['run_id'] or ''}</td></tr>")
    best_line = (f"Best by rule <b>{html.escape(rec['best_rule'])}</b>: {best['label']} "
                 f"({html.escape(best['settings'])})" if best else
                 f"No point passes every gate (rule {html.escape(rec['best_rule'])}).")
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>Sweep {html.escape(rec['name'])} — {html.escape(project.name)}</title>
<style>body{{font-family:sans-serif;margin:24px;color:#222}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:4px 8px;
text-align:left}}th{{background:#f1f3f5}}small{{color:#666}}</style></head><body>
<h1>Sweep {html.escape(rec['name'])}</h1>
<p>Project {html.escape(project.name)} · {len(rows)} points · state {html.escape(rec['state'])}
· executor {html.escape(rec.get('executor') or '')}</p>
<p>{best_line}</p>
<h2>Accuracy against size</h2>
<p>Filled: every gate passed; hollow: a gate failed. Joined: the Pareto front (no other point
is both more accurate and smaller). Accuracy is measured on the HTP simulator (real HTP
numerics); size is the compiled context binaries' bytes on the first target (measured file
sizes); weight bytes are computed from the recipe; decode tok/s come from the performance
model, not a device.</p>
{scatter_svg(rec)}
<h2>Points</h2>
<table><tr><th>point</th><th>settings</th><th>state</th><th>{html.escape(rec['accuracy_title'])}
</th><th>perplexity change</th><th>weights</th><th>context binaries (measured)</th>
<th>decode tok/s</th><th></th><th>reason</th><th>run</th></tr>
{''.join(cells)}</table></body></html>
"""


def write_sweep_report(project: Project, rec: dict[str, Any]) -> Path:
    out = project.folder / "reports" / f"sweep-{rec['name']}.html"
    atomic_write_text(out, render_html(project, rec))
    atomic_write_json(out.with_suffix(".json"), rec)
    return out
