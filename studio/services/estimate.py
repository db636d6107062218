"""The performance model for the CLI and the GUI: estimated tok/s, calibration, per-op costs.

Every result carries ``source: "estimated"`` and the model version
(:data:`studio.core.perfmodel.MODEL_VERSION`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studio.core import archs, perffit, perfmodel
from studio.core.catalog import get_chip
from studio.core.drafttable import config_share
from studio.core.events import EventTable
from studio.core.fsutil import atomic_write_text
from studio.engine.opblocks import node_blocks
from studio.engine.opcost import estimate_graph


def estimate_config(config: str | Path, chip: str, scheme: str = "W4A16", context: int = 4096,
                    prompt_tokens: int | None = None, image: int | None = None,
                    draft_config: str | Path | None = None, draft_embedding: str = "auto"
                    ) -> dict[str, Any]:
    """Estimated prefill and decode tok/s of a public architecture (a HF config, no weights);
    ``image``: a vision-language model's square image, pixels a side (its vision tower runs
    before the prefill, which takes the image's tokens). ``draft_config``: a draft model's
    config — whether it can read this model's token table and the bytes that saves
    (``draft_table``: :func:`studio.core.drafttable.config_share`, from the configs' numbers;
    ``draft_embedding`` as ``model.draft_embedding``)."""
    draft_table = None
    if draft_config is not None:  # before any work: a bad config is one line

        draft_table = config_share(archs.load_config(config)[0],
                                   archs.load_config(draft_config)[0],
                                   draft_embedding).to_dict()
    arch = archs.load_arch(config)
    est = perfmodel.estimate(arch, get_chip(chip), scheme, context, prompt_tokens,
                             image=image)
    out = est.to_dict()
    out["layer_traffic_bytes"] = {("lm_head" if k < 0 else str(k)): int(round(v))
                                  for k, v in sorted(est.layer_traffic().items())}
    out["roofline"] = roofline_points(est.decode, est.chip)
    if draft_table is not None:
        out["draft_table"] = draft_table
    return out


def roofline_points(ge: perfmodel.GraphEstimate, chip: perfmodel.ChipPerf) -> dict[str, Any]:
    """Every op placed on the chip's roofline: intensity (ops/byte) and attained ops/s."""
    r, g = ge.roof, ge.graph
    t = r["time_s"]
    pts = []
    for i in range(len(g)):
        if t[i] <= 0:
            continue
        intensity = float(r["intensity"][i])
        pts.append({
            "name": g.names[i], "op_type": g.op_types[i],
            "layer": int(g.layer[i]) if g.layer[i] >= 0 else None,
            "intensity": intensity if intensity != float("inf") else None,
            "attained_ops_per_s": 2 * float(g.macs[i]) / float(t[i]),
            "time_s": float(t[i]), "bound": str(r["bound"][i]),
            "start_s": float(ge.sched.start[i]), "core": int(ge.sched.core[i]),
            "macs": float(g.macs[i]), "dram_bytes": float(g.dram_bytes[i]),
        })
    return {"source": perfmodel.SOURCE, "model_version": perfmodel.MODEL_VERSION,
            "chip": chip.key, "peak_ops_per_s": float(r["peak_ops_per_s"]),
            "bytes_per_s": float(r["bytes_per_s"]), "ridge_ops_per_byte": float(r["ridge"]),
            "points": pts}


def calibration() -> dict[str, Any]:
    """Each anchor's published vs estimated tok/s, the MdAPE and the leave-one-out MdAPE."""
    cal = perffit.calibrate()
    _, shipped = perfmodel.load_fit()
    cal["shipped_params"] = {k: shipped[k] for k in
                             ("bw_fraction", "overhead_ms", "compute_fraction",
                              "float_decode_fraction")}
    return cal


def heldout() -> dict[str, Any]:
    """The model against the published speeds held out from its fit (every row, its source)."""
    return perffit.heldout_report()


def write_fit(path: str | Path | None = None) -> dict[str, Any]:
    """Refit the model on the anchors and write the fit file (atomically)."""
    cal = perffit.calibrate()
    atomic_write_text(Path(path) if path is not None else perfmodel.FIT_PATH,
                      perffit.fit_toml(cal))
    return cal


def estimate_onnx(onnx_path: str | Path, chip: str) -> dict[str, Any]:
    """Per-op estimated times and an HTP-core schedule for an ONNX graph (static shapes)."""
    ge, perf = estimate_graph(onnx_path, get_chip(chip))
    out = roofline_points(ge, perf)
    out["total_s"] = ge.total_s
    out["makespan_s"] = ge.sched.makespan
    out["bandwidth_floor_s"] = ge.bandwidth_floor_s
    out["bound"] = ge.bound
    return out


def by_layer(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ops of :func:`roofline_points` summed per transformer layer (None: outside the
    layers): MACs, DRAM bytes, estimated time, and the layer's place on the roofline."""
    acc: dict[Any, dict[str, Any]] = {}
    for p in points:
        a = acc.setdefault(p["layer"], {"layer": p["layer"], "macs": 0.0, "dram_bytes": 0.0,
                                        "time_s": 0.0, "ops": 0})
        a["macs"] += p["macs"]
        a["dram_bytes"] += p["dram_bytes"]
        a["time_s"] += p["time_s"]
        a["ops"] += 1
    rows = sorted(acc.values(), key=lambda a: (a["layer"] is None, a["layer"] or 0))
    for a in rows:
        a["intensity"] = 2 * a["macs"] / a["dram_bytes"] if a["dram_bytes"] else None
        a["attained_ops_per_s"] = 2 * a["macs"] / a["time_s"] if a["time_s"] else 0.0
    return rows


def graph_roofline(onnx_path: str | Path, chip: str) -> dict[str, Any]:
    """:func:`estimate_onnx` plus the per-layer rows (``layers``) for the roofline chart."""
    out = estimate_onnx(onnx_path, chip)
    out["layers"] = by_layer(out["points"])
    return out


def schedule_events(onnx_path: str | Path, chip: str):
    """The performance model's schedule of a graph across the chip's HTP cores as an event
    table (``start`` / ``dur`` in µs, one track per core, blocks of the seed's table):
    what the timeline draws, labelled ``estimated``, where no per-core data exists."""
    est = estimate_onnx(onnx_path, chip)
    blocks = node_blocks(onnx_path)
    rows = [{"op": p["name"], "op_type": p["op_type"], "onnx_node": p["name"],
             "layer": p["layer"] if p["layer"] is not None else -1,
             "block": blocks.get(p["name"], "other"), "track": f"HTP core {p['core']}",
             "start": p["start_s"] * 1e6, "dur": p["time_s"] * 1e6, "macs": p["macs"],
             "dram_read": p["dram_bytes"]}
            for p in est["points"] if p["op_type"] not in ("Constant",)]
    return EventTable.from_rows(rows, time_unit="us"), est
