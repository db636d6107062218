"""The compile stage of graph projects: placement on one chip and its context binary."""

from __future__ import annotations

from typing import Any

from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress
from studio.core.stages.graph_compile import GraphCompileSettings
from studio.engine import graphpipe, qnn
from studio.worker.context import StageContext
from studio.worker.stages._llm import htp_settings_options


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    qdir = ctx.input("graph-quantize")
    chip = ctx.chip
    s = GraphCompileSettings.of(ctx.config)
    placement = s.placement
    progress.update(0.05, f"placing the graph on {chip.name}")
    report = graphpipe.place(qdir / "quantized.onnx", chip, placement)
    graphpipe.check_placement(report, chip)
    atomic_write_json(ctx.out / "placement.json", report)
    progress.check()
    progress.update(0.4, f"compiling the context binary for {chip.name}")
    info = qnn.compile_context(qdir / "quantized.onnx", ctx.out / "graph_ctx.onnx", chip,
                               embed=True, strict=placement != "partition",
                               extra_options=htp_settings_options(s, chip))
    where = ("all nodes on the NPU" if report["all_on_npu"] else
             f"{len(report['cpu_nodes'])} node(s) on the CPU, {report['transitions']} NPU↔CPU transitions")
    ctx.fact("compile_seconds", info.get("seconds", 0.0), "s")
    return {"summary": f"context binary for {chip.name} (QNN SDK {info.get('sdk_version', '')});"
                       f" {where}",
            "placement": {k: v for k, v in report.items() if k not in ("crossings",)},
            "sdk_version": info.get("sdk_version", ""),
            "tool": {"qnn_sdk": info.get("sdk_version", "")},
            "size_bytes": info.get("size_bytes"), "metrics": []}
