"""A sweep's report: the table of points and the accuracy-vs-size plot with its Pareto front,
as a self-contained HTML file (inline SVG) and JSON, under the project's ``reports/``."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from studio.core import figures
from studio.core.fsutil import atomic_write_json, atomic_write_text
from studio.core.project import Project
from studio.core.sweep import format_value
from studio.core.units import signed
from studio.engine.report_charts import svg_pareto
from studio.services.sweeps import size_figure


def fmt_bytes(v: float | None) -> str:
    """Bytes as every page writes them (binary units, one decimal)."""
    return figures.fmt_unit(v, "B")


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
            "dram_bytes": fig(p, "compiler_dram_bytes"), "vtcm_bytes": fig(p, "compiler_vtcm_bytes"),
            "tokens_per_s": tps, "tokens_chip": chip,
            "front": i in front, "best": i == rec["best"],
        })
    return rows


def scatter_svg(rec: dict[str, Any], width: int = 640, height: int = 360) -> str:
    """Accuracy (y) against deployed size (x), the Pareto front joined, the best ringed (the
    run report's Pareto chart); each axis names the source of its figures."""
    rows = [r for r in point_rows(rec) if r["accuracy"] is not None
            and r["size_bytes"] is not None]
    if not rows:
        return "<p>No point has both an accuracy and a size yet.</p>"
    acc_sources = sorted({r["accuracy_source"] for r in rows if r["accuracy_source"]})
    points = [{"label": r["label"], "x": r["size_bytes"] / 2**20, "y": r["accuracy"],
               "front": r["front"], "best": r["best"], "passed": r["state"] == "succeeded"}
              for r in rows]
    return svg_pareto(points, f"{rows[0]['size_title']} MiB ({rows[0]['size_source']})",
                      f"{rec.get('accuracy_title', 'accuracy')} ({', '.join(acc_sources)})",
                      width, height)


def render_html(project: Project, rec: dict[str, Any]) -> str:
    rows = point_rows(rec)
    best = next((r for r in rows if r["best"]), None)
    cells = []
    for r in rows:
        tps = (f"{r['tokens_per_s']:.1f} <small>(estimated, {html.escape(r['tokens_chip'])})"
               "</small>" if r["tokens_per_s"] is not None else "—")
        acc = (f"{r['accuracy']:.6f} <small>({r['accuracy_source']})</small>"
               if r["accuracy"] is not None else "—")
        ppl = (signed(r["perplexity_increase"], ".2%", "−") if r["perplexity_increase"] is not None
               else "—")
        mark = ("★ best" if r["best"] else "") + (" · front" if r["front"] else "")
        cells.append(
            f"<tr><td>{html.escape(r['label'])}</td><td>{html.escape(r['settings'])}</td>"
            f"<td>{html.escape(r['state'])}</td><td>{acc}</td><td>{ppl}</td>"
            f"<td>{fmt_bytes(r['weight_bytes'])} <small>({r['weight_source']})</small></td>"
            f"<td>{fmt_bytes(r['context_bytes'])}</td><td>{fmt_bytes(r['dram_bytes'])}</td>"
            f"<td>{fmt_bytes(r['vtcm_bytes'])}</td><td>{tps}</td>"
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
<th>DRAM per decode step (compiler)</th><th>VTCM per decode step (compiler)</th>
<th>decode tok/s</th><th></th><th>reason</th><th>run</th></tr>
{''.join(cells)}</table></body></html>
"""


def write_sweep_report(project: Project, rec: dict[str, Any]) -> Path:
    out = project.folder / "reports" / f"sweep-{rec['name']}.html"
    atomic_write_text(out, render_html(project, rec))
    atomic_write_json(out.with_suffix(".json"), rec)
    return out
