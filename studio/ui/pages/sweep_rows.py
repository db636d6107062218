"""The Sweeps page's texts for a sweep's points (:mod:`studio.ui.pages.sweeps`), without Qt:
each row's cells and tooltips, and the best-point line."""

from __future__ import annotations

import html
from typing import Any

from studio.core import figures
from studio.core.sweep import BEST_RULES, Point
from studio.core.units import signed
from studio.services.sweep_report import fmt_bytes
from studio.services.sweeps import PointRun

SOURCES_TEXT = (
    "Where the figures come from: accuracy is measured on the HTP simulator — real HTP "
    "numerics, not a device; size is the compiled context binaries' file sizes (measured) "
    "and is what the front and the rule 'smallest' compare; weights are computed from the "
    "recipe (parameters × bytes per parameter); decode tok/s come from the performance model "
    "for the chip, not a device.")
EXAMPLE = """[[sweeps]]
name = "schemes"
best = "smallest"        # smallest | most-accurate | fastest
[sweeps.axes]
"quantization.scheme" = ["W8A16", "W8A8"]"""
COLUMNS = ["point", "settings", "state", "accuracy", "perplexity change", "size", "weights",
           "decode tok/s", "front / best", "run", "reason"]
COL = {name: i for i, name in enumerate(COLUMNS)}


def sources_of(rows: list[dict[str, Any]], key: str, default: str) -> str:
    """The sources the rows' ``key`` names (``a / b``), or ``default`` where none does."""
    found = sorted({r[key] for r in rows if r.get(key)})
    return " / ".join(found) or default


def size_title(rows: list[dict[str, Any]]) -> str:
    """What the size axis is (the compiled context binaries, measured, where compiled)."""
    r = next((r for r in rows if r.get("size_bytes") is not None), None)
    if r is None:
        return f"{figures.title('deployable_binary_bytes')}, MiB (measured)"
    return f"{r['size_title']}, MiB ({r['size_source']})"


def column_heads(rec: dict[str, Any], acc_source: str, wsrc: str,
                 chip: str) -> dict[str, tuple[str, str]]:
    """The table's headers that name a source: {column: (title, tooltip)}."""
    return {
        "accuracy": (f"{rec['accuracy_title']}\n({acc_source})",
                     f"{acc_source}: measured on the HTP simulator — real HTP numerics, not a "
                     "device"),
        "perplexity change": ("perplexity change\n(simulated)",
                              "the quantized model's perplexity on the HTP simulator against "
                              "FP32's, on the held-out text"),
        "size": ("size\n(measured)",
                 figures.tip("deployable_binary_bytes") + "\nOn the first target; the Pareto "
                 "front and the rule 'smallest' use it."),
        "weights": (f"{figures.title('matmul_weight_bytes')}\n({wsrc})",
                    figures.tip("matmul_weight_bytes") if wsrc == "estimated" else
                    f"{wsrc}: the compiled context binaries' file sizes"),
        "decode tok/s": (f"decode tok/s (estimated)\n{chip}",
                         f"estimated by the performance model for {chip}, not a device"),
    }


def cell_texts(r: dict[str, Any], now: list[dict[str, Any]]) -> list[str]:
    """A point row's cells in :data:`COLUMNS` order; ``now``: its jobs running now (their stage
    and progress join its state)."""
    p = r["point"]
    state = r["state"]
    if p.get("kept"):
        state += " (recorded earlier)"
    if now:
        state += " · " + ", ".join(f"{j['stage']} {j['progress']:.0%}" for j in now)
    acc = f"{r['accuracy']:.6f}" if r["accuracy"] is not None else "—"
    ppl = (signed(r["perplexity_increase"], ".2%", "−")
           if r["perplexity_increase"] is not None
           else "—")
    tps = f"{r['tokens_per_s']:.1f}" if r["tokens_per_s"] is not None else "—"
    marks = []
    if r["best"]:
        marks.append("★ best")
    if r["front"]:
        marks.append("front")
    cells = [r["label"], r["settings"], state, acc, ppl, fmt_bytes(r["size_bytes"]),
             fmt_bytes(r["weight_bytes"]), tps, " · ".join(marks),
             str(r["run_id"] or ""), r["reason"]]
    return cells


def cell_tips(r: dict[str, Any]) -> dict[str, str]:
    """A point row's tooltips by column: its gates, where its accuracy was measured, what its
    weights and speed are, its context binaries' size."""
    p = r["point"]
    gates = p.get("gates") or []
    gate_text = "\n".join(
        f"{'✓' if g['passed'] else '✗'} {g['gate']} [{g.get('target', '')}]: "
        f"{g['value']:.4f} against {g['threshold']}" for g in gates)
    acc = p.get("accuracy") or {}
    w = p.get("weight_bytes") or {}
    speed = next(iter((p.get("tokens_per_s") or {}).values()), {})
    tips = {"state": gate_text or r["state"],
            "reason": r["reason"] or gate_text or "",
            "accuracy": (f"{acc.get('source', '')} on {acc.get('target', '')}"
                         if acc else "not measured"),
            "weights": w.get("detail", "") if w else "",
            "decode tok/s": speed.get("detail", "") if speed else "",
            "run": "Open run shows it on the Validation page" if r["run_id"] else ""}
    if r.get("context_bytes"):
        tips["size"] = (f"compiled context binaries: {fmt_bytes(r['context_bytes'])} "
                        "(measured, file sizes)")
    return tips


def best_html(rec: dict[str, Any], rows: list[dict[str, Any]], running: bool) -> str:
    """The best-point line (rich text): the best point by the sweep's rule and its figures, or
    why there is none yet."""
    rule = rec["best_rule"]
    best = next((r for r in rows if r["best"]), None)
    why = html.escape(BEST_RULES.get(rule, ""))
    if best is not None:
        figs = []
        if best["accuracy"] is not None:
            figs.append(f"{html.escape(rec['accuracy_title'])} {best['accuracy']:.6f}")
        if best["size_bytes"] is not None:
            figs.append(f"{best['size_title']} {fmt_bytes(best['size_bytes'])}")
        if best["tokens_per_s"] is not None:
            figs.append(f"{best['tokens_per_s']:.1f} tok/s (estimated)")
        return (f"<b>Best by the rule {html.escape(rule)}</b> ({why}): "
                f"<b>{html.escape(best['label'])}</b> — {html.escape(best['settings'])}"
                + (f" · {' · '.join(figs)}" if figs else ""))
    if rec["state"] == "not run":
        return (f"Not run yet: run the sweep to compare its points. The "
                f"best point will follow the rule <b>{html.escape(rule)}"
                f"</b> ({why}), among the points that pass every gate.")
    if running:
        return (f"Best by the rule <b>{html.escape(rule)}</b> ({why}): "
                "none yet — it is chosen among finished points that pass "
                "every gate.")
    return (f"<b>No point passes every gate</b> (rule {html.escape(rule)}): see each point's "
            "reason below; loosen a gate or sweep other settings.")


def point_run(p: dict[str, Any]):
    """A PointRun rebuilt from a point's dict (what ``point_result`` reads)."""
    return PointRun(Point(p["index"], p["settings"]), state=p["state"], reason=p["reason"],
                    run_id=p.get("run_id"), figures=p)
