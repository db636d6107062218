"""The quantize stage of graph projects: rewrites, then the recipe."""

from __future__ import annotations

from typing import Any

import numpy as np

from studio.core.progress import Progress, SubProgress
from studio.core.stages.graph_quantize import GraphQuantizeSettings
from studio.engine import graphpipe
from studio.worker.context import StageContext, host_metric, read_text
from studio.worker.stages._graph import input_specs


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    imp = ctx.input("import")
    inputs = input_specs(imp)
    s = GraphQuantizeSettings.of(ctx.config)
    kind = s.kind
    scheme, gran = s.scheme, s.weight_granularity
    placement = s.placement
    calibration, validation = s.calibration, s.validation
    progress.update(0.02, "reading the calibration samples")
    if kind == "encoder" and not calibration:
        text = read_text(s.path(s.calibration_text), "calibration text")
        feeds, held, held_from = graphpipe.sample_feeds(
            inputs, None, None, s.calibration_samples, imp / "tokenizer",
            text)
    else:
        feeds, held, held_from = graphpipe.sample_feeds(
            inputs, s.path(calibration) if calibration else None,
            s.path(validation) if validation else None, s.calibration_samples)
    arrays: dict[str, Any] = {i.name: np.stack([f[i.name] for f in held]) for i in inputs}
    np.savez(str(ctx.out / "validation.npz"), **arrays)
    method = s.calibration_method
    q = graphpipe.rewrite_and_quantize(imp / "static.onnx", ctx.out, placement, feeds, held,
                                       scheme, gran, SubProgress(progress, 0.05, 0.98),
                                       method, s.overrides, s.weight_rounding)
    check = q["rewrite_check"]
    metrics = []
    if check:
        metrics += [host_metric("rewrite_cosine_min", check["worst_cosine"], "",
                                 f"rewritten vs original graph, FP32, {check['samples']} samples"),
                    host_metric("rewrite_max_abs_error", check["max_abs_error"])]
    names = ", ".join(r["rewrite"] for r in q["rewrites"]) or "none"
    return {"summary": f"{scheme} {gran}, {len(feeds)} calibration samples ({method}); "
                       f"rewrites: {names}",
            **q, "placement": placement, "validation_from": held_from,
            "validation_samples": len(held), "calibration_samples": len(feeds),
            "metrics": metrics}
