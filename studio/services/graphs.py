"""Any ONNX network onto the NPU of a target chip, headless: static shapes, the way past ops
the HTP refuses (strict, partition or rewrite), quantization on the user's calibration
samples, the placement report, validation per output against FP32 and the latency per
inference on each side — with every file it made left in one folder to take away."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import NullProgress, Progress

PLACEMENTS = ("strict", "partition", "rewrite")


def _latency_ms(session, feed: dict[str, Any], repeats: int) -> float:
    session.run(None, feed)  # warm-up
    wall = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, feed)
        wall.append(time.perf_counter() - t0)
    return statistics.median(wall) * 1e3


def deploy_graph(onnx_path: Path, out_dir: Path, calibration: Path, target: str,
                 shapes: dict[str, list[int]] | None = None, placement: str = "strict",
                 scheme: str = "W8A16", weight_granularity: str = "per_channel",
                 validation: Path | None = None, repeats: int = 5,
                 progress: Progress | None = None) -> dict[str, Any]:
    """``onnx_path`` through static shapes → (rewrites) → quantization → the HTP of
    ``target``; the files go into ``out_dir`` (``static.onnx``, ``rewritten.onnx``,
    ``quantized.onnx``, ``placement.json``, ``result.json``). Strict placement with refused
    nodes is a :class:`StudioError` naming each with the EP's reason."""
    import onnxruntime as ort

    from studio.core.catalog import get_chip
    from studio.engine import graphdata, qnn, rewrites
    from studio.engine.quantize import quantize_graph

    progress = progress or NullProgress()
    if placement not in PLACEMENTS:
        raise StudioError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    chip = get_chip(target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    progress.update(0.02, "fixing the input shapes")
    inputs = graphdata.make_static(Path(onnx_path), out / "static.onnx", shapes)
    feeds = graphdata.load_samples(Path(calibration), inputs)
    held = (graphdata.load_samples(Path(validation), inputs, "validation data") if validation
            else feeds[-min(len(feeds), 4):])
    progress.update(0.1, "rewriting what quantization cannot take"
                    + (" and the ops the HTP refuses" if placement == "rewrite" else ""))
    names = [r.name for r in rewrites.PREPARE] + (
        [r.name for r in rewrites.CATALOGUE] if placement == "rewrite" else [])
    graph = out / "rewritten.onnx"
    applied = rewrites.apply_rewrites(out / "static.onnx", graph, names)
    rewrite_check = None
    if applied:
        rewrite_check = rewrites.check_rewrite(out / "static.onnx", graph, held)
    else:
        graph.unlink()
        graph = out / "static.onnx"
    progress.check()
    progress.update(0.2, f"quantizing ({scheme}) on {len(feeds)} calibration samples")
    quant = quantize_graph(graph, out / "quantized.onnx",
                           {"scheme": scheme, "weight_granularity": weight_granularity,
                            "samples": len(feeds)}, feeds)
    progress.check()
    progress.update(0.6, f"placing the graph on {chip.name}")
    report = rewrites.partition(out / "quantized.onnx", chip)
    atomic_write_json(out / "placement.json", report)
    if placement != "partition" and not report["all_on_npu"]:
        refused = "; ".join(f"{n['name']} ({n['op_type']}: {n['reason'].split('.')[0]})"
                            for n in report["cpu_nodes"] if n["op_type"] not in
                            ("QuantizeLinear", "DequantizeLinear"))
        how = ("no rewrite in the catalogue covers it; use --placement partition"
               if placement == "rewrite" else
               "use --placement rewrite (known equivalents) or partition (the CPU takes them)")
        raise StudioError(f"{len(report['cpu_nodes'])} node(s) cannot run on the NPU of "
                          f"{chip.name}: {refused}; {how}")
    progress.update(0.7, "validating against FP32 and timing")
    cpu = ort.InferenceSession(str(out / "static.onnx"), providers=["CPUExecutionProvider"])
    htp = qnn.make_session(out / "quantized.onnx", chip, strict=placement != "partition")
    check = graphdata.compare_outputs(cpu, htp, held)
    result = {
        "model": str(onnx_path), "target": chip.key, "placement": placement,
        "inputs": [{"name": i.name, "dtype": i.dtype, "shape": list(i.shape)} for i in inputs],
        "rewrites": applied, "rewrite_check": rewrite_check,
        "quantization": {k: quant[k] for k in ("calibration_feeds", "matmul_precisions",
                                               "qdq_nodes")}
        | {"scheme": scheme, "weight_granularity": weight_granularity},
        "on_npu": {k: report[k] for k in ("all_on_npu", "total_nodes", "qnn_nodes",
                                          "qnn_subgraphs", "transitions", "bytes_crossing")},
        "cpu_nodes": report["cpu_nodes"],
        "validation": {**check, "on": "validation data" if validation
                       else "the last calibration samples (give --validation for held-out data)"},
        "latency_ms": {
            "htp": {"value": _latency_ms(htp, held[0], repeats), "source": "simulated",
                    "note": "the HTP simulator on this host's CPU: not device latency"
                            + ("; the CPU part of the partition included"
                               if not report["all_on_npu"] else "")},
            "cpu_fp32": {"value": _latency_ms(cpu, held[0], repeats), "source": "measured",
                         "note": "ONNX Runtime, this host's CPU, FP32"},
        },
        "files": sorted(p.name for p in out.iterdir() if p.is_file()),
    }
    atomic_write_json(out / "result.json", result)
    progress.update(1.0, "done")
    return result
