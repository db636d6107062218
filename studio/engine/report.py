"""Reports: one data model (the versioned report JSON) and one renderer (jinja2 templates
under ``resources/templates/report``) for every format: a self-contained HTML page
(inline CSS and SVG charts), Markdown for pull requests, and the HTML the PDF printer takes
(charts as images that it renders from the same SVG).

``build_report`` gathers what a run produced (its stage results, the comparison with the
previous run, the sensitivity ranking, the project's sweeps) into plain JSON; the renderers
read only that JSON, so a report can be rendered again from its ``report.json``.
"""

from __future__ import annotations

import json
import re
import time
from functools import cache
from pathlib import Path
from typing import Any

from studio.core import figures
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json, atomic_write_text
from studio.core.gates import evaluate_gates
from studio.core.lazyimport import lazy_module
from studio.core.project import Project
from studio.core.resources import resources_dir
from studio.core.stagegraph import DECLARATIONS, STAGES
from studio.core.units import format_bytes
from studio.engine.report_charts import (
    SERIES,
    SOURCE_COLORS,
    svg_bars,
    svg_grouped_bars,
    svg_lines,
    svg_paired_bars,
    svg_pareto,
)
from studio.engine.waterfall import with_estimate

jinja2 = lazy_module("jinja2")
markupsafe = lazy_module("markupsafe")

__all__ = ["SOURCE_COLORS", "SERIES", "svg_bars", "svg_grouped_bars", "svg_lines",
           "build_report", "render_html", "render_markdown", "render_print", "charts",
           "write_report", "render_comparison", "render_layers", "render_layerdiff"]

SCHEMA_VERSION = 1
#: what a report JSON's ``$schema`` names: resources/schemas/report-1.schema.json
SCHEMA_ID = "urn:qstudio:schema:report:1"
SCHEMA_PATH = resources_dir() / "schemas" / f"report-{SCHEMA_VERSION}.schema.json"
TEMPLATES = resources_dir() / "templates"
FORMATS = ("html", "md", "pdf", "json")

#: the figures a reader looks at first, in this order (their titles and how they are
#: written come from the catalogue of figures, as on every page)
HEADLINE = ("logits_cosine_mean", "top1_agreement", "perplexity_fp32", "perplexity_quantized",
            "output_cosine_min", "ranking_top1", "decode_tokens_per_s", "prefill_ms",
            "latency_ms", "decode_step_total", "inference_total")
#: timings: from the simulator they follow the host CPU and are not device latency
TIMINGS = {"decode_tokens_per_s", "prefill_ms", "decode_ms_per_token", "latency_ms",
           "inferences_per_s", "decode_step_total", "inference_total"}


# ---- the data ---------------------------------------------------------------------------------
#: the job labels' prefixes whose figures the headline takes: the stages that declare
#: ``headline`` (the validate, run and profile stages' own figures, not the same quantities
#: measured along the way by another stage), each over its targets or devices
HEADLINE_STAGES = tuple(f"{d.name}[" for d in DECLARATIONS if d.headline)


def _headline(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name in HEADLINE:
        for m in metrics:
            if m["name"] == name and str(m.get("stage", "")).startswith(HEADLINE_STAGES):
                row = {k: m.get(k, "") for k in ("name", "value", "unit", "source", "device",
                                                 "target", "stage")}
                row["title"] = figures.title(name)
                row["text"] = figures.fmt(name, m["value"], m["unit"])
                if name in TIMINGS and m["source"] == "simulated":
                    row["note"] = "HTP simulator on the host CPU: not device latency"
                out.append(row)
    return out


def _op_breakdown(st: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for label, p in st.items():
        if not label.startswith(("profile[", "graph-profile[")) or not p.get("by_op_type"):
            continue
        source = p.get("source", "simulated")
        unit = p.get("unit", "")
        out.append({
            "label": label, "where": label.split("[", 1)[1][:-1], "source": source,
            "unit": unit, "ops": p.get("ops"),
            "what": "one inference" if label.startswith("graph-") else "one decode step",
            "by_op_type": {k: float(v) for k, v in p["by_op_type"].items()},
            "note": ("simulated: the HTP simulator's count, not device latency"
                     if source == "simulated" else ""),
        })
    return out


def _sensitivity(st: dict[str, Any], artifacts: dict[str, Path]) -> dict[str, Any] | None:
    """Per-layer sensitivity: every weighted layer and key activation raised alone, from the
    stage's ``sensitivity.json`` when stored (else the top five in its result)."""
    res = st.get("sensitivity")
    if not res:
        return None
    full = None
    folder = artifacts.get("sensitivity")
    if folder is not None:
        try:
            full = json.loads((Path(folder) / "sensitivity.json").read_text())
        except (OSError, ValueError):
            full = None
    rows: list[dict[str, Any]] = []
    if full is not None:
        for e in full.get("layers", []) + full.get("points", []):
            d = (e.get("raise") or {}).get("delta") or {}
            if "kl_divergence" in d:
                rows.append({"name": e["name"], "kind": e.get("kind", "layer"),
                             "kl_change": d["kl_divergence"],
                             "perplexity_change": d.get("perplexity")})
    else:
        for kind, key in (("layer", "top_raise"), ("point", "points_raise")):
            rows += [{"name": r["name"], "kind": kind, "kl_change": r["kl_divergence"],
                      "perplexity_change": r.get("perplexity")} for r in res.get(key) or []]
    rows.sort(key=lambda r: r["kl_change"])
    blocks = [{"name": r["name"], "kl_change": r["kl_divergence"],
               "perplexity_change": r.get("perplexity")} for r in res.get("blocks_raise") or []]
    return {"source": (full or {}).get("source", "measured"),
            "device": (full or {}).get("device", "host-cpu"),
            "scheme": res.get("scheme"), "high": res.get("high"), "low": res.get("low"),
            "graph": res.get("graph", "prefill"), "tokens": res.get("heldout_tokens"),
            "complete": full is not None, "layers": rows, "blocks": blocks,
            "base": res.get("base"), "fp32": res.get("fp32"), "htp": res.get("htp")}


def _autoprecision(st: dict[str, Any]) -> dict[str, Any] | None:
    res = st.get("autoprecision")
    if not res:
        return None
    return {k: res.get(k) for k in ("summary", "met", "raised", "high", "overrides", "metric",
                                    "before", "after", "curve")} | {"source": "measured",
                                                                    "device": "host-cpu"}


def _binaries(st: dict[str, Any]) -> list[dict[str, Any]]:
    """The deployable binaries of each target's compile, each with how it was checked
    ("executed on the HTP simulator" or "checked by structure only: a device executes it"),
    and whether its bundle ships it."""
    out = []
    for label, r in st.items():
        if label.split("[", 1)[0] != "compile" or not r.get("binaries"):
            continue
        target = label.split("[", 1)[1].rstrip("]") if "[" in label else ""
        bundle = st.get(f"bundle[{target}]") or {}
        ships = set(bundle.get("ctx_bins") or [])
        out.append({"target": target, "rows": [
            dict(b, shipped=(b["file"] in ships) if bundle else None)
            for b in r["binaries"]]})
    return out


def _waterfall(st: dict[str, Any], targets: list[str]) -> dict[str, Any] | None:
    d = (st.get("waterfall") or {}).get("waterfall")
    if not d:
        return None

    chip = targets[0] if targets else "snapdragon-8-gen-3"
    try:
        return with_estimate(d, chip)
    except StudioError as exc:
        return {"error": exc.message}


def build_report(project: Project, results: dict[str, dict[str, Any]],
                 comparison: dict[str, Any] | None = None,
                 artifacts: dict[str, Path] | None = None,
                 sweeps: list[dict[str, Any]] | None = None,
                 run: dict[str, Any] | None = None,
                 device_plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's data (what ``report.json`` holds, see ``SCHEMA_PATH``).

    ``results``: stage label -> the job's result, in pipeline order; ``comparison``: this run
    against the previous one with results (``core.compare``); ``artifacts``: stage label ->
    its artifact folder (for files a result only summarises); ``sweeps``: the project's
    recorded sweeps with their Pareto fronts (None: not looked at); ``run``: the run in the
    history this report is of; ``device_plan``: what the NPU maps per target
    (``studio.services.deviceplan.plans_dict``; None: not looked at)."""
    gates = []
    for label, r in results.items():
        decl = STAGES.get(label.split("[", 1)[0])
        if decl is not None and decl.gated:  # validate's, and the bundle's shipped binaries
            for g in evaluate_gates(project.gates, r):
                g["target"] = r.get("target", "")
                g["stage"] = decl.name
                # the figure a gate checks comes from the device that ran the validation
                g["source"] = r.get("source", "simulated")
                gates.append(g)
    metrics = [dict(m, stage=label) for label, r in results.items() for m in r.get("metrics", [])]
    st = {label: {k: v for k, v in r.items() if k != "metrics"} for label, r in results.items()}
    figures: dict[str, Any] = {
        "op_breakdown": _op_breakdown(st),
        "waterfall": _waterfall(st, list(project.targets)),
        "sensitivity": _sensitivity(st, artifacts or {}),
        "autoprecision": _autoprecision(st),
        "sweeps": sweeps,
        "device_plan": device_plan,
        "binaries": _binaries(st),
    }
    return {
        "$schema": SCHEMA_ID, "schema_version": SCHEMA_VERSION,
        "project": project.name, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "run": run, "model": project.model, "export": project.export,
        "quantization": project.quantization, "targets": list(project.targets),
        "gates": gates, "gates_passed": all(g["passed"] for g in gates),
        "headline": _headline(metrics), "metrics": metrics, "comparison": comparison,
        "figures": figures, "stages": st,
    }


# ---- charts -----------------------------------------------------------------------------------
def _comparison_rows(data: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    comp = data.get("comparison")
    if not comp:
        return []
    both = [m for m in comp["metrics"] if m["a"] is not None and m["b"] is not None]
    # the headline figures both runs have; runs that share none of them (a partial run) get
    # the figures they do share
    chosen = [m for m in both if m["name"] in HEADLINE] or both
    several = len(data.get("targets") or []) > 1
    rows = []
    for m in chosen:
        where = m["device"] + (f" / {m['target']}" if several and m.get("target") else "")
        rows.append((f"{m['name']} ({where})"[:44], m["a"], m["b"]))
    return rows[:12]


def charts(data: dict[str, Any]) -> dict[str, str]:
    """Every chart of the report as SVG markup, by name (only those with data)."""
    out: dict[str, str] = {}
    comp = data.get("comparison")
    if comp:
        out["comparison"] = svg_paired_bars(
            _comparison_rows(data), (f"run {comp['run_a']['id']}", f"run {comp['run_b']['id']}"))
    st = data["stages"]
    runs = {k: v for k, v in st.items() if k.startswith("run[")}
    series = {}
    for r in runs.values():
        dev = r.get("device", "") + (f" / {r['target']}" if r.get("target") else "")
        series[f"{dev} ({r.get('source', '')})"] = [s * 1e3 for s in r.get("step_s", [])]
    out["decode"] = svg_lines(series, "ms per token")
    figs = data.get("figures") or {}
    for i, p in enumerate(figs.get("op_breakdown") or []):
        out[f"profile-{i}"] = svg_bars(p["by_op_type"], p["unit"],
                                       color=SOURCE_COLORS.get(p["source"], SERIES[0]))
    for i, (_label, d) in enumerate(_layerdiffs(st)):
        out[f"layerdiff-{i}"] = _layerdiff_svg(d)
    sens = figs.get("sensitivity")
    if sens and sens["layers"]:
        top = sens["layers"][:20]
        out["sensitivity"] = svg_bars({r["name"]: -r["kl_change"] for r in top},
                                      "nats KL drop", width=760, label_w=260,
                                      color=SOURCE_COLORS.get(sens["source"], SERIES[0]))
    wf = figs.get("waterfall")
    if wf and not wf.get("error"):
        steps = wf["steps"]
        out["waterfall"] = svg_grouped_bars(
            [f"{r['label']}\nppl {r['ppl']:.1f}" for r in steps], {
                "host CPU (measured)": ([r["tokens_per_s"] for r in steps],
                                        SOURCE_COLORS["measured"]),
                f"{wf['chip_name']} (estimated)": (
                    [r.get("estimated_tokens_per_s") or 0.0 for r in steps],
                    SOURCE_COLORS["estimated"]),
            }, "decode tok/s")
    for i, sw in enumerate(figs.get("sweeps") or []):
        out[f"sweep-{i}"] = svg_pareto(
            [{"label": p["label"], "x": None if p["size_bytes"] is None
              else p["size_bytes"] / 2**20, "y": p["accuracy"], "front": p["front"],
              "best": p["best"], "passed": p["passed"]} for p in sw["points"]],
            f"{sw['size_title']} MiB ({sw['size_source']})",
            f"{sw['accuracy_title']} ({sw['accuracy_source']})")
    return {k: v for k, v in out.items() if v}


def _layerdiffs(st: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(k, d) for k, d in st.items()
            if k.startswith("layerdiff[") and (d.get("curves") or {}).get("names")]


def _layerdiff_svg(d: dict[str, Any]) -> str:
    c, titles = d["curves"], d.get("pair_titles", {})
    return svg_lines({titles.get(p, p): c[p]["rel_error"] for p in d.get("pairs", []) if p in c},
                     "relative error ||a - b|| / ||b|| between blocks",
                     xlabels=(c["names"][0], c["names"][-1]))


PRINT_WIDTH = 620  # px of a chart on an A4 page
_SIZE = re.compile(r'<svg[^>]*\bwidth="(\d+)"[^>]*\bheight="(\d+)"')


def chart_size(svg: str) -> tuple[int, int]:
    m = _SIZE.search(svg)
    return (int(m.group(1)), int(m.group(2))) if m else (640, 240)


# ---- rendering --------------------------------------------------------------------------------
def _fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return "—" if v is None else str(v)


def _size(n: int | None) -> str:
    return "unknown" if n is None else format_bytes(int(n))


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "—"


def _md(v: Any) -> str:
    """A Markdown table cell: pipes and line breaks escaped."""
    return str(v).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _dev(m: dict[str, Any]) -> str:
    return str(m.get("device", "")) + (f" / {m['target']}" if m.get("target") else "")


@cache
def _env(markdown: bool = False):
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=not markdown,
        trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True)
    env.filters.update(fmt=_fmt, when=_when, md=_md, dev=_dev, size=_size)
    env.tests["startingwith"] = lambda s, prefix: str(s).startswith(prefix)
    env.globals.update(SOURCE_COLORS=SOURCE_COLORS, HEADLINE=HEADLINE)
    return env


def _context(data: dict[str, Any], mode: str) -> dict[str, Any]:
    svgs = charts(data)
    sizes = {k: chart_size(v) for k, v in svgs.items()}
    if mode == "print":  # a printed page is narrower than a screen: charts fit its width
        sizes = {k: (min(w, PRINT_WIDTH), round(h * min(1.0, PRINT_WIDTH / w)))
                 for k, (w, h) in sizes.items()}
    return {"d": data, "st": data["stages"], "figs": data.get("figures") or {}, "mode": mode,
            "charts": {k: markupsafe.Markup(v) for k, v in svgs.items()}, "sizes": sizes,
            "layerdiffs": _layerdiffs(data["stages"])}


def render_html(data: dict[str, Any]) -> str:
    """The self-contained HTML page: inline CSS, inline SVG, nothing fetched."""
    return _env().get_template("report/report.html.j2").render(_context(data, "html"))


def render_print(data: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The HTML a PDF printer takes (Qt's rich text: tables and images, no inline SVG) and
    the charts its ``<img src="chart:NAME">`` tags stand for, as SVG markup."""
    ctx = _context(data, "print")
    return (_env().get_template("report/report.html.j2").render(ctx),
            {k: str(v) for k, v in ctx["charts"].items()})


def render_markdown(data: dict[str, Any]) -> str:
    """Markdown for a pull request: the gates, the headline figures with their sources and
    the comparison with the previous run."""
    return _env(markdown=True).get_template("report/report.md.j2").render(
        _context(data, "md"))


def _section(name: str, **ctx: Any) -> str:
    return _env().get_template(f"report/{name}.html.j2").render(**ctx).strip()


def render_comparison(comp: dict[str, Any] | None) -> str:
    """The "Compared with run N" section alone (settings changed, metric deltas)."""
    data = {"comparison": comp, "stages": {}}
    svgs = charts(data)

    return _section("comparison", d=data, mode="html",
                    charts={k: markupsafe.Markup(v) for k, v in svgs.items()},
                    sizes={k: chart_size(v) for k, v in svgs.items()})


def render_layers(layers: list[dict[str, Any]]) -> str:
    """Per-layer precision as the quantize stage applied it: every layer an override
    changed, and a count of those the scheme set ("" without layers)."""
    return _section("layers", layers=layers)


def render_layerdiff(d: dict[str, Any]) -> str:
    """The layer diff: relative error along depth for each pair ("" without curves)."""
    if not (d.get("curves") or {}).get("names"):
        return ""

    return _section("layerdiff", ld=d, i=0, mode="html",
                    charts={"layerdiff-0": markupsafe.Markup(_layerdiff_svg(d))}, sizes={})


def render(data: dict[str, Any], fmt: str) -> str:
    """``data`` as html, md or json text (the PDF is printed by the front end)."""
    if fmt == "html":
        return render_html(data)
    if fmt == "md":
        return render_markdown(data)
    if fmt == "json":
        return json.dumps(data, indent=1, sort_keys=True, default=str) + "\n"
    raise StudioError(f"--format {fmt}: not one of html, md, json")


def write_report(project: Project, results: dict[str, dict[str, Any]],
                 out_dir: Path, comparison: dict[str, Any] | None = None,
                 artifacts: dict[str, Path] | None = None,
                 sweeps: list[dict[str, Any]] | None = None,
                 run: dict[str, Any] | None = None,
                 device_plan: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """report.html and report.json into ``out_dir`` (the report stage's artifact)."""
    data = build_report(project, results, comparison, artifacts, sweeps, run, device_plan)
    html_path, json_path = out_dir / "report.html", out_dir / "report.json"
    atomic_write_json(json_path, data)
    atomic_write_text(html_path, render_html(data))
    return html_path, json_path
