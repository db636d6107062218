"""Any ONNX network onto the NPU of a target chip, headless: static shapes, the way past ops
the HTP refuses (strict, partition or rewrite), quantization on the user's calibration
samples, the placement report, validation per output against FP32 and the latency per
inference on each side — with every file it made left in one folder to take away."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import NullProgress, Progress
from studio.core.recipe import PLACEMENTS as PLACEMENTS
from studio.engine.graphdata import compare_outputs


def deploy_graph(onnx_path: Path, out_dir: Path, calibration: Path, target: str,
                 shapes: dict[str, list[int]] | None = None, placement: str = "strict",
                 scheme: str = "W8A16", weight_granularity: str = "per_channel",
                 validation: Path | None = None, repeats: int = 5,
                 progress: Progress | None = None) -> dict[str, Any]:
    """``onnx_path`` through static shapes → (rewrites) → quantization → the HTP of
    ``target``; the files go into ``out_dir`` (``static.onnx``, ``rewritten.onnx`` when a
    rewrite applied, ``quantized.onnx``, ``placement.json``, ``result.json``). Strict
    placement with refused nodes is a :class:`StudioError` naming each with the EP's
    reason. The pipeline's graph stages run the same steps (:mod:`studio.engine.graphpipe`)."""
    from studio.core.catalog import get_chip
    from studio.engine import graphpipe, qnn

    progress = progress or NullProgress()
    if placement not in PLACEMENTS:
        raise StudioError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    chip = get_chip(target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    static = graphpipe.static_graph("onnx-graph", Path(onnx_path), out, shapes, 0, progress)
    inputs = graphpipe.inputs_from_json(static["inputs"])
    feeds, held, held_from = graphpipe.sample_feeds(inputs, Path(calibration),
                                                    Path(validation) if validation else None,
                                                    1 << 30)
    progress.check()
    q = graphpipe.rewrite_and_quantize(out / "static.onnx", out, placement, feeds, held, scheme,
                                       weight_granularity, progress)
    if q["rewrites"]:
        (out / "graph.onnx").replace(out / "rewritten.onnx")
    else:
        (out / "graph.onnx").unlink()
    progress.check()
    progress.update(0.6, f"placing the graph on {chip.name}")
    report = graphpipe.place(out / "quantized.onnx", chip, placement)
    atomic_write_json(out / "placement.json", report)  # kept when the placement refuses
    graphpipe.check_placement(report, chip, "--placement")
    progress.update(0.7, "validating against FP32 and timing")
    cpu = graphpipe.cpu_session(out / "static.onnx")
    htp = qnn.make_session(out / "quantized.onnx", chip, strict=placement != "partition")
    check = compare_outputs(cpu, htp, held)
    result = {
        "model": str(onnx_path), "target": chip.key, "placement": placement,
        "inputs": static["inputs"], "rewrites": q["rewrites"],
        "rewrite_check": q["rewrite_check"], "quantization": q["quantization"],
        "on_npu": {k: report[k] for k in ("all_on_npu", "total_nodes", "qnn_nodes",
                                          "qnn_subgraphs", "transitions", "bytes_crossing")},
        "cpu_nodes": report["cpu_nodes"],
        "validation": {**check, "on": held_from},
        "latency_ms": {
            "htp": {"value": graphpipe.latency(htp, held[0], repeats)["median_ms"],
                    "source": "simulated",
                    "note": "the HTP simulator on this host's CPU: not device latency"
                            + ("; the CPU part of the partition included"
                               if not report["all_on_npu"] else "")},
            "cpu_fp32": {"value": graphpipe.latency(cpu, held[0], repeats)["median_ms"],
                         "source": "measured", "note": "ONNX Runtime, this host's CPU, FP32"},
        },
        "files": sorted(p.name for p in out.iterdir() if p.is_file()),
    }
    atomic_write_json(out / "result.json", result)
    progress.update(1.0, "done")
    return result
