"""The layer-wise diff's vocabulary and its reading of the figures (pure: no numpy, no ONNX).

The engine (:mod:`studio.engine.layerdiff`) runs FP32, the host QDQ emulation and the HTP on
the prefill graph with intermediate tensors exposed and gives one row per tensor (a *probe*)
with, per pair of runtimes, ``cosine``, ``rel_error`` (``||a - b|| / ||b||``, ``b`` the
reference) and ``gain`` (its relative error over the largest relative error of the probes it
is computed from). This module turns the rows into what a reader wants to know:

- **curves**: the relative error at each boundary along depth (the embedding, the residual
  stream after each decoder block, the final norm, the logits), one curve per pair;
- **first jump** of a pair: the first probe in graph order whose relative error is at least
  :data:`JUMP_FLOOR` and at least :data:`JUMP_FACTOR` times the largest relative error of
  the probes it is computed from (a probe computed from no probe counts from 0);
- **where host QDQ and the HTP part**: the first probe in graph order where one runtime's
  relative error against FP32 is at least :data:`PART_FACTOR` times the other's (and at
  least :data:`JUMP_FLOOR`);
- **worst**: per pair, the probes that add the most error (largest gain, with a relative
  error of at least :data:`JUMP_FLOOR`), and the probes where host QDQ and the HTP add the
  most different amounts of error (largest ratio of their gains).
"""

from __future__ import annotations

import math
from typing import Any

#: what ``[layerdiff] tensors`` may say: boundaries only; boundaries and module outputs;
#: every computed float tensor (a deep dive: hundreds of outputs)
TENSOR_MODES = ("blocks", "modules", "all")
#: the pairs compared: (name, runtime, reference runtime)
PAIRS = (("qdq_vs_fp32", "qdq", "fp32"), ("htp_vs_fp32", "htp", "fp32"),
         ("htp_vs_qdq", "htp", "qdq"), ("htp_fp16_vs_fp32", "htp_fp16", "fp32"))
PAIR_TITLES = {"qdq_vs_fp32": "host QDQ vs FP32", "htp_vs_fp32": "HTP vs FP32",
               "htp_vs_qdq": "HTP vs host QDQ",
               "htp_fp16_vs_fp32": "HTP FP16, unquantized, vs FP32"}
JUMP_FACTOR = 2.0
JUMP_FLOOR = 1e-3
PART_FACTOR = 2.0
MAX_WINDOWS = 64  # layerdiff.windows' limit (studio.core.settings declares it)
TOP = 5


def _where(r: dict[str, Any]) -> dict[str, Any]:
    return {"name": r["name"], "block": r["block"], "module": r["module"], "op": r["op"]}


def first_jump(rows: list[dict[str, Any]], pair: str, factor: float = JUMP_FACTOR,
               floor: float = JUMP_FLOOR) -> dict[str, Any] | None:
    """See the module docstring."""
    rel = {r["name"]: r[pair]["rel_error"] for r in rows if pair in r}
    for r in rows:
        if pair not in r:
            continue
        e = rel[r["name"]]
        before = max((rel[i] for i in r["inputs"] if i in rel), default=0.0)
        if e >= floor and e >= factor * before:
            return {**_where(r), "rel_error": e, "input_rel_error": before}
    return None


def parting(rows: list[dict[str, Any]], factor: float = PART_FACTOR,
            floor: float = JUMP_FLOOR) -> dict[str, Any] | None:
    """The first probe where host QDQ's and the HTP's errors against FP32 differ by
    ``factor`` or more; which of the two is worse there."""
    for r in rows:
        if "qdq_vs_fp32" not in r or "htp_vs_fp32" not in r:
            continue
        q, h = r["qdq_vs_fp32"]["rel_error"], r["htp_vs_fp32"]["rel_error"]
        hi, lo = max(q, h), min(q, h)
        if hi >= floor and hi >= factor * lo:
            return {**_where(r), "qdq_rel_error": q, "htp_rel_error": h,
                    "worse": "host QDQ" if q > h else "HTP",
                    "htp_vs_qdq_rel_error": r.get("htp_vs_qdq", {}).get("rel_error")}
    return None


def curves(rows: list[dict[str, Any]], pairs: list[str]) -> dict[str, Any]:
    """Relative error and cosine at each boundary along depth, per pair."""
    b = [r for r in rows if r["kind"] == "boundary"]
    return {
        "names": [r["name"] for r in b],
        "blocks": [r["block"] for r in b],
        **{p: {"rel_error": [r[p]["rel_error"] for r in b],
               "cosine": [r[p]["cosine"] for r in b]} for p in pairs},
    }


def worst(rows: list[dict[str, Any]], pair: str, n: int = TOP) -> list[dict[str, Any]]:
    """The probes that add the most error in ``pair``: largest gain, relative error at least
    the floor."""
    cand = [r for r in rows if pair in r and r[pair].get("gain") is not None
            and r[pair]["rel_error"] >= JUMP_FLOOR]
    cand.sort(key=lambda r: -r[pair]["gain"])
    return [{**_where(r), "gain": r[pair]["gain"], "rel_error": r[pair]["rel_error"]}
            for r in cand[:n]]


def apart(rows: list[dict[str, Any]], n: int = TOP) -> list[dict[str, Any]]:
    """The probes where host QDQ and the HTP add the most different amounts of error: the
    largest ratio between their gains (either way)."""
    cand = []
    for r in rows:
        q = r.get("qdq_vs_fp32", {}).get("gain")
        h = r.get("htp_vs_fp32", {}).get("gain")
        if q and h and max(r["qdq_vs_fp32"]["rel_error"], r["htp_vs_fp32"]["rel_error"]) \
                >= JUMP_FLOOR:
            cand.append((abs(math.log(q / h)), r, q, h))
    cand.sort(key=lambda c: -c[0])
    return [{**_where(r), "qdq_gain": q, "htp_gain": h,
             "qdq_rel_error": r["qdq_vs_fp32"]["rel_error"],
             "htp_rel_error": r["htp_vs_fp32"]["rel_error"]} for _, r, q, h in cand[:n]]


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """What the rows say: curves, first jumps, where host QDQ and the HTP part, the worst
    probes, and one line for the log."""
    rows = data["rows"]
    pairs = list(data["pairs"])
    out: dict[str, Any] = {
        "curves": curves(rows, pairs),
        "first_jump": {p: first_jump(rows, p) for p in pairs},
        "worst": {p: worst(rows, p) for p in pairs},
    }
    if "htp_vs_fp32" in pairs:
        out["parting"] = parting(rows)
        out["apart"] = apart(rows)
    out["line"] = summary_line(out, data)
    return out


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def summary_line(s: dict[str, Any], data: dict[str, Any]) -> str:
    parts = []
    fj = s["first_jump"].get("qdq_vs_fp32")
    if fj:
        parts.append(f"host QDQ first diverges from FP32 at {fj['name']} "
                     f"(rel. error {_fmt(fj['rel_error'])} from {_fmt(fj['input_rel_error'])})")
    p = s.get("parting")
    if "parting" in s:
        if p:
            parts.append(f"host QDQ and the HTP part at {p['name']} (vs FP32: host QDQ "
                         f"{_fmt(p['qdq_rel_error'])}, HTP {_fmt(p['htp_rel_error'])}; "
                         f"{p['worse']} worse)")
        else:
            parts.append("host QDQ and the HTP do not part (no tensor where one's error is "
                         f"{PART_FACTOR:g}x the other's)")
    lg = data.get("logits", {})
    if "qdq" in lg and "htp" in lg:
        parts.append(f"final logits KL vs FP32: host QDQ {_fmt(lg['qdq']['kl_divergence'])}, "
                     f"HTP {_fmt(lg['htp']['kl_divergence'])}")
    return "; ".join(parts) or "no tensor diverges"


# ---- a bisection's reading: the seed's three steps and one verdict ----------------------------
#: the tolerance band of a quantized model's tensors against FP32: W8A16 on the sample leaves
#: 3-6 % relative error at every block boundary (measured, host QDQ and the HTP simulator);
#: a layer past 10 % has left the quantization noise
BAND = 0.1
#: the band of the HTP in FP16 against FP32: FP16's own rounding leaves about 1e-3 (measured
#: on the sample: 0.0007-0.0023); a float kernel that goes wrong leaves 1e-2 or more
FP16_BAND = 1e-2
#: the final logits "follow FP32" below this KL divergence (nats) and above this top-1
#: agreement: a layer past the band whose error does not reach the output needs nothing
#: (W8A16 on the sample: KL 0.0006-0.007, top-1 94-97 %)
KL_OK, TOP1_OK = 0.01, 0.9


def _g(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def out_of_band(rows: list[dict[str, Any]], pair: str, band: float = BAND
                ) -> dict[str, Any] | None:
    """The first probe in graph order whose relative error in ``pair`` is at least ``band``,
    with its error, the largest error of its inputs and its index in the rows."""
    rel = {r["name"]: r[pair]["rel_error"] for r in rows if pair in r}
    for i, r in enumerate(rows):
        if pair in r and r[pair]["rel_error"] >= band:
            before = max((rel[x] for x in r["inputs"] if x in rel), default=0.0)
            return {**_where(r), "rel_error": r[pair]["rel_error"], "input_rel_error": before,
                    "index": i}
    return None


def bisect_verdict(result: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The seed's accuracy method read from one layer diff: (1) FP32 vs the HTP without
    quantization (FP16), (2) where the quantized model's error comes from, (3) the first
    layer whose activations leave the tolerance band (:data:`BAND`) on host QDQ and on the
    HTP — and one verdict naming the layer and what to do (``layer``: the module to open in
    the layer grid; None when nothing leaves the band)."""
    pairs = list(result["pairs"])
    lg = result.get("logits", {})
    step1, fp16 = _fp16_step(pairs, rows, lg)
    top = worst(rows, "qdq_vs_fp32", 3)
    step2 = {"step": 2, "title": "the quantized model's error, and the layers it comes "
                                 "from", "worst": top,
             "logits": {k: lg[k] for k in ("qdq", "htp") if k in lg},
             "finding": ("most error is added at " + ", ".join(
                 f"{w['name']} ({_g(w['gain'])}x)" for w in top) if top else
                 "no layer adds error above the floor")
             + (f"; final logits KL vs FP32: host QDQ {_g(lg['qdq']['kl_divergence'])}, "
                f"HTP {_g(lg['htp']['kl_divergence'])}" if "qdq" in lg and "htp" in lg
                else "")}
    q = out_of_band(rows, "qdq_vs_fp32")
    h = out_of_band(rows, "htp_vs_fp32") if "htp_vs_fp32" in pairs else None
    step3 = {"step": 3, "title": f"the first layer past the band of {BAND:g} relative "
                                 "error", "host_qdq": q, "htp": h,
             "finding": "; ".join((
                 f"host QDQ at {q['name']} ({_g(q['rel_error'])})" if q else
                 "host QDQ: none",
                 f"HTP at {h['name']} ({_g(h['rel_error'])})" if h else "HTP: none"))}
    named, layer, verdict = _first_divergence(rows, fp16, q, h, top,
                                              result.get("device", "the HTP"))
    reach = [lg[k] for k in ("qdq", "htp") if k in lg]
    if named is not None and fp16 is None and reach and all(
            x["kl_divergence"] < KL_OK and x["top1_agreement"] >= TOP1_OK for x in reach):
        verdict = (
            "no divergence reaches the output: the final logits follow FP32 (KL "
            + ", ".join(f"{n} {_g(lg[k]['kl_divergence'])}" for k, n in
                        (("qdq", "host QDQ"), ("htp", "HTP")) if k in lg)
            + f" nats); {named['name']} leaves the band locally ({_g(named['rel_error'])}) and "
            "the layers after it absorb it — nothing to fix")
    return {"steps": [step1, step2, step3], "verdict": verdict, "layer": layer,
            "tensor": named["name"] if named else None}


def _fp16_step(pairs: list[str], rows: list[dict[str, Any]], lg: dict[str, Any]
               ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Step 1: FP32 against the HTP unquantized (FP16), and the first probe past FP16's
    band (None: none, or not run)."""
    title1 = "FP32 on ONNX Runtime vs the HTP unquantized (FP16)"
    if "htp_fp16_vs_fp32" not in pairs:
        return {"step": 1, "title": title1,
                "finding": "not run: the chip's HTP has no FP16, or the diff was run "
                           "without layerdiff.fp16_step"}, None
    fp16 = out_of_band(rows, "htp_fp16_vs_fp32", FP16_BAND)
    worst16 = max((r["htp_fp16_vs_fp32"]["rel_error"] for r in rows
                   if "htp_fp16_vs_fp32" in r), default=None)
    return {"step": 1, "title": title1, "out_of_band": fp16,
            "worst_rel_error": worst16, "logits": lg.get("htp_fp16"),
            "finding": (f"the unquantized HTP leaves FP16's band ({FP16_BAND:g}) at "
                        f"{fp16['name']} ({_g(fp16['rel_error'])})" if fp16 else
                        f"the unquantized HTP stays within FP16's band of "
                        f"{FP16_BAND:g} (largest relative error {_g(worst16)}): the "
                        "backend's float kernels agree with FP32"),
            "note": "the seed compares with QNN's CPU backend, which this wheel does "
                    "not ship: the HTP in FP16 stands in for it"}, fp16


def _first_divergence(rows: list[dict[str, Any]], fp16: dict[str, Any] | None,
                      q: dict[str, Any] | None, h: dict[str, Any] | None,
                      top: list[dict[str, Any]], where: str
                      ) -> tuple[dict[str, Any] | None, str | None, str]:
    """The probe the verdict names, its module and the verdict: FP16 first, then the HTP
    alone, both alike, host QDQ alone, or nothing past the band."""
    by_name = {r["name"]: r for r in rows}

    def qdq_at(x: dict[str, Any]) -> float:
        return by_name[x["name"]].get("qdq_vs_fp32", {}).get("rel_error", 0.0)

    if fp16:
        return fp16, fp16["module"], (
            f"diverges at {fp16['name']} before any quantization: the HTP's FP16 result leaves "
            f"FP32 there ({_g(fp16['rel_error'])}); a float kernel or FP16's range, not the "
            "quantization — keep that op off FP16 or check its inputs' range")
    if h and (q is None or h["index"] < q["index"]) and qdq_at(h) < BAND / 2:
        return h, h["module"], (
            f"diverges at {h['name']} on {where} only: host QDQ agrees there (vs FP32 host "
            f"QDQ {_g(qdq_at(h))}, HTP {_g(h['rel_error'])}); the HTP computes this op "
            "differently from the QDQ emulation — check the SDK build and the target (studio "
            "doctor), then give that layer 16-bit activations")
    if q and h:
        first = q if q["index"] <= h["index"] else h
        return first, first["module"], (
            f"diverges at {first['name']} on host QDQ and {where} alike (relative error "
            f"{_g(first['input_rel_error'])} -> {_g(first['rel_error'])}): the quantization of "
            "that layer — raise its precision (Precision page, layer grid) or calibrate it "
            "better")
    if q:
        return q, q["module"], (
            f"host QDQ leaves the band at {q['name']} and the HTP does not: the host "
            "emulation's rounding, not the device — the HTP's own figures are the ones to "
            "trust")
    big = top[0] if top else None
    return None, None, (
        f"no layer leaves the band of {BAND:g} on host QDQ or {where}: the quantized model "
        "follows FP32 layer by layer"
        + (f" (the most error is added at {big['name']})" if big else ""))


def device_vs_simulator(read: dict[str, Any], device_rows: list[dict[str, Any]],
                        sim_rows: list[dict[str, Any]], device: str, simulator: str
                        ) -> dict[str, Any]:
    """A device's bisection read beside the HTP simulator's on the same graphs and windows:
    the first tensor past the band on each, and the verdict said again when the device
    parts from the simulator — "on the device only: the simulator agrees" points at the
    device's SDK build or firmware, not at the quantization. Returns ``read`` with a
    ``simulator`` entry (and, where they part, the new verdict)."""
    pair = "htp_vs_fp32"
    dev = out_of_band(device_rows, pair)
    sim = out_of_band(sim_rows, pair)
    sim_rel = {r["name"]: r[pair]["rel_error"] for r in sim_rows if pair in r}
    dev_rel = {r["name"]: r[pair]["rel_error"] for r in device_rows if pair in r}
    entry: dict[str, Any] = {"first_out_of_band": sim, "device_first_out_of_band": dev,
                             "name": simulator}
    out = {**read, "simulator": entry}
    if dev is not None and (sim is None or dev["index"] < sim["index"]) \
            and sim_rel.get(dev["name"], 0.0) < BAND / 2:
        entry["agrees"] = False
        out.update(layer=dev["module"], tensor=dev["name"], verdict=(
            f"diverges at {dev['name']} on {device} only: the simulator ({simulator}) "
            f"agrees with FP32 there ({_g(sim_rel.get(dev['name']))} against the device's "
            f"{_g(dev['rel_error'])}) — the device computes this op differently from the "
            "HTP's own kernels on the simulator: check the SDK build and firmware on the "
            "device (studio doctor --device), then give that layer 16-bit activations"))
    elif sim is not None and (dev is None or sim["index"] < dev["index"]) \
            and dev_rel.get(sim["name"], 0.0) < BAND / 2:
        entry["agrees"] = False
        out["verdict"] = (read["verdict"] + f"; the simulator ({simulator}) leaves the band "
                          f"at {sim['name']} ({_g(sim['rel_error'])}) where {device} does not "
                          f"({_g(dev_rel.get(sim['name']))}): the device's figures are the "
                          "ones to trust")
    else:
        entry["agrees"] = True
        out["verdict"] = (read["verdict"] + f"; the simulator ({simulator}) reads the same ("
                          + (f"first past the band at {sim['name']}, {_g(sim['rel_error'])}"
                             if sim else "nothing past the band") + ")")
    return out
