"""What the stages of graph projects (encoders, ONNX graphs) share: the imported graph's
inputs, the validation samples, a session of the graph on the job's device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studio.core.stages.graph_quantize import Placement
from studio.engine.graphdata import load_samples
from studio.engine.graphpipe import inputs_from_json
from studio.worker.context import StageContext


def input_specs(import_dir: Path):
    return inputs_from_json(json.loads((import_dir / "inputs.json").read_text()))


def held_samples(qdir: Path, inputs) -> list[dict[str, Any]]:
    return load_samples(qdir / "validation.npz", inputs, "validation samples")


def device_session(ctx: StageContext):
    """The graph on the job's device: the FP32 import where the device runs it as is, the
    target's compiled context on an NPU."""
    dev = ctx.device
    compiled = (ctx.input("graph-compile", dev.chip) / "graph_ctx.onnx") if dev.chip else None
    return ctx.backend.open_session(ctx.input("import") / "static.onnx", compiled,
                                    strict=Placement.of(ctx.config).placement != "partition")
