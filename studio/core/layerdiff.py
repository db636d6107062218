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
         ("htp_vs_qdq", "htp", "qdq"))
PAIR_TITLES = {"qdq_vs_fp32": "host QDQ vs FP32", "htp_vs_fp32": "HTP vs FP32",
               "htp_vs_qdq": "HTP vs host QDQ"}
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
