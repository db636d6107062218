"""The layer diff's rows as the window shows them (:mod:`studio.ui.pages.layerdiff_view`),
without Qt: the layer a row names, short names and block texts, the plot's positions and
ticks, each curve's source, the plain-language finding and the worst rows."""

from __future__ import annotations

import html
import re
from typing import Any

from studio.core.layerdiff import JUMP_FLOOR, PAIR_TITLES, PART_FACTOR
from studio.core.recipe import activation_point

#: what the plot and the table show: boundaries only, and module outputs too
MODES = {
    "blocks": ("boundary",),
    "modules": ("boundary", "module"),
    "all": ("boundary", "module", "op"),
}
#: the two runtimes each pair compares
PAIR_SIDES = {"qdq_vs_fp32": ("qdq", "fp32"), "htp_vs_fp32": ("htp", "fp32"),
              "htp_vs_qdq": ("htp", "qdq"), "htp_fp16_vs_fp32": ("htp_fp16", "fp32")}


def layer_of(row: dict[str, Any]) -> str:
    """The layer a tensor belongs to, as the recipe and the Precision page name it: a key
    activation's pseudo-layer (``model.layers.0.self_attn.scores``, ``….softmax``,
    ``model.layers.0.residual`` — a block's output is its last residual add) when the node
    computing it is one, else the module that computes it (``….self_attn.q_proj``,
    ``lm_head``)."""
    node = re.sub(r"_output_\d+$", "", str(row.get("tensor", "")))
    if node.startswith("/"):
        point = activation_point(node)
        if point:
            return point
    return str(row.get("module") or row["name"])


def short_name(name: str) -> str:
    """``model.layers.0.post_attention_layernorm`` -> ``L0 post_attention_layernorm``;
    ``model.layers.3`` -> ``L3``; ``model.embed_tokens`` -> ``embed``; ``model.norm`` ->
    ``norm``."""
    m = re.match(r"^(?:.*\.)?layers\.(\d+)(?:\.(.*))?$", name)
    if m:
        return f"L{m.group(1)}" + (f" {m.group(2)}" if m.group(2) else "")
    if "embed" in name:
        return "embed"
    return name.removeprefix("model.")


def block_text(row: dict[str, Any]) -> str:
    if re.search(r"layers\.\d+", row["name"]):
        return f"L{row['block']}"
    return "embed" if row["block"] < 0 else "head"


def pct(x: float | None) -> str:
    """A relative error as a percentage with 3 significant digits."""
    if x is None:
        return "—"
    return f"{x * 100:.3g} %"


def positions(rows: list[dict[str, Any]], mode: str) -> tuple[list[int], dict[str, float]]:
    """The rows shown in ``mode`` (indices into ``rows``, graph order) and the x of every
    row: shown rows at 0, 1, 2, …; a hidden row between the shown rows around it (so a
    marker at a module output stays in place in the boundaries-only view)."""
    kinds = MODES[mode]
    shown = [i for i, r in enumerate(rows) if r["kind"] in kinds]
    x: dict[str, float] = {}
    at = {i: k for k, i in enumerate(shown)}
    gap: list[int] = []
    prev = -1.0
    for i, r in enumerate(rows):
        if i in at:
            for k, j in enumerate(gap, 1):
                x[rows[j]["name"]] = prev + k * (at[i] - prev) / (len(gap) + 1)
            gap = []
            prev = float(at[i])
            x[r["name"]] = prev
        else:
            gap.append(i)
    for k, j in enumerate(gap, 1):  # after the last shown row
        x[rows[j]["name"]] = prev + k * 0.5 / (len(gap) + 1)
    return shown, x


def ticks(shown: list[dict[str, Any]], merge: bool) -> list[tuple[float, str]]:
    """Tick labels at the block boundaries; with ``merge``, boundaries fewer than 3 points
    apart share one label (the final norm and the logits right after the last block)."""
    groups: list[list[tuple[int, str]]] = []
    for k, x in enumerate(shown):
        if x["kind"] != "boundary":
            continue
        if merge and groups and k - groups[-1][-1][0] < 3:
            groups[-1].append((k, short_name(x["name"])))
        else:
            groups.append([(k, short_name(x["name"]))])
    return [(sum(k for k, _ in g) / len(g), " · ".join(t for _, t in g)) for g in groups]


def sources(result: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """(source, device) of host QDQ and the HTP, from the result's metrics and device."""
    host = ("measured", "host-cpu")
    for m in result.get("metrics", []):
        if m.get("name", "").startswith("layerdiff_kl_host_qdq"):
            host = (m["source"], m["device"])
            break
    htp = (result.get("source", "simulated"), result.get("device", "HTP simulator"))
    return {"qdq": host, "fp32": host, "htp": htp, "htp_fp16": htp}


def pair_source(result: dict[str, Any], pair: str) -> str:
    """'measured · host-cpu', 'simulated · HTP simulator (…)', or both for HTP vs host QDQ."""
    src = sources(result)
    a, b = PAIR_SIDES[pair]
    text = f"{src[a][0]} · {src[a][1]}"
    if src[b] != src[a] and b != "fp32":
        text += f" vs {src[b][0]} · {src[b][1]}"
    return text


def finding(result: dict[str, Any]) -> str:
    """One paragraph (rich text) of what the diff says, from the result's own figures."""
    e = html.escape
    out = []
    p = result.get("parting")
    if "parting" in result:
        if p:
            q, h = p["qdq_rel_error"], p["htp_rel_error"]
            lo = min(q, h)
            ratio = f"{max(q, h) / lo:.1f}× " if lo > 0 else "far "
            text = (
                f"<b>Host QDQ and the HTP part at {e(p['name'])}</b> ({e(p['op'])}, "
                f"{e(block_text(p))}): host QDQ {pct(q)} vs HTP {pct(h)} relative error "
                f"against FP32 ({e(p['worse'])} {ratio}worse)"
            )
            hq = p.get("htp_vs_qdq_rel_error")
            if hq is not None:
                text += f", and the HTP differs from host QDQ there by {pct(hq)}"
            text += (
                " — host QDQ over-states the error the HTP makes at this tensor."
                if p["worse"] == "host QDQ"
                else " — the HTP adds error at this tensor that host QDQ does not show."
            )
            out.append(text)
        else:
            out.append(
                "<b>Host QDQ and the HTP do not part</b>: at no tensor is one's relative "
                f"error against FP32 {PART_FACTOR:g}× the other's."
            )
    jumps = result.get("first_jump", {})
    fq, fh = jumps.get("qdq_vs_fp32"), jumps.get("htp_vs_fp32")
    if fq and fh and fq["name"] == fh["name"]:
        out.append(
            f"Both first jump away from FP32 at {e(fq['name'])} (host QDQ "
            f"{pct(fq['input_rel_error'])} → {pct(fq['rel_error'])}, HTP "
            f"{pct(fh['input_rel_error'])} → {pct(fh['rel_error'])})."
        )
    else:
        for who, pair, fj in (("Host QDQ", "qdq_vs_fp32", fq), ("The HTP", "htp_vs_fp32", fh)):
            if fj:
                out.append(
                    f"{who} first jumps away from FP32 at {e(fj['name'])} "
                    f"({pct(fj['input_rel_error'])} → {pct(fj['rel_error'])})."
                )
            elif pair in jumps:
                out.append(
                    f"{who} never jumps away from FP32 (no tensor at least "
                    f"{JUMP_FLOOR:g} and twice its inputs' error)."
                )
    lg = result.get("logits", {})
    if "qdq" in lg and "htp" in lg:
        out.append(
            f"Final logits against FP32: KL divergence host QDQ "
            f"{lg['qdq']['kl_divergence']:.3g} vs HTP {lg['htp']['kl_divergence']:.3g} nats, "
            f"top-1 agreement {lg['qdq']['top1_agreement']:.1%} vs "
            f"{lg['htp']['top1_agreement']:.1%}."
        )
    src = sources(result)
    out.append(
        f"<span style='color:gray'>{e(result.get('graph', 'prefill'))} graph, "
        f"{result.get('windows', '?')} held-out window(s) of {result.get('window_tokens', '?')} "
        f"tokens, {result.get('probes', '?')} tensors; host QDQ {e(src['qdq'][0])} on "
        f"{e(src['qdq'][1])}, HTP {e(src['htp'][0])} on {e(src['htp'][1])}.</span>"
    )
    return " ".join(out)


def worst_rows(result: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The worst tensors of the result: per pair the tensors that add the most error, and
    where host QDQ and the HTP add the most different amounts (first appearance first), each
    with its row's figures and why it is listed (``reasons``)."""
    by_name = {r["name"]: r for r in rows}
    out: dict[str, dict[str, Any]] = {}
    titles = result.get("pair_titles") or PAIR_TITLES
    for pair in result.get("pairs", []):
        for w in result.get("worst", {}).get(pair, []):
            if w["name"] in by_name:
                d = out.setdefault(w["name"], {"row": by_name[w["name"]], "reasons": []})
                d["reasons"].append(f"{titles.get(pair, pair)} ×{w['gain']:.3g}")
    for a in result.get("apart", []):
        if a["name"] in by_name:
            d = out.setdefault(a["name"], {"row": by_name[a["name"]], "reasons": []})
            d["reasons"].append(f"apart: host QDQ ×{a['qdq_gain']:.3g}, HTP ×{a['htp_gain']:.3g}")
    return list(out.values())
