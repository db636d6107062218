"""The validate stage of graph projects: each output against FP32 (and the encoder's retrieval
set)."""

from __future__ import annotations

import json
from typing import Any

from studio.core.progress import Progress
from studio.core.stages.graph_validate import GraphValidateSettings
from studio.engine import graphpipe
from studio.engine.graphdata import compare_outputs
from studio.worker.context import StageContext, device_metric, host_metric
from studio.worker.stages._graph import device_session, held_samples, input_specs


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    imp, qdir = ctx.input("import"), ctx.input("graph-quantize")
    dev = ctx.device
    inputs = input_specs(imp)
    held = held_samples(qdir, inputs)
    quant = json.loads((qdir / "result.json").read_text())
    progress.update(0.1, f"FP32 on the CPU vs the quantized graph on the {dev.name}: "
                         f"{len(held)} samples")
    ref = graphpipe.cpu_session(imp / "static.onnx")
    htp = device_session(ctx)
    host = graphpipe.cpu_session(qdir / "quantized.onnx")
    check = compare_outputs(ref, htp, held)
    host_check = compare_outputs(ref, host, held)
    progress.check()
    res: dict[str, Any] = {
        "target": ctx.chip.key, "device": dev.name, "device_id": dev.id, "source": dev.source,
        "outputs": check["outputs"], "samples": check["samples"],
        "output_cosine_min": check["worst_cosine"], "output_max_abs_error": check["max_abs_error"],
        "host_qdq": {"output_cosine_min": host_check["worst_cosine"],
                     "output_max_abs_error": host_check["max_abs_error"]},
        "on": quant.get("validation_from", ""),
    }
    metrics = [
        device_metric(dev, "output_cosine_min", check["worst_cosine"], "",
                       f"worst output cosine vs FP32 over {check['samples']} samples"),
        device_metric(dev, "output_max_abs_error", check["max_abs_error"], ""),
        host_metric("output_cosine_min_host_qdq", host_check["worst_cosine"], "",
                     "the quantized graph on the host CPU (ONNX Runtime QDQ)"),
    ]
    summary = f"worst output cosine {check['worst_cosine']:.4f} on {dev.name} ({dev.source})"
    if GraphValidateSettings.of(ctx.config).kind == "encoder":
        progress.update(0.5, "the retrieval set: FP32 vs deployed rankings")
        seq_len = int(inputs[0].shape[1])
        rank = graphpipe.encoder_ranking(imp / "tokenizer", seq_len, ref, htp)
        host_rank = graphpipe.encoder_ranking(imp / "tokenizer", seq_len, ref, host)
        res["ranking"] = rank
        res["host_qdq"]["ranking"] = {k: host_rank[k] for k in (
            "top1_agreement", "mean_kendall_tau", "embedding_cosine_mean")}
        res.update(embedding_cosine_mean=rank["embedding_cosine_mean"],
                   ranking_top1=rank["top1_agreement"])
        n = rank["queries"]
        metrics += [
            device_metric(dev, "embedding_cosine_mean", rank["embedding_cosine_mean"], "",
                           f"the retrieval set's {rank['texts']} texts vs FP32"),
            device_metric(dev, "ranking_top1", rank["top1_agreement"], "fraction",
                           f"{n} queries whose top document matches FP32's"),
            device_metric(dev, "ranking_kendall_tau", rank["mean_kendall_tau"], "",
                           f"mean over {n} queries"),
            device_metric(dev, "recall_at_1", rank["recall_at_1_deployed"], "fraction",
                           f"FP32: {rank['recall_at_1_reference']:.0%}"),
        ]
        summary = (f"embedding cosine {rank['embedding_cosine_mean']:.4f}, top-1 "
                   f"{rank['top1_agreement']:.0%} of {n} queries, Kendall "
                   f"{rank['mean_kendall_tau']:.3f} on {dev.name} ({dev.source})")
    res["metrics"] = metrics
    res["summary"] = summary
    return res
