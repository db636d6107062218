"""The import stage of graph projects: the graph with static shapes (an encoder exported from
its PyTorch weights)."""

from __future__ import annotations

from typing import Any

import onnx

from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress
from studio.core.stages.graph_import import ImportSettings
from studio.engine import graphpipe
from studio.worker.context import StageContext, host_metric


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    s = ImportSettings.of(ctx.config)
    source = s.path(s.source)
    kind = s.kind
    info = graphpipe.static_graph(kind, source, ctx.out, s.shapes, s.seq_len, progress)
    atomic_write_json(ctx.out / "inputs.json", info["inputs"])
    model = onnx.load(str(ctx.out / "static.onnx"), load_external_data=False)
    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    shapes = ", ".join(f"{i['name']} {i['shape']}" for i in info["inputs"])
    check = info["export_check"]
    metrics = []
    if check:
        metrics.append(host_metric("export_cosine_min", check["min_cosine"], "",
                                    f"ONNX Runtime FP32 vs torch, {len(check['cosines'])} texts"))
    how = (f"exported from PyTorch at [1, {info['seq_len']}]" if kind == "encoder"
           else f"imported {source.name}")
    return {"summary": f"{how}: {len(model.graph.node)} nodes, inputs {shapes}",
            "kind": kind, "inputs": info["inputs"], "export_check": check, "op_types": ops,
            "nodes": len(model.graph.node), "metrics": metrics}
