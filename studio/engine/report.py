"""Reports: JSON for CI and a self-contained HTML page (tables and inline SVG plots)."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json, atomic_write_text
from studio.core.gates import evaluate_gates
from studio.core.project import Project

SOURCE_COLORS = {"measured": "#1b7f3b", "simulated": "#8a5a00", "estimated": "#2f5da8",
                 "imported": "#6b3fa0"}
SERIES = ["#2f5da8", "#c0392b", "#1b7f3b", "#8a5a00", "#6b3fa0", "#117a8b"]


def _e(x: Any) -> str:
    return html.escape(str(x))


def badge(source: str) -> str:
    color = SOURCE_COLORS.get(source, "#555")
    return f'<span class="badge" style="background:{color}">{_e(source)}</span>'


def _fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return _e(v)


def svg_lines(series: dict[str, list[float]], ylabel: str, width: int = 640,
              height: int = 240, xlabels: tuple[str, str] | None = None) -> str:
    """A small line chart; one polyline per series, shared axes (``xlabels``: what the first
    and last points are; steps by default)."""
    pts = [v for s in series.values() for v in s]
    if not pts:
        return "<p>No data.</p>"
    left, right, top, bottom = 56, 12, 24, 30
    ymax = max(pts) * 1.1 or 1.0
    n = max(len(s) for s in series.values())
    sx = (width - left - right) / max(1, n - 1)
    sy = (height - top - bottom) / ymax
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{_e(ylabel)}">',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" '
             f'y2="{height - bottom}" stroke="#888"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>']
    for i in range(5):
        y = ymax * i / 4
        py = height - bottom - y * sy
        parts.append(f'<text x="{left - 4}" y="{py + 4:.1f}" font-size="10" text-anchor="end">'
                     f"{y:.3g}</text>")
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


def svg_bars(values: dict[str, float], unit: str, width: int = 640) -> str:
    """Horizontal bars, largest first."""
    if not values:
        return "<p>No data.</p>"
    items = sorted(values.items(), key=lambda kv: -kv[1])
    row, label_w = 18, 160
    height = row * len(items) + 20
    vmax = max(v for _, v in items) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for i, (name, v) in enumerate(items):
        w = (width - label_w - 80) * v / vmax
        y = 4 + i * row
        parts.append(f'<text x="{label_w - 6}" y="{y + 12}" font-size="11" '
                     f'text-anchor="end">{_e(name)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{row - 4}" '
                     f'fill="{SERIES[0]}"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 12}" font-size="10">'
                     f"{v:.4g} {_e(unit)}</text>")
    parts.append("</svg>")
    return "".join(parts)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:980px;color:#222;line-height:1.4}
h1{margin-bottom:0}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:1.8em}
table{border-collapse:collapse;margin:0.6em 0;font-size:14px}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}.badge{color:#fff;border-radius:3px;padding:1px 6px;font-size:11px}
.pass{color:#1b7f3b;font-weight:600}.fail{color:#c0392b;font-weight:600}
.muted{color:#666;font-size:13px}pre{background:#f6f6f6;padding:6px;white-space:pre-wrap}
"""


def _setting(v: Any) -> str:
    if v is None:
        return "<span class='muted'>not set</span>"
    if isinstance(v, dict) and not v:
        return "<span class='muted'>none</span>"
    if isinstance(v, dict):
        return "<br>".join(f"<code>{_e(k)}</code> = {_e(x)}" for k, x in v.items())
    if isinstance(v, list):
        return _e(", ".join(map(str, v)))
    return _e(v)


def render_comparison(comp: dict[str, Any] | None) -> str:
    """The "Compared with run N" section: the settings that changed since the previous run
    with results, and every metric's delta with its source."""
    if comp is None:
        return ("<h2>Compared with the previous run</h2><p>No previous run with results: this "
                "is the first run of the project, so there is nothing to compare with.</p>")
    a, b = comp["run_a"]["id"], comp["run_b"]["id"]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(comp["run_a"]["created"]))
    out = [f"<h2>Compared with run {a}</h2>",
           f"<p class='muted'>This run (run {b}) against run {a}, the previous run with "
           f"results (started {started}).</p>"]
    if not comp.get("settings_recorded"):
        out.append("<p>The settings of one of the runs were not recorded: which settings "
                   "changed is unknown.</p>")
    elif comp["settings"]:
        out.append("<h3>Changed settings</h3><table><tr><th>setting</th>"
                   f"<th>run {a}</th><th>this run</th></tr>")
        for row in comp["settings"]:
            out.append(f"<tr><td><code>{_e(row['key'])}</code></td><td>{_setting(row['a'])}</td>"
                       f"<td>{_setting(row['b'])}</td></tr>")
        out.append("</table>")
    else:
        out.append(f"<p>No setting changed since run {a}.</p>")
    if not comp["metrics"]:
        out.append("<p>Neither run recorded a metric.</p>")
        return "\n".join(out)
    out.append("<h3>Metric deltas</h3><table><tr><th>metric</th><th>device</th>"
               f"<th>source</th><th>run {a}</th><th>this run</th><th>delta</th>"
               "<th>change</th><th></th></tr>")
    for m in comp["metrics"]:
        dev = m["device"] + (f" / {m['target']}" if m.get("target") else "")
        unit = f" {_e(m['unit'])}" if m.get("unit") else ""
        va = "—" if m["a"] is None else _fmt(m["a"]) + unit
        vb = "—" if m["b"] is None else _fmt(m["b"]) + unit
        delta = "—" if m["delta"] is None else f"{m['delta']:+.4g}"
        rel = "—" if m["relative"] is None else f"{m['relative']:+.2%}"
        if m["a"] is None or m["b"] is None:
            mark = "<span class='muted'>only in " + (f"run {a}" if m["b"] is None
                                                      else "this run") + "</span>"
        elif m["better"] is True:
            mark = "<span class='pass'>better</span>"
        elif m["better"] is False:
            mark = "<span class='fail'>worse</span>"
        else:
            mark = "<span class='muted'>same</span>"
        out.append(f"<tr><td>{_e(m['name'])}</td><td>{_e(dev)}</td><td>{badge(m['source'])}</td>"
                   f"<td>{va}</td><td>{vb}</td><td>{delta}</td><td>{rel}</td><td>{mark}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def render_layers(layers: list[dict[str, Any]]) -> str:
    """Per-layer precision as the quantize stage applied it (the recipe module's rule):
    every layer an override changed, and a count of those the scheme set."""
    if not layers:
        return ""
    changed = [r for r in layers
               if "override" in r["weight_rule"] or "override" in r["activation_rule"]]
    out = [f"<h2>Per-layer precision</h2><p class='muted'>{len(layers)} weighted layers as "
           f"quantize applied them: {len(layers) - len(changed)} by the scheme, "
           f"{len(changed)} by an override.</p>"]
    if changed:
        out.append("<table><tr><th>layer</th><th>weights</th><th>activations</th>"
                   "<th>rule</th></tr>")
        for r in changed:
            rule = (r["weight_rule"] if r["weight_rule"] == r["activation_rule"]
                    else f"weights: {r['weight_rule']}; activations: {r['activation_rule']}")
            out.append(f"<tr><td><code>{_e(r['layer'])}</code></td><td>{_e(r['weight'])}</td>"
                       f"<td>{_e(r['activation'])}</td><td>{_e(rule)}</td></tr>")
        out.append("</table>")
    return "\n".join(out)


def build_report(project: Project, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    gates = []
    for label, r in results.items():
        if label.startswith(("validate[", "graph-validate[")):
            for g in evaluate_gates(project.gates, r):
                g["target"] = r.get("target", "")
                gates.append(g)
    metrics = [dict(m, stage=label) for label, r in results.items() for m in r.get("metrics", [])]
    return {
        "project": project.name, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": project.model, "export": project.export, "quantization": project.quantization,
        "targets": project.targets, "gates": gates,
        "gates_passed": all(g["passed"] for g in gates), "metrics": metrics,
        "stages": {label: {k: v for k, v in r.items() if k not in ("metrics",)}
                   for label, r in results.items()},
    }


def render_layerdiff(d: dict[str, Any]) -> str:
    """The layer diff: relative error along depth for each pair, and where they part."""
    c = d.get("curves") or {}
    titles = d.get("pair_titles", {})
    if not c.get("names"):
        return ""
    out = [f"<h2>Layer diff {_e(d.get('target', ''))} {badge('measured')} "
           f"{badge(d.get('source', 'simulated'))}</h2>",
           f"<p class='muted'>{_e(d.get('graph', 'prefill'))} graph, {d.get('windows')} held-out "
           f"window(s) of {d.get('window_tokens')} tokens, {d.get('probes')} tensors. Host QDQ "
           "is measured on the host CPU; HTP figures come from the "
           f"{_e(d.get('device', 'HTP simulator'))}.</p>",
           svg_lines({titles.get(p, p): c[p]["rel_error"] for p in d.get("pairs", []) if p in c},
                     "relative error ||a - b|| / ||b|| between blocks",
                     xlabels=(c["names"][0], c["names"][-1])),
           f"<p>{_e(d.get('summary', ''))}</p>"]
    return "".join(out)


def svg_grouped_bars(labels: list[str], series: dict[str, tuple[list[float], str]],
                     unit: str, width: int = 900, height: int = 260) -> str:
    """Vertical bars, one group per label, one bar per series (name -> (values, colour))."""
    if not labels or not series:
        return "<p>No data.</p>"
    vmax = max((v for vals, _ in series.values() for v in vals), default=1.0) or 1.0
    left, bottom, top = 50, 46, 34
    plot_h = height - bottom - top
    gw = (width - left - 10) / len(labels)
    bw = gw * 0.8 / len(series)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<text x="4" y="14" font-size="11">{_e(unit)}</text>']
    for j, (name, (_, color)) in enumerate(series.items()):
        lx = left + 90 + 200 * j
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


def render_waterfall(d: dict[str, Any], targets: list[str]) -> str:
    """The optimization waterfall: measured on the host CPU, estimated for the first target."""
    from studio.engine.waterfall import with_estimate

    chip = targets[0] if targets else "snapdragon-8-gen-3"
    try:
        d = with_estimate(d, chip)
    except StudioError as exc:
        return f"<h2>Optimization waterfall</h2><p>{_e(exc.message)}</p>"
    steps = d["steps"]
    labels = [f"{r['label']}\nppl {r['ppl']:.1f}" for r in steps]
    out = [f"<h2>Optimization waterfall {badge('measured')} {badge('estimated')}</h2>",
           f"<p class='muted'>Each step on top of the last: decode tok/s on the host CPU "
           f"(measured, the step's own graphs in ONNX Runtime; quantized steps run as QDQ in "
           f"float there) and on {_e(d['chip_name'])} (estimated by the performance model), "
           f"with the held-out perplexity measured on the host. Window {d['window']} of "
           f"{d['context']} tokens; speculative: prompt lookup, k ≤ {d['k']}, "
           f"{d['tokens_per_pass']:.2f} tokens per target pass; pruned without block(s) "
           f"{_e(d['dropped_blocks'])}.</p>",
           svg_grouped_bars(labels, {
               "host CPU (measured)": ([r["tokens_per_s"] for r in steps], SOURCE_COLORS["measured"]),
               f"{d['chip_name']} (estimated)": ([r.get("estimated_tokens_per_s") or 0.0
                                                  for r in steps], SOURCE_COLORS["estimated"]),
           }, "decode tok/s"),
           "<table><tr><th>step</th><th>host CPU tok/s</th><th>chip tok/s</th>"
           "<th>perplexity</th><th>change</th><th>note</th></tr>"]
    for r in steps:
        e = r.get("estimated_tokens_per_s")
        out.append(f"<tr><td>{_e(r['label'])}</td><td>{r['tokens_per_s']:.1f} "
                   f"{badge('measured')}</td><td>{(f'{e:.1f}' if e else '–')} "
                   f"{badge('estimated')}</td><td>{r['ppl']:.2f}</td>"
                   f"<td>{r['ppl_change']:+.1%}</td><td class='muted'>{_e(r.get('note', ''))}"
                   "</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def render_ablation(t: dict[str, Any]) -> str:
    out = [f"<h2>Block ablation {badge('measured')}</h2>",
           f"<p class='muted'>Held-out perplexity ({t['tokens']} tokens, host CPU, FP32) with "
           f"each block dropped; all {t['num_blocks']} blocks: {t['baseline_ppl']:.2f}. The "
           f"pruned checkpoint leaves out {_e(t['dropped'])}: {t['pruned_ppl']:.2f} "
           f"({t['pruned_delta']:+.1%}).</p>",
           "<table><tr><th>rank</th><th>dropped block</th><th>perplexity</th><th>change</th></tr>"]
    for i, r in enumerate(t["blocks"]):
        out.append(f"<tr><td>{i + 1}</td><td>{r['block']}</td><td>{r['ppl']:.2f}</td>"
                   f"<td>{r['delta']:+.1%}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    """A table of already-escaped cells."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_graph(st: dict[str, Any]) -> str:
    """The sections of an encoder's or an ONNX graph's run: import, rewrites, placement per
    chip, validation per output (and the encoder's retrieval check), latency per device."""
    out = []
    imp = st.get("import")
    if imp:
        out.append(f"<h2>Graph</h2><p>{_e(imp.get('summary', ''))}</p>")
        ops = imp.get("op_types") or {}
        if ops:
            out.append("<p class='muted'>Ops: " + ", ".join(
                f"{_e(k)} ×{v}" for k, v in sorted(ops.items(), key=lambda x: -x[1])) + "</p>")
    q = st.get("graph-quantize")
    if q:
        out.append("<h2>Rewrites and quantization</h2>")
        if q.get("rewrites"):
            out.append(_html_table(["rewrite", "what", "nodes", "for the HTP"], [
                [_e(r["rewrite"]), _e(r["description"]), str(len(r["nodes"])),
                 _e(r.get("refused") or "—")] for r in q["rewrites"]]))
            c = q.get("rewrite_check") or {}
            if c:
                out.append(f"<p>Rewritten vs original (FP32, host CPU, {c['samples']} samples): "
                           f"worst cosine {_fmt(c['worst_cosine'], 6)}, max |error| "
                           f"{_fmt(c['max_abs_error'], 6)} {badge('measured')}</p>")
        else:
            out.append("<p>No rewrite applied.</p>")
        out.append(f"<p>{_e(q.get('summary', ''))}. Validation on "
                   f"{_e(q.get('validation_from', ''))}.</p>")
    for label, c in st.items():
        if not label.startswith("graph-compile["):
            continue
        p = c.get("placement") or {}
        out.append(f"<h2>Placement on {_e(label[14:-1])}</h2><p>{_e(c.get('summary', ''))}: "
                   f"{p.get('qnn_nodes', '?')} of {p.get('total_nodes', '?')} nodes on the NPU in "
                   f"{p.get('qnn_subgraphs', '?')} subgraph(s); {p.get('transitions', 0)} "
                   f"NPU↔CPU transitions carrying {p.get('bytes_crossing') or 0} bytes per "
                   "inference.</p>")
        if p.get("cpu_nodes"):
            out.append(_html_table(["node on the CPU", "op", "the EP's reason"], [
                [f"<code>{_e(n['name'])}</code>", _e(n["op_type"]), _e(n.get("reason", ""))]
                for n in p["cpu_nodes"]]))
    vals = {k: v for k, v in st.items() if k.startswith("graph-validate[")}
    if vals:
        out.append("<h2>Validation: FP32 (CPU) vs deployed, per output</h2>")
        out.append(_html_table(["target", "output", "worst cosine", "max |error|", "source"], [
            [_e(v.get("target")), _e(name), _fmt(o["cosine"]), _fmt(o["max_abs_error"]),
             badge(v.get("source", "simulated"))]
            for v in vals.values() for name, o in v.get("outputs", {}).items()]))
        for v in vals.values():
            out.append(f"<p class='muted'>{_e(v.get('target'))}: {v.get('samples')} samples "
                       f"({_e(v.get('on', ''))}); the quantized graph on the host CPU: worst "
                       f"cosine {_fmt(v['host_qdq']['output_cosine_min'])} "
                       f"{badge('measured')}</p>")
            r = v.get("ranking")
            if r:
                out.append(f"<p><b>Retrieval check, {_e(v.get('target'))}</b> "
                           f"{badge(v.get('source', 'simulated'))} — {r['queries']} queries over "
                           f"the shipped set: top-1 the same as FP32 for "
                           f"{r['top1_agreement']:.0%}, Kendall's tau {r['mean_kendall_tau']:.3f}, "
                           f"recall@1 {r['recall_at_1_deployed']:.0%} (FP32 "
                           f"{r['recall_at_1_reference']:.0%}); embedding cosine "
                           f"{_fmt(r['embedding_cosine_mean'])} (min "
                           f"{_fmt(r['embedding_cosine_min'])}).</p>")
    runs = {k: v for k, v in st.items() if k.startswith("graph-run[")}
    if runs:
        out.append("<h2>Latency per inference</h2>")
        out.append(_html_table(["device", "median", "min – max", "per second", "source"], [
            [_e(r.get("device", "") + (f" / {r['target']}" if r.get("target") else "")),
             f"{r['latency']['median_ms']:.2f} ms",
             f"{r['latency']['min_ms']:.2f} – {r['latency']['max_ms']:.2f} ms",
             f"{r['latency']['per_s']:.1f}", badge(r["source"])] for r in runs.values()]))
        out.append("<p class='muted'>Simulator timings follow the host CPU; they are not "
                   "Snapdragon latency.</p>")
    return "\n".join(out)


def render_html(data: dict[str, Any]) -> str:
    st = data["stages"]
    kind = data["model"].get("kind", "causal-lm")
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>QStudio report: "
           f"{_e(data['project'])}</title><style>{CSS}</style></head><body>",
           f"<h1>{_e(data['project'])}</h1>",
           f"<p class='muted'>QStudio report, {_e(data['created'])}. Model "
           f"<code>{_e(data['model']['source'])}</code> ({_e(kind)}); recipe "
           f"{_e(data['quantization']['scheme'])} {_e(data['quantization']['weight_granularity'])}"
           + (f"; prompt {data['export']['prompt_length']}, context "
              f"{data['export']['context_length']}" if kind == "causal-lm" else
              f"; placement {_e(data['quantization'].get('placement', 'strict'))}")
           + f"; targets {_e(', '.join(data['targets']))}.</p>",
           "<p class='muted'>Every figure carries its source: "
           + " ".join(badge(s) for s in SOURCE_COLORS)
           + ". Simulator timings follow the host CPU and are not device latency.</p>"]
    out.append("<h2>Accuracy gates</h2>")
    if data["gates"]:
        out.append("<table><tr><th>gate</th><th>target</th><th>value</th><th>threshold</th>"
                   "<th>result</th></tr>")
        for g in data["gates"]:
            cls, word = ("pass", "pass") if g["passed"] else ("fail", "FAIL")
            out.append(f"<tr><td>{_e(g['gate'])}</td><td>{_e(g['target'])}</td>"
                       f"<td>{_fmt(g['value'])}</td><td>{_fmt(g['threshold'])}</td>"
                       f"<td class='{cls}'>{word}</td></tr>")
        out.append("</table>")
    else:
        out.append("<p>No validation ran in this pipeline.</p>")
    out.append(render_comparison(data.get("comparison")))
    vals = {k: v for k, v in st.items() if k.startswith("validate[")}
    if vals:
        out.append("<h2>Validation: FP32 (CPU) vs quantized</h2><table><tr><th>target</th>"
                   "<th>runtime</th><th>logits cosine (mean / min)</th><th>max |error|</th>"
                   "<th>top-1 agreement</th><th>perplexity</th><th>source</th></tr>")
        for label, v in vals.items():
            tgt = v.get("target", label)
            out.append(f"<tr><td>{_e(tgt)}</td><td>FP32, host CPU (reference)</td>"
                       f"<td>—</td><td>—</td><td>—</td><td>{_fmt(v['perplexity_fp32'])}</td>"
                       f"<td>{badge('measured')}</td></tr>")
            # the HTP row's label and source come from the device that ran it
            for key, name, src in (("host_qdq", "quantized QDQ, host CPU", "measured"),
                                   ("htp", f"quantized, {v.get('device', 'HTP simulator')}",
                                    v.get("source", "simulated"))):
                r = v[key]
                out.append(
                    f"<tr><td>{_e(tgt)}</td><td>{name}</td><td>{_fmt(r['logits_cosine_mean'])} / "
                    f"{_fmt(r['logits_cosine_min'])}</td><td>{_fmt(r['logits_max_abs_error'])}</td>"
                    f"<td>{r['top1_agreement']:.1%}</td><td>{_fmt(r['perplexity'])}</td>"
                    f"<td>{badge(src)}</td></tr>")
        out.append("</table><p class='muted'>Teacher-forced on held-out text "
                   f"({next(iter(vals.values()))['tokens']} tokens).</p>")
        for v in vals.values():
            out.append(f"<p><b>Greedy, {_e(v.get('target'))}</b> "
                       f"{badge(v.get('source', 'simulated'))} — "
                       f"{v['greedy_agreement']:.0%} of tokens identical position by position, "
                       f"{v.get('greedy_prefix_agreement', 0):.0%} before the first divergence "
                       f"({v.get('greedy_prompts', 1)} prompts)<br>Project prompt, FP32: "
                       f"<code>{_e(v['greedy_fp32'])}</code><br>HTP: "
                       f"<code>{_e(v['greedy_htp'])}</code></p>")
    out.append(render_graph(st))
    out.append(render_layers(st.get("quantize", {}).get("layers") or []))
    runs = {k: v for k, v in st.items() if k.startswith("run[")}
    if runs:
        out.append("<h2>Generation</h2><table><tr><th>device</th><th>prefill</th>"
                   "<th>decode per token (median)</th><th>tok/s</th><th>source</th>"
                   "<th>output</th></tr>")
        series = {}
        for r in runs.values():
            steps = r.get("step_s", [])
            med = sorted(steps)[len(steps) // 2] if steps else 0.0
            dev = r.get("device", "") + (f" / {r['target']}" if r.get("target") else "")
            series[dev] = [s * 1e3 for s in steps]
            out.append(f"<tr><td>{_e(dev)}</td><td>{r['prefill_s'] * 1e3:.1f} ms</td>"
                       f"<td>{med * 1e3:.2f} ms</td><td>{(1 / med if med else 0):.1f}</td>"
                       f"<td>{badge(r['source'])}</td><td><pre>{_e(r['prompt'])}"
                       f"<b>{_e(r['text'])}</b></pre></td></tr>")
        out.append("</table><h3>Decode latency per step</h3>")
        out.append(svg_lines(series, "ms per token"))
        out.append("<p class='muted'>Simulator timings follow the host CPU; they are not "
                   "Snapdragon latency.</p>")
    profs = {k: v for k, v in st.items() if k.startswith(("profile[", "graph-profile["))}
    for label, p in profs.items():
        out.append(f"<h2>Profile {_e(label.split('[', 1)[1][:-1])} "
                   f"{badge(p.get('source', 'simulated'))}</h2>")
        what = "One inference" if label.startswith("graph-") else "One decode step"
        out.append(f"<p class='muted'>{what}, QNN detailed profiling on the HTP "
                   "simulator: totals by op type.</p>")
        out.append(svg_bars(p.get("by_op_type", {}), p.get("unit", "")))
    for label, d in st.items():
        if label.startswith("layerdiff["):
            out.append(render_layerdiff(d))
    if "waterfall" in st and st["waterfall"].get("waterfall"):
        out.append(render_waterfall(st["waterfall"]["waterfall"], data.get("targets") or []))
    if "ablation" in st and st["ablation"].get("ablation"):
        out.append(render_ablation(st["ablation"]["ablation"]))
    out.append("<h2>Stages</h2><table><tr><th>stage</th><th>summary</th></tr>")
    for label, r in st.items():
        out.append(f"<tr><td>{_e(label)}</td><td>{_e(r.get('summary', ''))}</td></tr>")
    out.append("</table>")
    out.append("<h2>All metrics</h2><table><tr><th>stage</th><th>metric</th><th>value</th>"
               "<th>unit</th><th>source</th><th>device</th><th>note</th></tr>")
    for m in data["metrics"]:
        dev = m["device"] + (f" / {m['target']}" if m.get("target") else "")
        out.append(f"<tr><td>{_e(m['stage'])}</td><td>{_e(m['name'])}</td>"
                   f"<td>{_fmt(m['value'])}</td><td>{_e(m['unit'])}</td>"
                   f"<td>{badge(m['source'])}</td><td>{_e(dev)}</td>"
                   f"<td class='muted'>{_e(m.get('detail', ''))}</td></tr>")
    out.append("</table></body></html>")
    return "\n".join(out)


def write_report(project: Project, results: dict[str, dict[str, Any]],
                 out_dir: Path, comparison: dict[str, Any] | None = None) -> tuple[Path, Path]:
    data = build_report(project, results)
    data["comparison"] = comparison
    html_path, json_path = out_dir / "report.html", out_dir / "report.json"
    atomic_write_json(json_path, data)
    atomic_write_text(html_path, render_html(data))
    return html_path, json_path
